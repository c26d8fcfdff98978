"""Smoke test against the project's emulator (a real subprocess server). Its output is
filler words (lower-case letters only: no digits, no 'Answer: X'), so the known truth is
exact: every answer is invalid, accuracy is 0, nothing fails."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline.config.accuracy import AccuracySpec
from pipeline.accuracy.stage import run_accuracy

DATA = Path(__file__).resolve().parents[3] / "recipes" / "data" / "accuracy"


@pytest.fixture(scope="module")
def emulator():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.emulator", "--host", "127.0.0.1",
                             "--port", str(port), "--model", "emu", "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"emulator did not come up: {proc.stderr.read()[-2000:]}")
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(10)


def test_emulator_filler_is_all_invalid(emulator, tmp_path):
    common = {"max_tokens": 32, "concurrency": 4, "retries": 1, "timeout_s": 60}
    spec = AccuracySpec(tasks=[
        {"name": "gsm8k", "data": DATA / "gsm8k_synthetic.jsonl", "limit": 6, **common},
        {"name": "gpqa_diamond", "data": DATA / "gpqa_synthetic.jsonl", "limit": 3, "repeats": 2,
         **common}])
    gsm, gpqa = run_accuracy(spec, url=emulator, model="emu", out_dir=tmp_path).tasks
    assert (gsm.n_records, gpqa.n_records) == (6, 6)
    for t in (gsm, gpqa):
        assert (t.n_failed, t.accuracy, t.n_invalid, t.invalid_rate) == (0, 0.0, 6, 1.0)
        recs = [json.loads(x) for x in Path(t.records_path).read_text().splitlines()]
        assert all(r["output"] and r["finish_reason"] in ("length", "stop") for r in recs)
    assert gsm.accuracy_strict == 0.0


def test_pipeline_eval_cli_against_emulator(emulator, tmp_path):
    proc = subprocess.run(["pipeline", "eval", "--url", emulator + "/v1", "--model", "emu",
                           "--task", "gsm8k", "--data", str(DATA / "gsm8k_synthetic.jsonl"),
                           "--limit", "4", "--max-tokens", "24", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("gsm8k: accuracy 0.0000 (strict 0.0000) over 4 answers "
                                  "(4 questions x 1); invalid 100.00%; failed 0; retried 0")
    assert "gsm8k: 4/4 done: 4 answered, 0 failed, 0 retried" in proc.stderr
    # 24 tokens of filler never finish: the budget, not the model, is what this run measured.
    assert "; truncated 4; records " in proc.stdout
    assert "pipeline eval: warning: gsm8k: all 4 answers stopped at the 24-token limit" in proc.stderr
    summary = json.loads((tmp_path / "gsm8k.summary.json").read_text())
    assert summary["n_invalid"] == 4 and summary["model"] == "emu"
