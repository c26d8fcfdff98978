"""`pipeline eval`: one accuracy task against any OpenAI-compatible endpoint.

    pipeline eval --url http://127.0.0.1:30000 --model M --task gsm8k --limit 200 --out ev

Builds the same `AccuracySpec` the recipe's `accuracy:` section holds, then calls the
stage. Imports nothing heavy until it runs, so `pipeline --help` stays instant.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pipeline.config.accuracy import TASK_NAMES


KEY_ENV = "OPENAI_API_KEY"  # what OpenAI's own clients read
_KEY_HELP = f"the key comes from --api-key, else the {KEY_ENV} environment variable"


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _url_error(url: str) -> str | None:
    """Why `url` cannot be an endpoint, or None. Checked before any data is read or request sent: a malformed
    URL fails every request alike, so its retries would only delay the error."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        _ = parts.port   # raises ValueError for a port that is not a number in 0..65535
    except ValueError:
        parts = None
    if parts is not None and parts.scheme.lower() in ("http", "https") and parts.hostname:
        return None
    return (f"--url: {url!r} is not an http:// or https:// URL; allowed: a server root "
            "(http://HOST:PORT), its /v1 base or the full /v1/chat/completions URL")


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True,
                        help="server root, /v1 base or full /v1/chat/completions URL")
    parser.add_argument("--model", required=True, help="model name sent in each request")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help=f"sent as 'Authorization: Bearer KEY' (vLLM's --api-key, hosted APIs); default: the "
                             f"{KEY_ENV} environment variable, none if unset. A command line shows in `ps`: prefer "
                             "the variable")
    parser.add_argument("--task", required=True, choices=TASK_NAMES)
    parser.add_argument("--data", type=Path, default=None,
                        help="local JSONL, JSON (an array of objects), CSV (GPQA's published gpqa_diamond.csv) "
                             "or parquet in the published field names (default: the HF hub)")
    parser.add_argument("--shots-data", type=Path, default=None,
                        help="gsm8k: file of solved problems for the shots")
    parser.add_argument("--num-shots", type=int, default=None,
                        help="few-shot examples per prompt (gsm8k default 5; gpqa_diamond only 0)")
    parser.add_argument("--limit", type=int, default=None, help="first N questions only")
    parser.add_argument("--repeats", type=int, default=None,
                        help="asks per question (gsm8k 1, gpqa_diamond 8)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="completion budget (gsm8k 2048, gpqa_diamond 8192)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--retries", type=int, default=3)
    parser.add_argument("--extra-body", type=_json_object, default=None, metavar="JSON",
                        help='merged into each request, e.g. '
                             '\'{"chat_template_kwargs": {"enable_thinking": false}}\'')
    parser.add_argument("--no-logprobs", dest="logprobs", action="store_false",
                        help="do not ask for the chosen tokens' logprobs (for an endpoint that refuses them)")
    parser.add_argument("--out", type=Path, default=Path("eval"),
                        help="output folder; records in OUT/<task>.jsonl; "
                             "rerunning with the same OUT resumes (default: ./eval)")


def spec_from_args(args: argparse.Namespace):
    from pipeline.config.accuracy import AccuracySpec

    task = {"name": args.task, "data": args.data, "shots_data": args.shots_data,
            "num_shots": args.num_shots, "limit": args.limit, "repeats": args.repeats, "concurrency": args.concurrency,
            "max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed,
            "timeout_s": args.timeout, "retries": args.retries, "logprobs": args.logprobs,
            "extra_body": args.extra_body or {}}
    return AccuracySpec(tasks=[{k: v for k, v in task.items() if v is not None}])


_FLAG = {"name": "--task", "timeout_s": "--timeout"}


def flag_of(field: str) -> str:
    return _FLAG.get(field, "--" + field.replace("_", "-"))


def _flags_in(msg: str) -> str:
    """A TaskSpec message names recipe fields ("num_shots: 3 for gpqa_diamond ..."); a CLI user has
    flags, so name those instead."""
    import re

    from pipeline.config.accuracy import TaskSpec

    # Only names with an underscore: plain words ("data", "name") also occur in ordinary prose.
    fields = sorted((f for f in TaskSpec.model_fields if "_" in f), key=len, reverse=True)
    msg = re.sub(r"\btasks\[\d+\]\.", "", msg).replace("the field", "the flag")
    return re.sub(r"(?<![-\w])(" + "|".join(fields) + r")\b", lambda m: flag_of(m.group(1)), msg)


def run_eval(args: argparse.Namespace) -> int:
    """Run the task; print one summary line per task to stdout, progress to stderr.
    Returns 0, or 1 with a one-line error for bad data, bad flags or URL, a foreign out folder, an endpoint that
    refused the API key (or wanted one) or one that answered none of a task's requests."""
    from pydantic import ValidationError

    from pipeline.accuracy.data import DataError
    from pipeline.accuracy.stage import KeyRefusedError, NoAnswerError, ResumeError, run_accuracy

    if (bad := _url_error(args.url)) is not None:
        print(f"pipeline eval: error: {bad}", file=sys.stderr)
        return 1
    try:
        spec = spec_from_args(args)
        result = run_accuracy(spec, url=args.url, model=args.model, out_dir=args.out,
                              progress=lambda line: print(line, file=sys.stderr, flush=True), data_name="--data",
                              api_key=args.api_key or os.environ.get(KEY_ENV) or None, key_help=_KEY_HELP)
    except ValidationError as e:
        first = e.errors()[0]
        field = first["loc"][-1] if first["loc"] else None
        msg = first["msg"].removeprefix("Value error, ")
        if isinstance(field, str):   # a field's own check; else a cross-field rule naming it
            got = first.get("input")
            got = str(got) if isinstance(got, Path) else got
            msg = f"{flag_of(field)}: {msg} (got {got!r})"
        print(f"pipeline eval: error: {_flags_in(msg)}", file=sys.stderr)
        return 1
    except (DataError, ResumeError, NoAnswerError, KeyRefusedError) as e:   # already one line that names the fix
        print(f"pipeline eval: error: {e}", file=sys.stderr)
        return 1
    for task, t in zip(spec.tasks, result.tasks):
        strict = f" (strict {t.accuracy_strict:.4f})" if t.accuracy_strict is not None else ""
        acc = f"{t.accuracy:.4f}" if t.accuracy is not None else "n/a"
        inv = f"{t.invalid_rate:.2%}" if t.invalid_rate is not None else "n/a"
        print(f"{t.task}: accuracy {acc}{strict} over {t.n_records} answers "
              f"({t.n_questions} questions x {t.repeats}); invalid {inv}; failed {t.n_failed}; "
              f"retried {t.n_retried}; truncated {t.n_truncated}; records {t.records_path}")
        if hint := _truncation_hint(t, task.max_tokens):
            print(f"pipeline eval: warning: {hint}", file=sys.stderr)
    return 0


def _truncation_hint(t, max_tokens: int) -> str | None:
    """A cut-off answer has lost its final answer, so it scores as invalid or wrong: the token budget, not the
    model, decided it. Name how many, and the flag that gives them room."""
    answered = t.n_records - t.n_failed
    if not t.n_truncated:
        return None
    if t.n_truncated == answered:
        return (f"{t.task}: all {answered} answers stopped at the {max_tokens}-token limit (finish_reason "
                "'length'), none finished: this accuracy measures the budget, not the model; raise --max-tokens")
    return (f"{t.task}: {t.n_truncated} of {answered} answers stopped at the {max_tokens}-token limit "
            "(finish_reason 'length') and may have lost their final answer; raise --max-tokens to let them finish")


def eval_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pipeline eval",
                                     description="Accuracy of an OpenAI-compatible endpoint "
                                                 "on GSM8K or GPQA-diamond.")
    add_eval_arguments(parser)
    return run_eval(parser.parse_args(argv))
