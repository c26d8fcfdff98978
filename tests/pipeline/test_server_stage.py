"""Server stage failures surface as one clear error, through the real CLI and a real emulator process."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


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
    p = _run(_recipe(tmp_path, _free_port(), {"max_running_requests": 0}), tmp_path / "run")
    assert p.returncode == 1
    assert "error: server exited with code" in p.stderr and "before becoming healthy" in p.stderr
    assert "max_running_requests" in p.stderr  # the emulator's own complaint, from the log tail
    manifest = yaml.safe_load((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["stages"]["off"]["server"]["status"] == "failed"


def test_existing_run_dir_is_never_overwritten(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    p = _run(_recipe(tmp_path, _free_port(), {}), out)
    assert p.returncode != 0 and "already exists and is not empty" in p.stderr
    assert (out / "keep.txt").read_text() == "x"
