"""End to end, no doubles: resuming a concurrent run whose group is half finished reruns the whole group.

The half-finished state is what a crash leaves: `off` finished its load, `on` failed in its own. The
first `pipeline run` writes the real manifest and plan (it stops at once: the port is taken), the test
marks the stages as the crash would have, and `pipeline run --resume` runs real emulators and aiperf.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from test_concurrent_e2e import free_port_pair

REPO = Path(__file__).resolve().parents[2]
OLD = "2026-01-01T00:00:00+00:00"
pytestmark = pytest.mark.slow


def make_recipe(tmp_path: Path, port: int) -> Path:
    trace = tmp_path / "trace"
    subprocess.run([sys.executable, "-m", "pipeline.tracegen", "traces", "--out", str(trace), "--preset",
                    "quickstart", "--sessions", "4", "--first-context-median", "4000", "--max-context", "20000",
                    "--output-mean", "80"], cwd=REPO, check=True, capture_output=True, timeout=60)
    recipe = {
        "name": "concurrent-resume", "engine": "emulator", "model": "m",
        "tokenizer": str(REPO / "recipes/data/tokenizer"),
        "arms": {"off": {"env": {"VATTN": "0"}}, "on": {"env": {"VATTN": "1"}}},
        "server": {"args": {"max_running_requests": 8}, "port": port, "startup_timeout_s": 120},
        "placement": {"mode": "concurrent"},
        "load": {"trace": str(trace), "concurrency": 4, "benchmark_duration_s": 10, "grace_period_s": 20,
                 "timeout_s": 150, "seed": 3},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def pipeline(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def crash_state(out: Path) -> None:
    """The manifest and files a crash leaves when off's load finished and on's failed."""
    m = json.loads((out / "manifest.json").read_text())
    done = {"status": "done", "started": OLD, "finished": OLD}
    m["stages"] = {"off": {"server": dict(done), "load": dict(done)},
                   "on": {"server": dict(done), "load": {"status": "failed", "started": OLD, "finished": OLD,
                                                         "error": "LoadError: the machine went down"}}}
    (out / "manifest.json").write_text(json.dumps(m))
    (out / "arms/off").mkdir(parents=True, exist_ok=True)
    (out / "arms/off/load_result.json").write_text('{"attempt": "first, alone"}')


def test_resume_reruns_a_half_finished_concurrent_group_as_a_group(tmp_path):
    port = free_port_pair()
    out = tmp_path / "run"
    with socket.socket() as taken:  # the first run stops at its server stage, its manifest written
        taken.bind(("0.0.0.0", port))
        taken.listen()
        first = pipeline("run", str(make_recipe(tmp_path, port)), "--out", str(out))
    assert first.returncode == 1 and "is in use" in first.stderr, first.stderr[-2000:]
    crash_state(out)

    resumed_at = datetime.now(timezone.utc).replace(microsecond=0)
    p = pipeline("run", "--resume", str(out))
    log = p.stdout[-3000:] + p.stderr[-3000:]
    m = json.loads((out / "manifest.json").read_text())
    started = {n: datetime.fromisoformat(m["stages"][n]["load"]["started"]) for n in ("off", "on")}
    # Both loads ran in the resume, at the same time: what the report's pairing says.
    assert all(t >= resumed_at for t in started.values()), (started, log)
    assert abs((started["off"] - started["on"]).total_seconds()) <= 2, started
    assert all(m["stages"][n]["load"]["status"] == "done" for n in ("off", "on")), log
    assert p.returncode == 0, log

    # The first attempt of off is kept aside, and the manifest says why.
    [aside] = m["superseded"]
    assert (aside["arm_run"], aside["attempt"], aside["stages"]["load"]["started"]) == ("off", 1, OLD)
    assert "concurrent group rerun as a whole" in aside["reason"]
    assert json.loads((out / "superseded/off.1/load_result.json").read_text()) == {"attempt": "first, alone"}
    assert json.loads((out / "arms/off/load_result.json").read_text())["records"] > 0
    report = (out / "report.md").read_text()
    assert "Set aside on resume (kept, not analysed):\n- off attempt 1 (`superseded/off.1`" in report
