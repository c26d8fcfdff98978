"""pipeline sweep without a cluster: points whose server cannot start fail alone, the sweep goes on, the
report says which failed and why, and --resume retries only them (the Slurm e2e test runs a full sweep)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _pipeline(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", *args]


def test_failed_points_are_reported_and_retried(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "f", "base": str(REPO / "recipes/quickstart.yaml"),
        # a hardware profile path that does not exist passes validation (the server reads it where it runs)
        # and stops the emulator at start, so no load ever starts
        "overrides": {"accuracy": None, "server": {"args": {"hardware": "/nonexistent/hardware-profile.yaml"},
                                                   "port": 30431}},
        "matrix": {"conc": {"c1": {"load": {"concurrency": 1}}, "c2": {"load": {"concurrency": 2}}}}}))
    out = tmp_path / "s"
    p = subprocess.run(_pipeline("sweep", str(sweep), "--out", str(out)), cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads((out / "sweep.json").read_text())
    assert [e["status"] for e in doc["points"].values()] == ["failed", "failed"]
    assert "server exited with code 2" in doc["points"]["c1"]["error"]
    assert (out / "recipes/c1.yaml").is_file() and (out / "runs/c2/manifest.json").is_file()
    report = (out / "sweep_report.md").read_text()
    assert report.count("| failed: ServerError: server exited with code 2") == 2
    assert "No point has finished yet" in report and not (out / "sweep_summary.csv").exists()

    p = subprocess.run(_pipeline("sweep", "--resume", str(out)), cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1 and p.stdout.count(": resuming ") == 2 and ": new run " not in p.stdout


def test_sweep_errors_name_the_fix(tmp_path):
    p = subprocess.run(_pipeline("sweep", "--resume", str(tmp_path)), cwd=REPO, capture_output=True, text=True)
    assert p.returncode != 0 and f"{tmp_path} has no sweep.json; not a sweep dir" in p.stderr
    p = subprocess.run(_pipeline("sweep"), cwd=REPO, capture_output=True, text=True)
    assert "give a sweep file (pipeline sweep sweep.yaml) or --resume SWEEP_DIR" in p.stderr
