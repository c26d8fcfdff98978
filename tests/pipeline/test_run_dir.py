"""A run owns its directories: the local run dir is claimed atomically, and its folders on an SSH host
are keyed by a run id that the manifest keeps for --resume."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from pipeline.manifest import Manifest, new_run_id, now
from pipeline.plan import build_plan
from pipeline.config.recipe import load_recipe
from ports import free_port

REPO = Path(__file__).resolve().parents[2]
TRACE = str(REPO / "recipes/data/traces/quickstart")

# Each process imports everything first, then waits for the same instant, so that both reach the
# run-dir check within a millisecond or so of each other.
RACER = """
import sys, time
import pipeline.cli, pipeline.manifest, pipeline.plan, pipeline.config.recipe, pipeline.runner
start = float(sys.argv[1])
while time.time() < start:
    time.sleep(0.0002)
sys.exit(pipeline.cli.main(sys.argv[2:]))
"""


def write_recipe(tmp_path: Path, **over) -> Path:
    recipe = {"name": "t", "engine": "emulator", "model": "m", "tokenizer": str(REPO / "recipes/data/tokenizer"),
              "arms": {"off": {"env": {"VATTN": "0"}}, "on": {"env": {"VATTN": "1"}}},
              "load": {"trace": TRACE, "benchmark_duration_s": 10, "timeout_s": 120}, **over}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def race_two_runs(recipe: Path, out: Path) -> list[subprocess.CompletedProcess]:
    start = time.time() + 4.0  # both interpreters are up and have imported by then, even on a busy box
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(start), "run", str(recipe), "--out", str(out)],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    done = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return done


def test_two_runs_started_at_once_on_one_dir_one_wins(tmp_path):
    with socket.socket() as taken:  # the winner stops at its server stage: nothing else needs to run
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        recipe = write_recipe(tmp_path, server={"port": port})
        for round_ in range(3):
            out = tmp_path / f"run{round_}"
            runs = race_two_runs(recipe, out)
            went_on = [r for r in runs if "is in use" in r.stderr]
            refused = [r for r in runs if r not in went_on]
            assert len(went_on) == 1, f"round {round_}: {len(went_on)} runs wrote into {out}: " + \
                " | ".join(r.stderr.strip()[-300:] for r in runs)
            assert refused[0].returncode != 0 and re.search(
                rf"error: --out: run dir {re.escape(str(out))} (already exists and is not empty|was claimed by "
                rf"another `pipeline run` started at the same time|is held by another pipeline process "
                rf"\(pid (\d+|unknown)\)); a run never overwrites or shares another's "
                rf"dir\. Use `pipeline run --resume {re.escape(str(out))}` to finish that run, or another --out",
                refused[0].stderr), refused[0].stderr


def test_manifest_creation_is_exclusive_under_a_thread_race(tmp_path):
    path = tmp_path / "run" / "manifest.json"
    plan = {"env_diff": {}, "arm_runs": []}
    barrier, results = threading.Barrier(8), []

    def create(i: int) -> None:
        barrier.wait()
        try:
            Manifest.create(path, recipe={"who": i}, recipe_path="r.yaml", plan=plan, hosts={},
                            run_id=f"id{i}", created=now())
            results.append(i)
        except FileExistsError as e:
            results.append(e)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if isinstance(r, int)]
    assert len(winners) == 1 and len(results) == 8
    assert json.loads(path.read_text())["recipe"] == {"who": winners[0]}
    assert sorted(p.name for p in path.parent.iterdir()) == ["manifest.json"]  # no temporary files left
    with pytest.raises(FileExistsError, match=r"manifest\.json"):
        Manifest.create(path, recipe={}, recipe_path="r.yaml", plan=plan, hosts={}, run_id="x", created=now())


def test_remote_dirs_of_runs_with_one_basename_differ(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path, hosts={"box": {"kind": "ssh", "address": "10.0.0.9"}},
                                      placement={"hosts": ["box"]}))
    dirs = []
    for parent in ("a", "b"):
        run_dir = tmp_path / parent / "run"
        plan = build_plan(recipe, run_dir, new_run_id(run_dir, now()))
        dirs.append({a.name: a.artifact_dir for a in plan.arm_runs})
    assert dirs[0]["off"] != dirs[1]["off"] and dirs[0]["on"] != dirs[1]["on"]
    assert all(d.startswith("/tmp/pipeline/run-") for run in dirs for d in run.values())
    # The same run planned again (a resume reads run_id from its manifest) finds the same folders.
    run_id = new_run_id(tmp_path / "a/run", "2026-01-01T00:00:00+00:00")
    again = [build_plan(recipe, tmp_path / "a/run", run_id).arm_runs[0].artifact_dir for _ in range(2)]
    assert again[0] == again[1]
    # A manifest from before run ids has none: its resume keeps the old basename-only folder.
    assert build_plan(recipe, tmp_path / "a/run", None).arm_runs[0].artifact_dir == "/tmp/pipeline/run/arms/off"


@pytest.mark.ssh
def test_resume_finds_its_own_remote_dir_and_no_other_run_shares_it(sshd, tmp_path):
    """Two runs whose dirs share a basename, on one SSH host with one workdir, then a resume of the first.
    `echo` stands in for the host's python: each server start appends its command line to the remote
    server.log and exits, so the log counts the starts that used that folder."""
    workdir = tmp_path / "remote"
    recipe = write_recipe(tmp_path, placement={"hosts": ["box"]}, hosts={"box": {
        "kind": "ssh", "address": "127.0.0.1", "port": sshd["port"], "user": sshd["user"], "key": sshd["key"],
        "workdir": str(workdir), "python": "echo"}}, server={"port": 30977, "startup_timeout_s": 30})

    def run(*args: str) -> dict:
        p = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", *args], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 1 and "server exited with code 0 before becoming healthy" in p.stderr, p.stderr
        out = Path(args[-1])
        return json.loads((out / "manifest.json").read_text())

    first = run(str(recipe), "--out", str(tmp_path / "a/run"))
    other = run(str(recipe), "--out", str(tmp_path / "b/run"))
    resumed = run("--resume", str(tmp_path / "a/run"))

    remote = {name: Path(m["plan"]["arm_runs"][0]["artifact_dir"])
              for name, m in (("first", first), ("other", other), ("resumed", resumed))}
    assert remote["first"] != remote["other"], "two runs share one remote folder"
    assert remote["resumed"] == remote["first"] and resumed["run_id"] == first["run_id"]
    starts = {name: (remote[name] / "server.log").read_text().count("-m pipeline.emulator")
              for name in ("first", "other")}
    assert starts == {"first": 2, "other": 1}


HOLDER = """
import sys, time
from pipeline import dirlock
with dirlock.exclusive(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_resume_refuses_a_run_dir_another_process_holds_and_takes_it_once_that_one_died(tmp_path):
    """A second process in a live run's dir would kill its server and write into its aiperf folder."""
    import os
    import shutil
    import signal

    from pipeline import dirlock

    run = tmp_path / "run"
    shutil.copytree(REPO / "tests/analysis/data/quickstart_run", run)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        p = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", "--resume", str(run)], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and (f"error: --resume: run dir {run} is held by another pipeline process (pid "
                                      f"{holder.pid}); wait for it to finish or stop it, then resume") in p.stderr
        assert "run dir:" not in p.stdout  # refused before it started anything
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    with dirlock.exclusive(run):  # the kernel dropped the dead holder's lock: nothing stale to clean
        assert (run / dirlock.LOCK_NAME).read_text() == f"{os.getpid()}\n"


def test_a_run_starting_during_a_reports_probe_of_its_lock_is_not_refused(tmp_path):
    """`pipeline report` asks whether a run is in progress by taking a shared lock for an instant; a resume that
    starts in that instant waits it out instead of calling the dir in use."""
    import fcntl
    import os
    import threading

    from pipeline import dirlock

    with dirlock.exclusive(tmp_path):
        pass  # the lock file, as a finished run leaves it
    probe = os.open(tmp_path / dirlock.LOCK_NAME, os.O_RDONLY)
    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
    threading.Timer(0.05, os.close, (probe,)).start()  # the probe lets go 50 ms later
    with dirlock.exclusive(tmp_path):
        assert dirlock.holder(tmp_path) == str(os.getpid())


def test_a_new_run_refused_by_its_host_check_leaves_no_run_dir(tmp_path):
    # nvidia-smi is the interface the host check reads; this one reports GPU 0 and GPU 1 as different models
    smi = tmp_path / "bin/nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho '0, NVIDIA H200, u0, 1980, 1980, 3201, 143771, 570'\n"
                   "echo '1, NVIDIA H100 80GB HBM3, u1, 1980, 1980, 2619, 81559, 570'\n")
    smi.chmod(0o755)
    recipe = write_recipe(tmp_path, hosts={"local": {"kind": "local", "gpus": [0, 1]}},
                          placement={"mode": "concurrent", "hosts": ["local"], "gpus_per_arm": 1})
    out = tmp_path / "run"
    env = {**os.environ, "PATH": f"{smi.parent}:{os.environ['PATH']}"}
    p = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", str(recipe), "--out", str(out)], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "concurrent arms got GPUs of different models" in p.stderr, p.stderr[-2000:]
    assert not out.exists()


