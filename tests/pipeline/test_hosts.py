"""Host protocol: LocalHost with real subprocesses; SshHost against a real sshd started on 127.0.0.1."""
from __future__ import annotations

import socket
import time

import pytest

from pipeline.hosts import HostError, LocalHost, SshHost


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _host(sshd) -> SshHost:
    return SshHost("box", "127.0.0.1", user=sshd["user"], port=sshd["port"], key=sshd["key"])


def test_local_run_start_stop_and_tail(tmp_path):
    host = LocalHost()
    r = host.run(["sh", "-c", "echo $GREETING; exit 3"], env={"GREETING": "hi"})
    assert (r.returncode, r.stdout.strip()) == (3, "hi")
    log = tmp_path / "srv.log"
    proc = host.start(["sh", "-c", "echo up; sleep 60"], env={}, log=str(log))
    time.sleep(0.3)
    assert proc.poll() is None
    proc.stop(grace_s=2)
    assert proc.poll() is not None
    assert host.read_tail(str(log)) == "up"


def test_ssh_run_start_stop_put_get(sshd, tmp_path):
    host = _host(sshd)
    r = host.run(["sh", "-c", "echo $X-$((1+2))"], env={"X": "ssh"})
    assert (r.returncode, r.stdout.strip()) == (0, "ssh-3")

    remote = tmp_path / "remote"
    log = f"{remote}/logs/server.log"
    proc = host.start(["sh", "-c", "echo started; sleep 60"], env={"A": "1"}, log=log)
    time.sleep(0.5)
    assert proc.poll() is None
    proc.stop(grace_s=3)
    assert proc.poll() is not None
    assert host.read_tail(log).strip() == "started"

    src = tmp_path / "payload.txt"
    src.write_text("data")
    host.put(src, f"{remote}/payload.txt")
    (remote / "sub").mkdir()
    (remote / "sub" / "x.json").write_text("{}")
    host.get(str(remote), tmp_path / "pulled")
    assert (tmp_path / "pulled" / "payload.txt").read_text() == "data"
    assert (tmp_path / "pulled" / "sub" / "x.json").read_text() == "{}"
    assert (tmp_path / "pulled" / "logs" / "server.log").exists()


def test_ssh_unreachable_host_names_the_host_and_fix():
    host = SshHost("gpu-node", "127.0.0.1", user="root", port=_free_port(), connect_timeout=2)
    with pytest.raises(HostError, match=r"host 'gpu-node' \(root@127.0.0.1:\d+\) is unreachable over SSH: .*"
                                        r"Check hosts.gpu-node.address/port/user/key"):
        host.run(["true"])


def test_ssh_kill_writers_stops_a_server_a_killed_run_left_behind(sshd, tmp_path):
    """Its pid lived only in the dead controller: the log it writes to is how a resume finds it."""
    host = _host(sshd)
    log = f"{tmp_path}/arm/server.log"
    left = host.start(["sh", "-c", "echo up; sleep 300 & sleep 300"], env={}, log=log)  # a server and a worker
    other = host.start(["sleep", "300"], env={}, log=f"{tmp_path}/other.log")
    time.sleep(0.5)
    assert left.poll() is None and other.poll() is None
    assert host.kill_writers(log) == [left.pid]
    deadline = time.monotonic() + 10  # until init has reaped it: a zombie still answers kill -0
    while left.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left.poll() == 0 and other.poll() is None  # dead, with its group; the other log's process untouched
    assert host.run(["sh", "-c", f"pgrep -g {left.pid} || true"]).stdout.strip() == ""
    assert host.kill_writers(log) == []
    other.stop(grace_s=1)
