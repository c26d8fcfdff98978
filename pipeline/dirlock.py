"""One process at a time in a run or sweep dir: `pipeline run`, its `--resume` and `pipeline sweep` hold an
exclusive lock on the dir while they work in it.

Why: a second process in the same dir would kill the first one's server (the runner stops whatever still
writes a stage's log before it redoes the stage) and write into the same aiperf folder and manifest. The
lock is flock(2) on `<dir>/.lock`: the kernel drops it when its holder exits, even on kill -9, so a crashed
run never leaves a stale lock behind and `--resume` can always take it.
"""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

LOCK_NAME = ".lock"


class DirInUse(RuntimeError):
    """Another live process holds the dir: `pid` names it."""

    def __init__(self, directory: Path, pid: str):
        super().__init__(f"{directory} is held by another pipeline process (pid {pid})")
        self.pid = pid


@contextmanager
def exclusive(directory: Path, refusal: Callable[[DirInUse], str] | None = None) -> Iterator[None]:
    """Hold `directory`'s lock for the block, creating the dir if needed. If another process holds it: DirInUse,
    or with `refusal`, SystemExit(refusal(that DirInUse)): the command line's one-line refusal."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            _lock_past_probes(fd)
        except BlockingIOError:
            in_use = DirInUse(directory, os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown")
            if refusal:
                raise SystemExit(refusal(in_use)) from None
            raise in_use from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _lock_past_probes(fd: int, tries: int = 10, pause_s: float = 0.02) -> None:
    """The exclusive lock, retried for a moment: `holder`'s probe holds a shared lock for an instant, which must
    not refuse a run that starts in it. A real holder keeps it past the retries: BlockingIOError."""
    for _ in range(tries - 1):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(pause_s)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def holder(directory: Path) -> str | None:
    """The pid of the live process that holds `directory`'s lock, or None if none does. Reads only: it makes no
    lock file, and its probe holds a shared lock for an instant (`exclusive` waits that out)."""
    try:
        fd = os.open(Path(directory) / LOCK_NAME, os.O_RDONLY)
    except OSError:  # no lock file: no pipeline process ever worked here, or not one that could be read
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)  # releases the probe's lock