def test_a_run_dir_that_cannot_be_made_is_one_error_line_naming_the_path(tmp_path):
    taken = tmp_path / "notes.txt"
    taken.write_text("a file\n")
    recipe = write_recipe(tmp_path)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=REPO, capture_output=True,
                              text=True, timeout=120)

    for out in (taken, taken / "run"):  # the file itself, or a file on the way
        p = run("run", str(recipe), "--out", str(out))
        assert p.returncode == 1 and p.stderr.startswith(f"error: --out: '{taken}' is not a directory"), p.stderr
        assert p.stderr.count("\n") == 1, p.stderr
    # any other OSError of the mkdir (here: /proc takes no new folders)
    p = run("run", str(recipe), "--out", "/proc/no-run-dir-here/run")
    assert p.returncode == 1 and p.stderr == ("error: --out: cannot make run dir /proc/no-run-dir-here/run: "
                                              "No such file or directory\n"), p.stderr
    # a recipe's output_dir: refused when the recipe is read, so validate says so too
    for output_dir in (taken, taken / "runs"):
        p = run("validate", str(write_recipe(tmp_path, output_dir=str(output_dir))))
        assert p.returncode == 2 and f"\noutput_dir: '{taken}' is not a directory; " in p.stderr, p.stderr
    assert taken.read_text() == "a file\n"


