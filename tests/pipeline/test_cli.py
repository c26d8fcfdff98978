"""`pipeline` as a user runs it, in a subprocess: what Ctrl-C and SIGTERM print and return, and what it
refuses before a run starts."""
from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ports import free_port

REPO = Path(__file__).resolve().parents[2]


def _start(*args: str) -> subprocess.Popen:
    # SIGINT at its default in the child, as in a terminal (a background test run hands it down ignored)
    return subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_an_interrupted_run_names_the_signal_and_its_own_run_dir_to_resume(tmp_path, wait_for):
    recipe = yaml.safe_load((REPO / "recipes/quickstart.yaml").read_text())
    recipe.pop("accuracy")
    recipe["tokenizer"] = str(REPO / "recipes/data/tokenizer")
    recipe["load"]["trace"] = str(REPO / "recipes/data/traces/short")
    recipe["server"]["port"] = free_port()
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "run"

    def server_starting() -> bool:  # inside the runner, with its SIGTERM handler in place
        m = out / "manifest.json"
        return m.is_file() and json.loads(m.read_text())["stages"].get("off", {}).get("server", {}).get(
            "status") == "running"

    for sig, args in ((signal.SIGINT, ("run", str(path), "--out", str(out))),  # a new run, then its resume
                      (signal.SIGTERM, ("run", "--resume", str(out)))):
        proc = _start(*args)
        wait_for(server_starting, 120, proc)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + sig, err[-2000:]  # the shell's convention
        assert err.endswith(f"interrupted ({sig.name}); finished stages are kept: pipeline run --resume {out}\n"), \
            err[-2000:]
    # each invocation closed its span on the way out, so the report's wall time can leave out the gap between them
    spans = json.loads((out / "manifest.json").read_text())["invocations"]
    assert len(spans) == 2 and all(s["finished"] for s in spans), spans
    assert spans[0]["started"] <= spans[0]["finished"] <= spans[1]["started"] <= spans[1]["finished"], spans


def test_an_interrupted_eval_says_so_and_advises_no_run_resume(tmp_path):
    with socket.socket() as server:  # an endpoint that takes the request and never answers
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(120)
        proc = _start("eval", "--task", "gsm8k", "--data", str(REPO / "recipes/data/accuracy/gsm8k_synthetic.jsonl"),
                      "--url", f"http://127.0.0.1:{server.getsockname()[1]}", "--model", "m",
                      "--out", str(tmp_path / "eval"))
        conn, _ = server.accept()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        conn.close()
    assert proc.returncode == 130 and err.endswith("\ninterrupted (SIGINT)\n"), err[-2000:]


@pytest.mark.parametrize("task, data, missing", [
    ("gsm8k", "gpqa_synthetic.jsonl", "['question', 'answer']"),
    ("gpqa_diamond", "gsm8k_synthetic.jsonl", "['Question', 'Correct Answer', "),
])
def test_accuracy_data_of_another_task_is_refused_before_a_run_starts(tmp_path, task, data, missing):
    """The accuracy stage's own row check (`pipeline eval --data` says the same), made by validate, plan and run:
    the stage itself would find it only after the first arm's whole load. A sweep's validate names the point."""
    data = REPO / "recipes/data/accuracy" / data
    recipe = yaml.safe_load((REPO / "recipes/quickstart.yaml").read_text())
    recipe["tokenizer"] = str(REPO / "recipes/data/tokenizer")
    recipe["load"]["trace"] = str(REPO / "recipes/data/traces/short")
    recipe["accuracy"] = {"tasks": [{"name": task, "data": str(data)}]}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"name": "s", "base": str(path),
                                     "points": {"c2": {"load": {"concurrency": 2}}}}))
    says = f"accuracy.tasks.0.data: row 0 of {data} lacks field(s) {missing}"
    # an invalid recipe like any other: its file (or sweep point) named, the field as pydantic's, exit 2
    for args, prefix in ((["validate", str(path)], f"{path}: "), (["plan", str(path)], f"{path}: "),
                         (["run", str(path), "--out", str(tmp_path / "run")], f"{path}: "),
                         (["validate", str(sweep)], "sweep point 'c2': ")):
        p = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 2 and p.stderr.startswith(f"error: {prefix}invalid recipe\n{says}"), \
            (args, p.stderr[-2000:])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("rows, says", [
    (0, r"accuracy.tasks.0.data: .*/g.jsonl holds no rows; give a file with at least one gsm8k question, or leave "
        r"the field out to load from the HF hub"),
    (3, r"accuracy.tasks.0.data: 5 shots requested but only 3 solved problems are available; lower "
        r"accuracy.tasks.0.num_shots or add train rows"),
])
def test_accuracy_data_the_task_cannot_use_fails_validate(tmp_path, rows, says):
    """Not the accuracy stage after the first arm's whole load (which said an empty file lacked shots)."""
    lines = (REPO / "recipes/data/accuracy/gsm8k_synthetic.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "g.jsonl").write_text("".join(lines[:rows]))
    recipe = yaml.safe_load((REPO / "recipes/quickstart.yaml").read_text())
    recipe["tokenizer"] = str(REPO / "recipes/data/tokenizer")
    recipe["load"]["trace"] = str(REPO / "recipes/data/traces/short")
    recipe["accuracy"] = {"tasks": [{"name": "gsm8k", "data": str(tmp_path / "g.jsonl")}]}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    p = subprocess.run([sys.executable, "-m", "pipeline.cli", "validate", str(path)], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and re.fullmatch(rf"error: {re.escape(str(path))}: invalid recipe\n{says}\n",
                                              p.stderr), p.stderr[-2000:]


@pytest.mark.parametrize("command", ["plan", "validate"])
def test_output_piped_into_a_reader_that_stopped_ends_quietly(tmp_path, command):
    """A reader that stops early (`pipeline plan ... | head -3`) ends the command as it ends a Unix filter: no
    traceback, the shell's SIGPIPE status. Here the pipe's read end is closed before the command starts, so its
    writes fail whatever the machine's load: the plan's at its print (more than the output buffer), validate's
    one line at the last flush."""
    import os

    recipe = yaml.safe_load((REPO / "recipes/quickstart.yaml").read_text())
    recipe.pop("accuracy")
    recipe["tokenizer"] = str(REPO / "recipes/data/tokenizer")
    recipe["load"]["trace"] = str(REPO / "recipes/data/traces/short")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    read, write = os.pipe()
    os.close(read)
    try:
        # stdout buffered, as in a user's shell (PYTHONUNBUFFERED would write each print at once)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        p = subprocess.run([sys.executable, "-m", "pipeline.cli", command, str(path)], cwd=REPO, stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=120, env=env)
    finally:
        os.close(write)
    assert (p.returncode, p.stderr) == (128 + signal.SIGPIPE, ""), p.stderr[-2000:]
