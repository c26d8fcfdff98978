"""The accuracy stage: ask every (question, repeat) of each task, score, record, summarise.

Resumable: answered records already in the output file are kept and not asked again;
failed ones (and a line torn by a crash) are asked again. Each answer is appended and
flushed as it arrives, so a crash loses at most the requests in flight.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from pipeline.accuracy import gpqa, gsm8k
from pipeline.accuracy.data import DataError, read_rows, require_fields, sibling
from pipeline.accuracy.records import prompt_hash, read_records, summarize, write_records
from pipeline.config.accuracy import AccuracySpec, TaskSpec
from pipeline.io import write_json_atomic
from pipeline.paths import task_records, task_summary

Progress = Callable[[str], None]


class ResumeError(ValueError):
    """The output folder holds records from a different evaluation."""


class NoAnswerError(RuntimeError):
    """Every request of a task failed: the endpoint, not the model, is what such a run would measure."""


class KeyRefusedError(ValueError):
    """The endpoint answered 401 or 403: every request would be refused alike, so the task stops at the first."""


# The engine a recipe starts serves without an API key (nor does aiperf's load send one): the stage sends none.
ENGINE_KEY_HELP = ("the accuracy stage sends none to the engine the pipeline started: start it without an API key, "
                   "or score a keyed endpoint with `pipeline eval --api-key`")


@dataclass(frozen=True)
class TaskResult:
    task: str
    records_path: str
    summary_path: str
    n_questions: int
    repeats: int
    n_records: int
    n_failed: int
    n_retried: int
    n_invalid: int
    n_truncated: int                  # answered, but stopped by max_tokens (finish_reason "length")
    accuracy: float | None            # gsm8k: flexible extraction; failed count as wrong
    accuracy_strict: float | None     # gsm8k only
    invalid_rate: float | None
    n_reused: int                     # records taken from an earlier (resumed) run
    wall_s: float


@dataclass(frozen=True)
class AccuracyResult:
    tasks: tuple[TaskResult, ...]

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Job:
    id: str
    repeat: int
    messages: list[dict]
    gold: str
    hash: str


def run_accuracy(spec: AccuracySpec, *, url: str, model: str, out_dir: Path,
                 progress: Progress | None = None, data_name: str | None = None,
                 api_key: str | None = None, key_help: str = ENGINE_KEY_HELP) -> AccuracyResult:
    """Run every task of `spec` against the OpenAI-compatible server at `url`.

    out_dir is the arm's accuracy folder (ArmPaths.accuracy_dir): records go to
    out_dir/<task>.jsonl (= ArmPaths.accuracy_records(task)), summaries to
    out_dir/<task>.summary.json. Synchronous (runs its own event loop); call it from a
    worker thread if the caller already runs one. `api_key`, where given, goes out as
    `Authorization: Bearer` and nowhere else (not in records, summaries or errors); `key_help`
    says where a key comes from, for the one-line KeyRefusedError of a 401 or 403.
    """
    results = []
    for i, task in enumerate(spec.tasks):
        # Errors name the data field as the user wrote it: the recipe path, or the CLI's flag (data_name).
        where = data_name or f"accuracy.tasks.{i}.data"  # as the recipe check names it
        jobs, n_questions = _plan(task, where)
        results.append(_run_task(task, jobs, n_questions, url=url, model=model, out_dir=Path(out_dir),
                                 progress=progress or (lambda _: None), where=where, api_key=api_key,
                                 key_help=key_help))
    return AccuracyResult(tuple(results))


def check_task_files(spec: AccuracySpec | None) -> None:
    """Raise DataError unless each task's local data and shots files hold rows with the fields the task reads, and
    the stage can plan its questions from them (shots against rows, unique ids): the stage's own checks, made before
    a run starts (`pipeline validate`, `plan` and `run`), since the stage itself runs only after the first arm's
    whole load. Hub sources are checked when they are fetched. Fields are named as the recipe model names them."""
    for i, task in enumerate(spec.tasks if spec else ()):
        fields = gsm8k.FIELDS if task.name == "gsm8k" else gpqa.FIELDS
        for key, path in (("data", task.data), ("shots_data", task.shots_data)):
            if path is not None:
                where = f"accuracy.tasks.{i}.{key}"
                rows = read_rows(path, where)
                if not rows:  # else gsm8k would say its shots are missing, gpqa would run no question
                    raise DataError(f"{where}: {path} holds no rows; give a file with at least one {task.name} "
                                    f"question, or leave the field out to load from the HF hub")
                require_fields(rows[:1], fields, where, path)
        if task.data is not None:  # a hub source is planned once fetched, by the stage
            _plan(task, f"accuracy.tasks.{i}.data")


def _plan(task: TaskSpec, where: str) -> tuple[list[_Job], int]:
    jobs = []
    if task.name == "gsm8k":
        questions, shots = gsm8k.load(task, where)
        for q in questions:
            for r in range(task.repeats):
                msgs = gsm8k.messages(q, shots)
                jobs.append(_Job(q.id, r, msgs, q.gold, prompt_hash(msgs)))
    else:
        questions = gpqa.load(task, where)
        for q in questions:
            for r in range(task.repeats):
                msgs, gold = gpqa.messages(q, r, task.seed)
                jobs.append(_Job(q.id, r, msgs, gold, prompt_hash(msgs)))
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise DataError(f"{where}: question id '{dup}' appears more than once; "
                         "ids must be unique to pair arms and resume")
    return jobs, len(questions)


def _generation(task: TaskSpec) -> dict:
    """The settings besides prompt and model that shape an answer: what `_body` sends beyond the messages.
    `seed` only where it reaches the request (temperature > 0; gpqa's option shuffle is in the prompt hash
    already). Not `logprobs`: asking for them changes what a record keeps, not the answer. JSON-normalised,
    as a record holds it, so a resume compares like with like."""
    gen = {"max_tokens": task.max_tokens, "temperature": task.temperature}
    if task.temperature > 0:
        gen["seed"] = task.seed
    gen["extra_body"] = task.extra_body
    return json.loads(json.dumps(gen))


def _resume(path: Path, jobs: list[_Job], model: str, gen: dict, where: str) -> tuple[dict, list[dict]]:
    """(answered records of this plan by key, records outside the plan kept as they are).
    `where` names the task's data field as the user wrote it, so a changed setting is named the same way."""
    planned = {(j.id, j.repeat): j for j in jobs}
    kept, extra = {}, []
    for rec in read_records(path):
        key = (str(rec["id"]), rec["repeat"])
        job = planned.get(key)
        if job is None:
            extra.append(rec)
            continue
        if rec.get("prompt_hash") != job.hash:
            raise ResumeError(
                f"{path}: record id={key[0]} repeat={key[1]} was asked with a different prompt "
                f"(hash {rec.get('prompt_hash')}, now {job.hash}): the data, shots or seed "
                "changed; use a new output folder or delete the file")
        if rec.get("model", model) != model:
            raise ResumeError(f"{path}: records were made with model '{rec['model']}', this run "
                              f"asks '{model}'; use a new output folder or delete the file")
        if rec["failed"]:
            continue   # asked again under this run's settings, whatever they were
        # An answer made under other settings would be counted as if measured with these. A record from
        # before settings were recorded has none to compare, like a record without a model.
        old = rec.get("generation", gen)
        for field in dict.fromkeys([*gen, *old]):
            if old.get(field) != gen.get(field):
                raise ResumeError(
                    f"{path}: record id={key[0]} repeat={key[1]} was answered with {sibling(where, field)} "
                    f"{_shown(old.get(field))}, this run asks {_shown(gen.get(field))}; its answer would count "
                    "as measured with the new setting: use a new output folder or delete the file")
        kept[key] = rec
    return kept, extra