@pytest.mark.ssh
def test_a_new_run_on_an_unreachable_ssh_host_leaves_no_run_dir_and_the_fixed_recipe_runs_there(sshd, tmp_path):
    """A closed port or a key sshd refuses: one error line naming the host, and no run dir (its manifest would
    record the bad recipe, and refuse the fixed one: a resume runs the recorded recipe). Once the host is
    reachable the same --out runs; a host without nvidia-smi is recorded as reporting no GPUs."""
    stranger = tmp_path / "stranger_key"  # a key sshd does not know
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", stranger], check=True)
    box = {"kind": "ssh", "address": "127.0.0.1", "port": sshd["port"], "user": sshd["user"], "key": sshd["key"],
           "workdir": str(tmp_path / "remote"), "python": "echo"}  # `echo`: each server exits at once
    out = tmp_path / "run"

    def run(**bad) -> subprocess.CompletedProcess:
        recipe = write_recipe(tmp_path, placement={"hosts": ["box"]}, hosts={"box": {**box, **bad}},
                              server={"port": free_port(), "startup_timeout_s": 30})
        return subprocess.run([sys.executable, "-m", "pipeline.cli", "run", str(recipe), "--out", str(out)],
                              cwd=REPO, capture_output=True, text=True, timeout=120)

    for bad in ({"port": free_port()}, {"key": str(stranger)}):
        p = run(**bad)
        port = bad.get("port", sshd["port"])
        assert p.returncode == 1 and p.stderr.startswith(
            f"error: host 'box' ({sshd['user']}@127.0.0.1:{port}) is unreachable over SSH: "), p.stderr
        assert p.stderr.count("\n") == 1 and "run dir:" not in p.stdout, p.stdout + p.stderr
        assert not out.exists(), sorted(out.rglob("*"))

    p = run()  # fixed: it gets as far as the server, which `echo` ends at once
    assert p.returncode == 1 and "server exited with code 0 before becoming healthy" in p.stderr, p.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    box_facts = manifest["hosts"]["box"]
    assert {k: box_facts[k] for k in ("kind", "gpus")} == {"kind": "ssh", "gpus": []}
    assert box_facts["machine"]["cpus"] >= 1 and box_facts["machine"]["hostname"]  # read over SSH
    assert manifest["stages"]["off"]["server"]["status"] == "failed"
