"""The per-cycle log: one JSON line per engine cycle, buffered and flushed periodically and at shutdown."""
from __future__ import annotations

import json
import time
from pathlib import Path


class CycleLog:
    def __init__(self, path: str, flush_s: float = 1.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", buffering=1 << 20)
        self._buf: list[str] = []
        self._flush_s = flush_s
        self._last = time.monotonic()
        self.lines = 0

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