def _shown(value) -> str:
    return "(unset)" if value is None else json.dumps(value, ensure_ascii=False)


def _run_task(task: TaskSpec, jobs: list[_Job], n_questions: int, *, url: str, model: str,
              out_dir: Path, progress: Progress, where: str, api_key: str | None, key_help: str) -> TaskResult:
    from pipeline.accuracy.client import Refused, chat_url

    start = time.perf_counter()
    path, spath = task_records(out_dir, task.name), task_summary(out_dir, task.name)
    gen = _generation(task)
    kept, extra = _resume(path, jobs, model, gen, where)
    todo = [j for j in jobs if (j.id, j.repeat) not in kept]
    # Rewrite first: drops failed and torn lines, so the append below starts clean.
    write_records(path, [*kept.values(), *extra])
    progress(f"{task.name}: {n_questions} questions x {task.repeats} repeat{'s' * (task.repeats != 1)}; "
             f"{len(kept)} already answered, asking {len(todo)}")
    try:
        new = asyncio.run(_ask_all(task, todo, url, model, gen, path, progress, api_key)) if todo else []
    except Refused as e:
        raise KeyRefusedError(_refused_line(task.name, chat_url(url), e.status, e.text, api_key, key_help)) from None
    records = {**kept, **{(r["id"], r["repeat"]): r for r in new}}
    ordered = [records[(j.id, j.repeat)] for j in jobs]
    write_records(path, [*ordered, *extra])
    summary = summarize(task.name, ordered, model=model, n_questions=n_questions,
                        repeats=task.repeats, generation=gen)
    write_json_atomic(spath, summary)
    if ordered and summary["n_failed"] == len(ordered):
        from pipeline.accuracy.client import timed_out

        first = ordered[0]["error"] or ""
        # An engine may refuse OpenAI's `logprobs` (some do under speculative decoding): name the switch.
        hint = (f" The endpoint may refuse `logprobs`: set `logprobs: false` on task {task.name!r} "
                "(`pipeline eval --no-logprobs`)." if task.logprobs and "logprob" in first.lower() else "")
        if all(timed_out(r["error"]) for r in ordered):
            # It took every request, so it is up: asking whether it is would send the user the wrong way.
            ask = (f"{chat_url(url)} took every request but finished none within {task.timeout_s:g} s: if it is "
                   f"just slow (long answers, a cold start), raise `timeout_s` on task {task.name!r} "
                   "(`pipeline eval --timeout`).")
        else:
            ask = f"is {chat_url(url)} up and serving {model!r}?"
        raise NoAnswerError(f"{task.name}: none of its {len(ordered)} requests got an answer (first error: "
                            f"{first}); {ask}{hint} The records "
                            f"stay in {path}; a rerun asks them again (`pipeline eval` with the same --out, "
                            f"`pipeline run --resume`)")
    return TaskResult(
        task=task.name, records_path=str(path), summary_path=str(spath),
        n_questions=n_questions, repeats=task.repeats, n_records=len(ordered),
        n_failed=summary["n_failed"], n_retried=summary["n_retried"],
        n_invalid=summary["n_invalid"], n_truncated=summary["n_truncated"], accuracy=summary["accuracy"],
        accuracy_strict=summary.get("accuracy_strict"), invalid_rate=summary["invalid_rate"],
        n_reused=len(kept), wall_s=time.perf_counter() - start)


