"""End to end over SSH, no doubles: `pipeline run` starts both arms' emulators on an SSH host (a real sshd on
127.0.0.1), replays load against them, and pulls the remote artifacts into the local run dir."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ports import free_port

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
        info = json.loads((out / f"arms/{arm}/server_info.json").read_text())
        assert info["arm"]["env"]["VATTN"] == ("0" if arm == "off" else "1")
        # the emulator counted tokens with the copy of the recipe's tokenizer put in the run's folder there
        assert info["tokenizer"]["path"] == str(Path(run["artifact_dir"]).parents[1] / "tokenizer")
        assert not (out / f"arms/{arm}/tokenizer").exists()  # not pulled back with the arm's files
        assert (out / f"arms/{arm}/aiperf/profile_export.jsonl").stat().st_size > 0
    assert (out / "report.md").is_file()


# The host's "python": binds the port its server would, prints a line, and never answers HTTP, so the run sits in
# its server stage until startup_timeout_s; a stand-in for an engine that is slow to come up.
NEVER_HEALTHY = """#!{python}
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[sys.argv.index("--port") + 1])))
s.listen()
print("listening", flush=True)
time.sleep(300)
"""


def _box_recipe(tmp_path, sshd, python: str, port: int, startup_timeout_s: float) -> Path:
    recipe = {
        "name": "ssh-leftover", "engine": "emulator", "model": "m", "tokenizer": str(REPO / "recipes/data/tokenizer"),
        "hosts": {"box": {"kind": "ssh", "address": "127.0.0.1", "port": sshd["port"], "user": sshd["user"],
                          "key": sshd["key"], "workdir": str(tmp_path / "remote"), "python": python}},
        "placement": {"hosts": ["box"]},
        "arms": {"off": {"env": {"VATTN": "0"}}, "on": {"env": {"VATTN": "1"}}},
        "server": {"port": port, "startup_timeout_s": startup_timeout_s},
        "load": {"trace": str(REPO / "recipes/data/traces/quickstart"), "benchmark_duration_s": 10, "timeout_s": 120},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _alive(pid: int) -> bool:
    """Whether the process runs (sshd is on this machine); a killed one may stay a zombie a while."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_resume_says_it_stopped_the_server_a_hard_kill_left_on_an_ssh_host(sshd, tmp_path, wait_for):
    """As a Slurm host's cancelled job is said: the resume names the process group it stopped."""
    fake = tmp_path / "never-healthy"
    fake.write_text(NEVER_HEALTHY.format(python=sys.executable))
    fake.chmod(0o755)
    path, out = _box_recipe(tmp_path, sshd, str(fake), free_port(), startup_timeout_s=10), tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", str(path), "--out", str(out)], cwd=REPO,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    old = None
    try:
        def listening() -> bool:
            m = out / "manifest.json"
            if not m.is_file() or not json.loads(m.read_text())["stages"].get("off", {}).get("server", {}).get("pid"):
                return False
            log = json.loads(m.read_text())["plan"]["arm_runs"][0]["artifact_dir"] + "/server.log"
            return Path(log).is_file() and "listening" in Path(log).read_text()

        wait_for(listening, 60, proc)
        proc.kill()
        proc.wait(30)
        old = json.loads((out / "manifest.json").read_text())["stages"]["off"]["server"]["pid"]
        assert _alive(old)

        p = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", "--resume", str(out)], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
        # the port was free again: the new server started, and (never healthy) timed out
        assert p.returncode == 1 and "server not healthy at" in p.stderr, p.stdout[-3000:] + p.stderr[-3000:]
        assert f"off     server    stopped the server left running by an earlier attempt (process group {old})" \
            in p.stdout, p.stdout[-3000:]
        assert not _alive(old)
    finally:
        if proc.poll() is None:
            proc.kill()
        if old and _alive(old):
            os.killpg(old, signal.SIGKILL)


def test_a_refused_port_pulls_nothing_from_the_ssh_host(sshd, tmp_path):
    """The server never started, so its folder on the host was never made: no `could not pull` line before the
    port's error."""
    port = free_port()
    path = _box_recipe(tmp_path, sshd, "echo", port, startup_timeout_s=30)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", port))
        taken.listen()
        p = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", str(path), "--out", str(tmp_path / "run")],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr == (f"error: server.port: port {port} on host 'box' is in use; pick a free "
                                              f"port in the recipe or stop what listens there\n"), p.stderr
    assert "could not pull" not in p.stdout, p.stdout
