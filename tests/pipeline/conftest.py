"""Shared fixtures for the pipeline tests: a real sshd on 127.0.0.1 for SSH hosts, a real Slurm cluster, and
`wait_for` for the end-to-end tests that kill a run at a given point."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from ports import free_port

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


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
    port = free_port()
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




@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real one-node Slurm cluster (munged, slurmctld, slurmd) on 127.0.0.1 declaring two GPU gres.

    SLURM_CONF is exported for the session so the pipeline's own sbatch/scontrol calls reach it."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from slurm_cluster import missing_binaries, start_cluster

    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm not installed (missing {', '.join(missing)}): "
                    f"apt-get install -y slurmctld slurmd munge slurm-client")
    if os.geteuid() != 0:
        pytest.skip("the test Slurm cluster runs its daemons as root (SlurmUser=root); run as root")
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    yield cluster
    cluster.stop()
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


@pytest.fixture
def wait_for():
    """wait_for(predicate, timeout_s, proc): poll predicate every 0.5 s until it holds; fail with the process's
    output if it ends first, or when the time is up."""
    def wait(predicate, timeout_s: float, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout_s} s waiting for the run to reach the kill point")
    return wait
