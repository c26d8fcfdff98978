"""A real one-node Slurm cluster on 127.0.0.1 for tests: munged, slurmctld and slurmd from Debian's packages.

The node declares two GPUs through gres.conf files that are plain files (Slurm only needs device paths to
exist to schedule them; no GPU is touched), so `--gres=gpu:1` jobs get CUDA_VISIBLE_DEVICES set by Slurm.
Run as a script to keep a cluster up by hand: `python tests/slurm_cluster.py DIR` (Ctrl-C stops it).
"""
from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
# slurm's auth/munge plugin connects to munged at this compiled-in path
MUNGE_LINK = Path("/run/munge/munge.socket.2")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scancel", "scontrol")


def missing_binaries() -> list[str]:
    return [b for b in DAEMONS + CLIENTS if not (shutil.which(b) or Path(f"/usr/sbin/{b}").exists())]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


SLURM_CONF = """\
ClusterName=pipetest
SlurmctldHost={ctld}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
GresTypes=gpu
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=5
InactiveLimit=0
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 Gres=gpu:2 Feature=emu State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


@dataclass
class SlurmCluster:
    root: Path
    env: dict[str, str]        # SLURM_CONF for every client call
    node: str
    procs: list[subprocess.Popen]

    def stop(self) -> None:
        subprocess.run(["scancel", "--full", "-u", "root"], env=self.env, capture_output=True, timeout=20)
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        link = MUNGE_LINK
        if link.is_symlink() and Path(os.readlink(link)).parent == self.root / "munge":
            link.unlink()


def start_cluster(root: Path) -> SlurmCluster:
    """Generate the config under `root`, start the three daemons, wait until the node is idle."""
    root = Path(root)
    for sub in ("state", "spool", "munge", "dev"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "munge", 0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    sock = root / "munge" / "munge.socket"
    for i in range(2):  # the node's two "GPUs": slurmd wants character devices; these are /dev/null's twins
        dev = root / "dev" / f"gpu{i}"
        if not dev.exists():
            os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    # slurmctld insists on its own host name; the node is `localhost` (slurmd -N) because the pipeline
    # connects to the node by the name Slurm gives it, and a CI container's host name may not resolve
    ctld, node = socket.gethostname().split(".")[0], "localhost"
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(ctld=ctld, node=node, ctld_port=_free_port(), d_port=_free_port(), d=root,
                                      cpus=os.cpu_count() or 2))
    (root / "gres.conf").write_text(f"Name=gpu File={root}/dev/gpu[0-1]\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = _start_munged(root, key, sock)
    procs.append(subprocess.Popen([_bin("slurmctld"), "-D", "-i", "-f", str(conf)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=open(root / "slurmctld.err", "w")))
    procs.append(subprocess.Popen([_bin("slurmd"), "-D", "-N", node, "-f", str(conf)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=open(root / "slurmd.err", "w")))
    cluster = SlurmCluster(root, env, node, procs)

    def idle() -> bool:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
        return r.returncode == 0 and r.stdout.strip() in ("idle", "mixed", "allocated")
    try:
        _wait(idle, 60, "node idle in sinfo", root / "slurmd.log")
    except RuntimeError:
        cluster.stop()
        raise
    return cluster


def _start_munged(root: Path, key: Path, sock: Path) -> list[subprocess.Popen]:
    """A private munged (own key and socket), linked where slurm's auth plugin looks. Where a system munged
    already owns that path (a real socket, not a link), every daemon here uses it instead."""
    if MUNGE_LINK.exists() and not MUNGE_LINK.is_symlink():
        return []
    MUNGE_LINK.parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen([_bin("munged"), "-F", "-f", "--key-file", str(key), "--socket", str(sock),
                          "--pid-file", str(root / "munge" / "munged.pid"),
                          "--log-file", str(root / "munge" / "munged.log"), "--seed-file", str(root / "munge" / "seed")],
                         stdout=subprocess.DEVNULL, stderr=open(root / "munged.err", "w"))
    _wait(lambda: sock.exists(), 10, "munged socket", root / "munged.err")
    if MUNGE_LINK.is_symlink():  # left by an earlier test cluster
        MUNGE_LINK.unlink()
    MUNGE_LINK.symlink_to(sock)
    return [p]


def _wait(ok, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
    raise RuntimeError(f"slurm test cluster: no {what} after {timeout_s}s; {log}:\n{tail}")


if __name__ == "__main__":
    import signal

    # SIGTERM too: a script started in the background by a shell ignores SIGINT
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    c = start_cluster(Path(sys.argv[1]))
    print(f"export SLURM_CONF={c.env['SLURM_CONF']}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        c.stop()
