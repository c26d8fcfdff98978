"""Accuracy inputs as users have them: GPQA's published CSV, `pipeline eval --num-shots`, and CLI errors
that name the CLI's flags (a CLI user has no recipe path to fix)."""
from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.accuracy import gpqa, gsm8k
from pipeline.accuracy.cli import add_eval_arguments, spec_from_args
from pipeline.accuracy.data import DataError, sibling

REPO = Path(__file__).resolve().parents[3]
GSM = REPO / "recipes/data/accuracy/gsm8k_synthetic.jsonl"
# gpqa_diamond.csv's header as published (Idavidrein/gpqa), in part: extra columns are ignored.
HEADER = ["Pre-Revision Question", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
          "Incorrect Answer 3", "Explanation", "Record ID", "High-level domain"]


def _published_csv(path: Path) -> Path:
    rows = [["old", "A quoted \"term\", a comma,\nand a second line?", "1e5", "NA", "", "0.10", "why", "recABC", "Physics"],
            ["old", "Plain question?", "4", "5", "6", "7", "", "recDEF", "Chemistry"]]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        w.writerows(rows)
    return path


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_eval_arguments(p)
    return p.parse_args(["--url", "http://x", "--model", "m", *argv])


def test_gpqa_published_csv_is_read_verbatim(tmp_path):
    spec = spec_from_args(_args("--task", "gpqa_diamond", "--data", str(_published_csv(tmp_path / "gpqa_diamond.csv"))))
    qs = gpqa.load(spec.tasks[0], "--data")
    assert [q.id for q in qs] == ["recABC", "recDEF"]
    assert qs[0].question == "A quoted \"term\", a comma,\nand a second line?"
    # Answers stay text: "1e5" is not 100000.0, "NA" is not NaN, an empty cell is "".
    assert (qs[0].correct, qs[0].incorrect) == ("1e5", ("NA", "", "0.10"))


def test_broken_csv_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text('Question,Correct Answer\n"unterminated,1\n')
    with pytest.raises(DataError, match=r"^--data: .*bad.csv is not a readable CSV \(ParserError"):
        gpqa.load(spec_from_args(_args("--task", "gpqa_diamond", "--data", str(bad))).tasks[0], "--data")


def test_num_shots_flag_reaches_the_prompt():
    spec = spec_from_args(_args("--task", "gsm8k", "--data", str(GSM), "--num-shots", "2", "--limit", "3"))
    assert spec.tasks[0].num_shots == 2
    evals, shots = gsm8k.load(spec.tasks[0], "--data")
    assert len(shots) == 2 and len(evals) == 3
    assert spec_from_args(_args("--task", "gsm8k")).tasks[0].num_shots == 5   # the task's default


def test_sibling_names_follow_the_users_spelling():
    assert sibling("--data", "num_shots") == "--num-shots"
    assert sibling("accuracy.tasks.1.data", "num_shots") == "accuracy.tasks.1.num_shots"


def _eval(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.accuracy", "--url", "http://127.0.0.1:1",
                           "--model", "m", "--out", str(tmp_path / "out"), *argv],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def test_cli_errors_name_flags_not_recipe_fields(tmp_path):
    p = _eval(tmp_path, "--task", "gpqa_diamond", "--data", str(_published_csv(tmp_path / "g.csv")), "--num-shots", "3")
    assert p.returncode == 1
    assert p.stderr == ("pipeline eval: error: --num-shots: 3 for gpqa_diamond; it is zero-shot, so only 0 is "
                        "allowed (omit the flag)\n")
    p = _eval(tmp_path, "--task", "gpqa_diamond", "--data", str(GSM), "--shots-data", str(GSM))
    assert p.stderr.startswith("pipeline eval: error: --shots-data: set for gpqa_diamond; only gsm8k uses shots")
    p = _eval(tmp_path, "--task", "gsm8k", "--data", str(GSM), "--num-shots", "16")
    assert p.returncode == 1 and "accuracy.tasks" not in p.stderr and "num_shots" not in p.stderr
    assert p.stderr.startswith("pipeline eval: error: --data: 16 shots requested but only ")
    assert p.stderr.rstrip().endswith("lower --num-shots or add train rows")


def test_requests_ask_for_logprobs_unless_the_flag_turns_them_off():
    from pipeline.accuracy.stage import _body, _Job

    job = _Job("q1", 0, [{"role": "user", "content": "2+2?"}], "4", "h")
    on, off = (spec_from_args(_args("--task", "gsm8k", *flags)).tasks[0] for flags in ((), ("--no-logprobs",)))
    assert _body(on, job, "m")["logprobs"] is True
    assert "logprobs" not in _body(off, job, "m")


def test_a_reply_keeps_the_logprobs_the_server_returned():
    from pipeline.accuracy.client import _token_logprobs

    content = [{"token": "4", "logprob": -0.01, "top_logprobs": []}, {"token": ".", "logprob": 0}]
    assert _token_logprobs({"logprobs": {"content": content}}) == (["4", "."], [-0.01, 0.0])
    for choice in ({}, {"logprobs": None}, {"logprobs": {"content": None}}, {"logprobs": {"content": [{"x": 1}]}}):
        assert _token_logprobs(choice) == (None, None)


@pytest.mark.parametrize("url", ["notaurl", "ftp://x", "http://", "localhost:30000", "http://h:port"])
def test_a_url_that_is_no_http_endpoint_is_refused_before_anything_is_asked(tmp_path, capsys, url):
    from pipeline.accuracy.cli import eval_main

    out = tmp_path / "out"
    rc = eval_main(["--url", url, "--model", "m", "--task", "gsm8k", "--data", str(GSM), "--limit", "1",
                    "--out", str(out)])
    assert rc == 1 and not out.exists()   # no record: nothing was asked, nor retried
    assert capsys.readouterr().err == (f"pipeline eval: error: --url: {url!r} is not an http:// or https:// URL; "
                                       "allowed: a server root (http://HOST:PORT), its /v1 base or the full "
                                       "/v1/chat/completions URL\n")
