"""Server stage failures surface as one clear error, through the real CLI and a real emulator process."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ports import free_port

REPO = Path(__file__).resolve().parents[2]
# A profile path passes `pipeline validate` (the server reads it where it runs) and stops the emulator at start.
MISSING_PROFILE = "/nonexistent/hardware-profile.yaml"


def _recipe(tmp_path: Path, port: int, server_args: dict) -> Path:
    r = {"name": "t", "engine": "emulator", "model": "m", "tokenizer": str(REPO / "recipes/data/tokenizer"),
         "arms": {"off": {"env": {"VATTN": "0"}}, "on": {"env": {"VATTN": "1"}}},
         "server": {"port": port, "args": server_args, "startup_timeout_s": 60},
         "load": {"trace": str(REPO / "recipes/data/traces/quickstart"), "benchmark_duration_s": 5,
                  "timeout_s": 100}}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    return path


def _run(recipe: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "run", str(recipe), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)


def test_port_in_use(tmp_path):
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        p = _run(_recipe(tmp_path, port, {}), tmp_path / "run")
    assert p.returncode == 1
    assert f"error: server.port: port {port} on host 'local' is in use; pick a free port" in p.stderr
    assert "Traceback" not in p.stderr


def test_server_that_exits_at_start_shows_its_log(tmp_path):
    p = _run(_recipe(tmp_path, free_port(), {"hardware": MISSING_PROFILE}), tmp_path / "run")
    assert p.returncode == 1
    assert "error: server exited with code" in p.stderr and "before becoming healthy" in p.stderr
    assert f"no file {MISSING_PROFILE}" in p.stderr  # the emulator's own complaint, from the log tail
    manifest = yaml.safe_load((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["stages"]["off"]["server"]["status"] == "failed"


# A server whose health answer takes a while (one busy starting up): the other arm's server, holding the port.
SLOW_HEALTH = """
import http.server, sys, time
class Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(float(sys.argv[2]))
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Slow).serve_forever()
"""


def test_a_server_that_lost_its_port_is_not_made_healthy_by_the_one_holding_it(tmp_path):
    """Two servers on one port (two concurrent arms were once planned so): the second cannot bind and exits,
    and the first answers its health check. The off arm then recorded and loaded the on arm's server."""
    from pipeline.hosts import LocalHost
    from pipeline.stages.server import ServerError, wait_healthy

    port = free_port()
    holder = subprocess.Popen([sys.executable, "-c", SLOW_HEALTH, str(port), "1.5"])  # < wait_healthy's 2 s per try
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        host, log = LocalHost(), tmp_path / "server.log"
        # binds after a moment (a server's imports), while its health check is already waiting on the holder
        loser = host.start([sys.executable, "-c", f"import socket, time; time.sleep(0.3); "
                                                  f"socket.socket().bind(('127.0.0.1', {port}))"], env={}, log=str(log))
        url = f"http://127.0.0.1:{port}/health"
        with pytest.raises(ServerError, match=rf"^server exited with code 1, yet {url} answered: another process "
                                              rf"serves that port on host 'local'; stop it or pick a free server.port; "
                                              rf"last lines of {log}:\n(.|\n)*Address already in use"):
            wait_healthy(loser, host, url, str(log), timeout_s=30)
        loser.stop()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.ssh
@pytest.mark.parametrize("name", ["box", "local"])
def test_a_missing_interpreter_on_an_ssh_host_names_its_exit_code_and_field(sshd, tmp_path, name):
    """The server's real exit status (it once read 'exited with code 0' for any server that ended) and the
    field that names the interpreter; an SSH host is one by its kind, whatever the recipe names it."""
    r = yaml.safe_load(_recipe(tmp_path, free_port(), {}).read_text())
    r["hosts"] = {name: {"kind": "ssh", "address": "127.0.0.1", "port": sshd["port"], "user": sshd["user"],
                          "key": sshd["key"], "workdir": str(tmp_path / "remote"),
                          "python": "/opt/nopython/bin/python"}}
    r["placement"] = {"hosts": [name]}
    path = tmp_path / "ssh.yaml"
    path.write_text(yaml.safe_dump(r))
    p = _run(path, tmp_path / "run")
    assert p.returncode == 1
    assert ("error: server exited with code 127 before becoming healthy: a program of its command was not found "
            f"on host '{name}' (the command starts with '/opt/nopython/bin/python'); set hosts.{name}.python to an "
            "interpreter there that has the engine installed (or, for vllm, server.launch to its launch command "
            "there); last lines of ") in p.stderr, p.stderr
    assert "'/opt/nopython/bin/python': No such file or directory" in p.stderr  # the log's tail
    assert "Traceback" not in p.stderr


def test_existing_run_dir_is_never_overwritten(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    p = _run(_recipe(tmp_path, free_port(), {}), out)
    assert p.returncode != 0 and "already exists and is not empty" in p.stderr
    assert (out / "keep.txt").read_text() == "x"


def _start(tmp_path, monkeypatch, where: str):
    """start_server on a real emulator process with a KeyboardInterrupt (what SIGTERM raises in the runner) at
    `where`: "started" (just after the process exists) or "info" (after it answered healthy)."""
    from pipeline.config.recipe import load_recipe
    from pipeline.engines import get_engine
    from pipeline.hosts import LocalHost
    from pipeline.paths import RunPaths
    from pipeline.plan import build_plan
    from pipeline.stages import server

    recipe = load_recipe(_recipe(tmp_path, free_port(), {}))
    plan = build_plan(recipe, tmp_path / "run")
    a = plan.arm_runs[0]
    Path(a.artifact_dir).mkdir(parents=True, exist_ok=True)
    procs = []

    def started(proc):
        procs.append(proc)
        if where == "started":
            raise KeyboardInterrupt("signal 15")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt("signal 15")

    if where == "info":
        monkeypatch.setattr(server, "write_json_atomic", interrupted)
    try:
        server.start_server(get_engine(recipe.engine), a, LocalHost(), RunPaths(Path(plan.run_dir)).arm(a.name),
                            timeout_s=60, started=started)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the interrupt did not surface")
    return procs, a.port


def test_an_interrupt_while_the_server_starts_stops_it(tmp_path, monkeypatch):
    """A SIGTERM between the server's start and start_server's return (here: once it answered healthy, and just
    after it started) must not leave it running: a resume would find its port taken (CI, 2026-12-02)."""
    for where in ("info", "started"):
        (tmp_path / where).mkdir()
        procs, port = _start(tmp_path / where, monkeypatch, where)
        assert len(procs) == 1 and procs[0].poll() is not None, where  # stopped, not left running
        with socket.socket() as s:  # and its port is free again
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))


def test_the_runner_records_the_servers_pid_as_it_starts(tmp_path):
    """The manifest names the server's process from its start, not only once healthy: a resume stops a server
    that a killed run left behind by that pid (runner._kill_leftover)."""
    p = _run(_recipe(tmp_path, free_port(), {"hardware": MISSING_PROFILE}), tmp_path / "run")
    assert p.returncode == 1
    manifest = yaml.safe_load((tmp_path / "run" / "manifest.json").read_text())
    entry = manifest["stages"]["off"]["server"]
    assert entry["status"] == "failed" and isinstance(entry["pid"], int)
