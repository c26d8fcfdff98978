"""Server stage failures surface as one clear error, through the real CLI and a real emulator process."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
# A profile path passes `pipeline validate` (the server reads it where it runs) and stops the emulator at start.
MISSING_PROFILE = "/nonexistent/hardware-profile.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _recipe(tmp_path: Path, port: int, server_args: dict) -> Path:
    r = {"name": "t", "engine": "emulator", "model": "m",
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
    port = _free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        p = _run(_recipe(tmp_path, port, {}), tmp_path / "run")
    assert p.returncode == 1
    assert f"error: server.port: port {port} on host 'local' is in use; pick a free port" in p.stderr
    assert "Traceback" not in p.stderr


def test_server_that_exits_at_start_shows_its_log(tmp_path):
    p = _run(_recipe(tmp_path, _free_port(), {"hardware": MISSING_PROFILE}), tmp_path / "run")
    assert p.returncode == 1
    assert "error: server exited with code" in p.stderr and "before becoming healthy" in p.stderr
    assert f"no file {MISSING_PROFILE}" in p.stderr  # the emulator's own complaint, from the log tail
    manifest = yaml.safe_load((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["stages"]["off"]["server"]["status"] == "failed"


def test_existing_run_dir_is_never_overwritten(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    p = _run(_recipe(tmp_path, _free_port(), {}), out)
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

    recipe = load_recipe(_recipe(tmp_path, _free_port(), {}))
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
    p = _run(_recipe(tmp_path, _free_port(), {"hardware": MISSING_PROFILE}), tmp_path / "run")
    assert p.returncode == 1
    manifest = yaml.safe_load((tmp_path / "run" / "manifest.json").read_text())
    entry = manifest["stages"]["off"]["server"]
    assert entry["status"] == "failed" and isinstance(entry["pid"], int)
