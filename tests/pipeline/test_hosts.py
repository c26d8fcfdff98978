"""Host protocol: LocalHost with real subprocesses; SshHost against a real sshd started on 127.0.0.1."""
from __future__ import annotations

import shlex
import subprocess
import time

import pytest

from pipeline.hosts import EXIT_UNKNOWN, HostError, LocalHost, SshHost
from ports import free_port


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
    host = SshHost("gpu-node", "127.0.0.1", user="root", port=free_port(), connect_timeout=2)
    with pytest.raises(HostError, match=r"host 'gpu-node' \(root@127.0.0.1:\d+\) is unreachable over SSH: .*"
                                        r"Check hosts.gpu-node.address/port/user/key and that "
                                        r"`ssh -p \d+ -l root 127.0.0.1` works.$"):
        host.run(["true"])


def _ended(proc, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while (code := proc.poll()) is None:
        assert time.monotonic() < deadline, "the remote process did not end"
        time.sleep(0.2)
    return code


def test_ssh_poll_gives_the_remote_commands_own_exit_status(sshd, tmp_path):
    """poll once said 0 for any ended process, so a missing interpreter read 'exited with code 0'."""
    host = _host(sshd)
    cases = {"exit7": (["sh", "-c", "exit 7"], 7), "missing": (["/opt/nopython/bin/python", "-V"], 127),
             "ok": (["true"], 0)}
    for name, (argv, code) in cases.items():
        assert _ended(host.start(argv, env={"A": "1"}, log=f"{tmp_path}/{name}/server.log")) == code, name
    assert "No such file or directory" in host.read_tail(f"{tmp_path}/missing/server.log")
    # stop's SIGTERM ends the command, not the wrapper that records it: 128 + 15, as a shell reports it
    proc = host.start(["sleep", "60"], env={}, log=f"{tmp_path}/sleep/server.log")
    time.sleep(0.5)
    assert proc.poll() is None
    assert proc.stop(grace_s=5) == 143 and proc.poll() == 143
    # a server that shuts down on SIGTERM is running until it has: stop waits for it and gets its own code
    proc = host.start(["sh", "-c", 'trap "sleep 1; exit 5" TERM; sleep 60 & wait'], env={},
                      log=f"{tmp_path}/graceful/server.log")
    time.sleep(0.5)
    host.run(["kill", "-TERM", f"-{proc.pid}"])
    assert proc.poll() is None and proc.stop(grace_s=10) == 5
    # a second start on the same log does not read the first one's status
    again = host.start(["sleep", "60"], env={}, log=f"{tmp_path}/sleep/server.log")
    assert again.poll() is None
    again.stop(grace_s=5)


def _ssh_ok(command: str) -> bool:
    """Run an unreachable-host hint's ssh command as given, non-interactively (no prompt for the host key)."""
    argv = shlex.split(command)
    opts = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    return subprocess.run([argv[0], *opts, *argv[1:], "true"], capture_output=True, timeout=30).returncode == 0


def test_the_unreachable_hint_is_the_pipelines_own_ssh_command(sshd):
    """The hint once left out user and key (`ssh -p PORT ADDRESS`): a check that could pass while the pipeline,
    connecting as another user with another key, failed."""
    wrong = SshHost("box", "127.0.0.1", user="nobodyx", port=sshd["port"], key=sshd["key"], connect_timeout=5)
    with pytest.raises(HostError) as e:
        wrong.run(["true"])
    hint = f"ssh -p {sshd['port']} -l nobodyx -i {sshd['key']} 127.0.0.1"
    assert f"Check hosts.box.address/port/user/key and that `{hint}` works." in str(e.value)
    assert not _ssh_ok(hint)  # it fails as the pipeline did
    right = _host(sshd)
    assert right.ssh_command() == f"ssh -p {sshd['port']} -l {sshd['user']} -i {sshd['key']} 127.0.0.1"
    assert _ssh_ok(right.ssh_command()) and right.run(["true"]).returncode == 0  # and passes as it does


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
    # dead, with its group (SIGKILL took the wrapper that records the exit status too); the other log's process
    # untouched
    assert left.poll() == EXIT_UNKNOWN and other.poll() is None
    assert host.run(["sh", "-c", f"pgrep -g {left.pid} || true"]).stdout.strip() == ""
    assert host.kill_writers(log) == []
    other.stop(grace_s=1)
