"""The per-cycle log: one JSON line per engine cycle, buffered and flushed periodically and at shutdown.

A log file holds exactly one server lifetime: it is created exclusively, never appended to, so a resumed
arm cannot mix the cycles of two servers. With a log folder each start claims the next
`lifetime-<n>.jsonl` (pipeline/paths.py), and /server_info says which one.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from pipeline.paths import cycle_log_file


class CycleLogError(RuntimeError):
    pass


class CycleLog:
    def __init__(self, path: str | Path, flush_s: float = 1.0, lifetime: int | None = None):
        self.path = Path(path)
        self.lifetime = lifetime
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._f = self.path.open("x", buffering=1 << 20)
        except FileExistsError:
            raise CycleLogError(f"cycle_log: {self.path} exists; a cycle log holds one server lifetime. "
                                f"Remove it, pick a new file, or use --cycle-log-dir (one file per start)") from None
        self._buf: list[str] = []
        self._flush_s = flush_s
        self._last = time.monotonic()
        self.lines = 0

    @classmethod
    def next_lifetime(cls, log_dir: str | Path, flush_s: float = 1.0) -> "CycleLog":
        """Claim the lowest free lifetime-<n>.jsonl in `log_dir`; exclusive creation makes the claim safe."""
        n = 0
        while True:
            n += 1
            if cycle_log_file(log_dir, n).exists():
                continue
            try:
                return cls(cycle_log_file(log_dir, n), flush_s, lifetime=n)
            except CycleLogError:  # another server claimed n between the check and the open
                continue

    def info(self) -> dict:
        return {"path": str(self.path), "lifetime": self.lifetime}

    def add(self, record: dict) -> None:
        self._buf.append(json.dumps(record, separators=(",", ":")))
        self.lines += 1
        if time.monotonic() - self._last >= self._flush_s:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            self._f.write("\n".join(self._buf) + "\n")
            self._buf.clear()
        self._f.flush()
        self._last = time.monotonic()

    def close(self) -> None:
        if not self._f.closed:
            self.flush()
            self._f.close()
