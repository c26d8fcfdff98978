"""End to end against a real Slurm (munged, slurmctld, slurmd on 127.0.0.1; fixture in conftest.py): emulator
A/B runs whose arm runs are sbatch jobs; a job cancelled mid-load and resumed; a job whose server dies; a 2x2
sweep interrupted (Ctrl-C) after its first point and resumed, counting the runs the resume redid."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from ports import free_port

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _pipeline(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", *args]


def _recipe(tmp_path: Path, **server_args) -> Path:
    """recipes/slurm-emulator.yaml with absolute paths, a free port and short windows."""
    r = yaml.safe_load((REPO / "recipes/slurm-emulator.yaml").read_text())
    r["tokenizer"] = str(REPO / "recipes/data/tokenizer")
    r["load"]["trace"] = str(REPO / "recipes/data/traces/short")
    r["accuracy"]["tasks"][0]["data"] = str(REPO / "recipes/data/accuracy/gsm8k_synthetic.jsonl")
    r["server"]["port"] = free_port()
    r["server"]["args"].update(server_args)
    path = tmp_path / "slurm.yaml"
    path.write_text(yaml.safe_dump(r))
    return path


def _manifest(run: Path) -> dict:
    p = run / "manifest.json"
    return json.loads(p.read_text()) if p.exists() else {"stages": {}}


def _jobs(cluster, settle_s: float = 30.0) -> list[str]:
    """Jobs still in the queue once those ending (COMPLETING) had `settle_s` to leave it."""
    deadline = time.monotonic() + settle_s
    while True:
        r = subprocess.run(["squeue", "-h", "-o", "%i %T"], env=cluster.env, capture_output=True, text=True)
        jobs = r.stdout.split("\n") if r.stdout.strip() else []
        if not jobs or time.monotonic() > deadline:
            return jobs
        time.sleep(1)


def test_slurm_ab_job_cancelled_mid_load_is_resumed(slurm_cluster, tmp_path, wait_for):
    """Here aiperf runs as a step of each arm's job (slurm.load: allocation); the sweep test below runs it
    on the controller."""
    out = tmp_path / "run"
    recipe = _recipe(tmp_path)
    r = yaml.safe_load(recipe.read_text())
    r["hosts"]["cluster"]["slurm"]["load"] = "allocation"
    recipe.write_text(yaml.safe_dump(r))
    proc = subprocess.Popen(_pipeline("run", str(recipe), "--out", str(out)), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def on_loading() -> bool:
        return _manifest(out)["stages"].get("on", {}).get("load", {}).get("status") == "running"

    wait_for(on_loading, 400, proc)
    m = _manifest(out)
    off_job, on_job = (m["stages"][a]["server"]["slurm_job"] for a in ("off", "on"))
    subprocess.run(["scancel", on_job["job_id"]], env=slurm_cluster.env, check=True)
    assert proc.wait(300) != 0
    on_load = _manifest(out)["stages"]["on"]["load"]
    assert on_load["status"] == "failed"
    assert f"slurm job {on_job['job_id']} CANCELLED" in on_load["error"], on_load["error"]
    off_export = (out / "arms/off/aiperf/profile_export.jsonl").stat().st_mtime

    p = subprocess.run(_pipeline("run", "--resume", str(out)), cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    m = _manifest(out)
    # only the missing arm run was resubmitted: off kept its job and its records
    assert "off     -         all stages done (resume): skipped" in p.stdout
    assert m["stages"]["off"]["server"]["slurm_job"]["job_id"] == off_job["job_id"]
    assert (out / "arms/off/aiperf/profile_export.jsonl").stat().st_mtime == off_export
    new_on = m["stages"]["on"]["server"]["slurm_job"]
    assert new_on["job_id"] != on_job["job_id"]
    assert all(s["status"] == "done" for arm in m["stages"].values() for s in arm.values())
    for job in (off_job, new_on):  # where each arm ran: the node and the GPU Slurm gave the job
        assert job["SLURMD_NODENAME"] == slurm_cluster.node
        assert job["CUDA_VISIBLE_DEVICES"] in ("0", "1") and job["SLURM_JOB_GPUS"] in ("0", "1")
    assert m["stages"]["on"]["server"]["url"].startswith(f"http://{slurm_cluster.node}:")
    assert (out / "arms/on/accuracy/gsm8k.jsonl").stat().st_size > 0 and (out / "report.md").is_file()
    assert (out / "arms/on/slurm_job.sh").is_file() and (out / "arms/on/server.log").stat().st_size > 0
    assert json.loads((out / "arms/on/load_result.json").read_text())["command"][:2] == \
        ["srun", f"--jobid={new_on['job_id']}"]
    assert not _jobs(slurm_cluster), "every job ended (the servers were stopped with scancel)"


def test_slurm_job_whose_server_dies_fails_the_stage_with_its_state(slurm_cluster, tmp_path):
    out = tmp_path / "run"
    p = subprocess.run(_pipeline("run", str(_recipe(tmp_path, hardware="/nonexistent/profile.yaml")), "--out", str(out)),
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1
    server = _manifest(out)["stages"]["off"]["server"]
    assert server["status"] == "failed"
    # the error carries the job's state and the tail of the server's log (the emulator's config error, exit 2)
    assert "ServerError: server exited with code 2 before becoming healthy" in server["error"]
    assert "slurm job" in server["error"] and "FAILED" in server["error"], server["error"]
    assert "no file /nonexistent/profile.yaml" in server["error"]
    assert "on" not in _manifest(out)["stages"]


def test_slurm_sweep_2x2_interrupted_then_resumed(slurm_cluster, tmp_path, wait_for):
    recipe = _recipe(tmp_path)
    r = yaml.safe_load(recipe.read_text())
    r["accuracy"] = None
    r["load"].update(benchmark_duration_s=15, grace_period_s=15)
    recipe.write_text(yaml.safe_dump(r))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "s2x2", "base": str(recipe), "gpus_per_server": 2,
        "matrix": {"conc": {"c4": {"load": {"concurrency": 4}}, "c8": {"load": {"concurrency": 8}}},
                   "tp": {"tp2": {"server": {"args": {"model_preset": "qwen3.5-397b-a17b-tp2"}}},
                          "tp4": {"server": {"args": {"model_preset": "qwen3.5-397b-a17b-tp4"}}}}}}))
    out = tmp_path / "sweep"
    # SIGINT at its default in the child, as in a terminal: a test run started in the background (`cmd &`
    # in a script) hands its children SIGINT ignored, and the Ctrl-C below would then do nothing
    proc = subprocess.Popen(_pipeline("sweep", str(sweep), "--out", str(out)), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first, second = out / "runs/c4-tp2", out / "runs/c4-tp4"
    wait_for(lambda: _manifest(second)["stages"].get("off", {}).get("load", {}).get("status") == "running",
              600, proc)
    first_manifest = (first / "manifest.json").read_text()
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    try:
        rc = proc.wait(120)
    except subprocess.TimeoutExpired:  # say where it hangs: the sweep's own lines and what is still queued
        proc.kill()
        raise AssertionError(f"Ctrl-C: the sweep did not exit within 120 s; its output:\n{proc.stdout.read()[-4000:]}"
                             f"\nsqueue: {_jobs(slurm_cluster)}") from None
    assert rc == 130
    assert not _jobs(slurm_cluster), "Ctrl-C cancelled the running job"
    assert json.loads(first_manifest)["finished"] and not (out / "runs/c8-tp2").exists()

    p = subprocess.run(_pipeline("sweep", "--resume", str(out)), cwd=REPO, capture_output=True, text=True,
                       timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # of four runs, the resume redid three: one resumed where it stopped, two started; the finished one untouched
    assert p.stdout.count("finished before (resume): skipped") == 1
    assert p.stdout.count(": resuming ") == 1 and p.stdout.count(": new run ") == 2
    assert (first / "manifest.json").read_text() == first_manifest
    csv = (out / "sweep_summary.csv").read_text().splitlines()
    assert len(csv) == 1 + 8 and csv[0].startswith("point,")
    report = (out / "sweep_report.md").read_text()
    assert "Per-point table" in report and report.count("| done |") == 4
    assert (out / "plots/pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_job_left_by_a_hard_killed_pipeline_is_cancelled_before_resubmitting(slurm_cluster, tmp_path):
    from pipeline.config.placement import SlurmSpec
    from pipeline.slurm import ENDED, SlurmHost, job_state

    log = str(tmp_path / "arms/on/server.log")
    job = SlurmHost("c", SlurmSpec(), 1, progress=lambda m: None).start(["sleep", "300"], env={}, log=log)
    assert job.poll() is None and job.facts["CUDA_VISIBLE_DEVICES"] in ("0", "1")
    # a new pipeline process (the old one was SIGKILLed and never ran scancel) finds it by its id file
    assert SlurmHost("c", SlurmSpec(), 1).cancel_leftover(str(tmp_path / "arms/on")) == job.job_id
    assert job_state(job.job_id)[0] in ENDED  # SIGTERM first: the server's exit may read FAILED, not CANCELLED
    assert SlurmHost("c", SlurmSpec(), 1).cancel_leftover(str(tmp_path / "arms/on")) is None
