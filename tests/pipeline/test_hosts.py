"""Host protocol: LocalHost with real subprocesses; SshHost against a real sshd started on 127.0.0.1."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.hosts import HostError, LocalHost, SshHost

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A private sshd on 127.0.0.1 that accepts one generated key for the current user."""
    if not os.path.exists(SSHD):
        pytest.skip("sshd not installed (apt-get install openssh-server)")
    d = tmp_path_factory.mktemp("sshd")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", d / "host_key"], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", d / "client_key"], check=True)
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    os.chmod(d, 0o700)
    port = _free_port()
    config = d / "sshd_config"
    config.write_text(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\n"
                      f"AuthorizedKeysFile {d / 'authorized_keys'}\nPasswordAuthentication no\n"
                      f"PermitRootLogin yes\nSubsystem sftp internal-sftp\nStrictModes no\nPidFile {d / 'sshd.pid'}\nUsePAM no\n")
    Path("/run/sshd").mkdir(exist_ok=True)  # privilege-separation dir sshd insists on
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=open(d / "sshd.log", "w"))
    for _ in range(50):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail(f"sshd did not start: {(d / 'sshd.log').read_text()}")
    yield {"port": port, "key": str(d / "client_key"), "user": os.environ.get("USER") or "root"}
    proc.terminate()
    proc.wait(5)


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
