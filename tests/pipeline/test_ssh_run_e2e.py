"""End to end over SSH, no doubles: `pipeline run` starts both arms' emulators on an SSH host (a real sshd on
127.0.0.1), replays load against them, and pulls the remote artifacts into the local run dir."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.ssh]


def test_ab_on_an_ssh_host_pulls_remote_artifacts(sshd, tmp_path):
    trace = tmp_path / "trace"
    subprocess.run([sys.executable, "-m", "pipeline.tracegen", "traces", "--out", str(trace), "--preset",
                    "quickstart", "--sessions", "5", "--first-context-median", "6000", "--max-context", "30000",
                    "--output-mean", "100"], cwd=REPO, check=True, capture_output=True, timeout=60)
    remote_workdir = tmp_path / "remote"
    recipe = {
        "name": "ssh-e2e", "engine": "emulator", "model": "m", "tokenizer": str(REPO / "recipes/data/tokenizer"),
        "hosts": {"box": {"kind": "ssh", "address": "127.0.0.1", "port": sshd["port"], "user": sshd["user"],
                          "key": sshd["key"], "workdir": str(remote_workdir), "python": sys.executable}},
        "placement": {"hosts": ["box"]},
        "arms": {"off": {"env": {"VATTN": "0"}}, "on": {"env": {"VATTN": "1"}}},
        "server": {"port": 30700, "startup_timeout_s": 120, "env": {"PYTHONPATH": str(REPO)}},
        "load": {"trace": str(trace), "concurrency": 5, "benchmark_duration_s": 15, "grace_period_s": 20,
                 "timeout_s": 150},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", str(path), "--out", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]

    manifest = json.loads((out / "manifest.json").read_text())
    for arm in ("off", "on"):
        run = manifest["plan"]["arm_runs"][0 if arm == "off" else 1]
        assert run["host"] == "box" and run["artifact_dir"].startswith(str(remote_workdir))
        # Written on the SSH host, pulled into the local run dir by fabric.
        assert (out / f"arms/{arm}/server.log").stat().st_size > 0
        assert (out / f"arms/{arm}/emulator_cycles/lifetime-1.jsonl").stat().st_size > 0
        assert manifest["stages"][arm]["load"]["cycle_log_lifetime"] == 1
        assert json.loads((out / f"arms/{arm}/server_info.json").read_text())["arm"]["env"]["VATTN"] == \
            ("0" if arm == "off" else "1")
        assert (out / f"arms/{arm}/aiperf/profile_export.jsonl").stat().st_size > 0
    assert (out / "report.md").is_file()