def _masked(text: str, api_key: str | None) -> str:
    # An error body may quote the key back (OpenAI's masks it; a proxy might not): it never reaches a file or log.
    return text.replace(api_key, "***") if api_key else text


def _refused_line(task: str, endpoint: str, status: int, text: str, api_key: str | None, key_help: str) -> str:
    body = " ".join(text.split())[:200]
    if api_key:
        return f"{task}: {endpoint} refused the API key (HTTP {status}: {_masked(body, api_key)}); {key_help}"
    return f"{task}: {endpoint} answered HTTP {status} ({body}) and no API key was given; {key_help}"


async def _ask_all(task: TaskSpec, todo: list[_Job], url: str, model: str, gen: dict, path: Path,
                   progress: Progress, api_key: str | None) -> list[dict]:
    import aiohttp

    from pipeline.accuracy.client import auth_headers, chat, chat_url

    queue: asyncio.Queue[_Job] = asyncio.Queue()
    for job in todo:
        queue.put_nowait(job)
    done: list[dict] = []
    # A line per 5% (at least 10 answers) or per 10 s, whichever comes first, and the last.
    every = max(10, len(todo) // 20)
    t0 = last = time.perf_counter()
    endpoint = chat_url(url)

    async def worker(session: aiohttp.ClientSession, fh) -> None:
        nonlocal last
        while not queue.empty():
            job = queue.get_nowait()
            reply = await chat(session, endpoint, _body(task, job, model),
                               timeout_s=task.timeout_s, retries=task.retries,
                               backoff_s=task.retry_backoff_s)
            rec = _record(task.name, job, reply, model, gen)
            if rec["error"]:
                rec["error"] = _masked(rec["error"], api_key)
            # One event loop thread: whole lines, never interleaved.
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            fh.flush()
            done.append(rec)
            now = time.perf_counter()
            if len(done) % every == 0 or now - last >= 10 or len(done) == len(todo):
                last = now
                n_failed = sum(r["failed"] for r in done)
                n_retried = sum(r["retried"] for r in done)
                rate = len(done) / max(now - t0, 1e-9)
                # A failed request got no answer: counted apart, never as answered.
                progress(f"{task.name}: {len(done)}/{len(todo)} done: {len(done) - n_failed} answered, "
                         f"{n_failed} failed, {n_retried} retried, {rate:.1f}/s")

    connector = aiohttp.TCPConnector(limit=task.concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=auth_headers(api_key)) as session:
        with open(path, "a") as fh:
            workers = [asyncio.ensure_future(worker(session, fh)) for _ in range(min(task.concurrency, len(todo)))]
            try:
                await asyncio.gather(*workers)
            finally:  # a refused key stops them all (their requests would be refused alike) before fh closes
                for w in workers:
                    w.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
    return done


def _body(task: TaskSpec, job: _Job, model: str) -> dict:
    body = {"model": model, "messages": job.messages, "max_tokens": task.max_tokens,
            "temperature": task.temperature, **task.extra_body}
    if task.logprobs:
        body.setdefault("logprobs", True)
    if task.temperature > 0:
        # Same sampling seed per (question, repeat) in both arms.
        digest = hashlib.sha256(f"{task.seed}:{job.id}:{job.repeat}".encode()).digest()
        body.setdefault("seed", int.from_bytes(digest[:4], "big") >> 1)
    return body


def _record(task: str, job: _Job, reply, model: str, gen: dict) -> dict:
    rec = {"id": job.id, "repeat": job.repeat, "prompt_hash": job.hash, "output": reply.output,
           "extracted": None, "gold": job.gold, "correct": False,
           "latency_s": round(reply.latency_s, 4), "finish_reason": reply.finish_reason,
           "retried": reply.attempts > 1, "failed": reply.failed, "attempts": reply.attempts,
           "error": reply.error, "model": model, "generation": gen, "tokens": reply.tokens,
           "token_logprobs": None if reply.token_logprobs is None else [round(x, 6) for x in reply.token_logprobs]}
    if task == "gsm8k":
        rec.update(extracted_strict=None, correct_strict=False)
        if not reply.failed:
            s = gsm8k.score(reply.output, job.gold)
            rec.update(extracted=s.extracted, correct=s.correct,
                       extracted_strict=s.extracted_strict, correct_strict=s.correct_strict)
    elif not reply.failed:
        s = gpqa.score(reply.output, job.gold)
        rec.update(extracted=s.extracted, correct=s.correct)
    return rec
