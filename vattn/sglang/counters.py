"""What served each forward: a counter per path (vattn | base) and forward mode, and its parser.

Counted once per forward where the backend decides the forward's path: the eager metadata hook
(`init_forward_metadata`) and, for CUDA-graph replays, `init_forward_metadata_out_graph`, which
sglang runs eagerly before every `graph.replay()` (per-layer Python does not run on replay, so a
per-layer count would see only the capture). Captures are not counted.

Published by the scheduler process that serves the first attention-TP rank:
- a server-log line every `VATTN_COUNTERS_INTERVAL` seconds (default 10) when the counts moved,
  and one at exit when the interpreter exits normally (sglang may kill its schedulers, so the
  last periodic line is the one to rely on):
      vattn paths: {"pid": 4242, "base_backend": "fa3", "vattn": {"target_verify": 812, ...},
                    "base": {"target_verify": 0, "extend": 31, ...}}
  Counts are cumulative since the process started; modes with no forward show 0.
- if `VATTN_COUNTERS_FILE` is set, the same JSON object written to that path (atomically) at the
  same moments. `{pid}` in the path is replaced by the process id (use it with DP attention,
  where several schedulers publish).

`parse_log(text)` turns a server log into totals; the pipeline's report imports it. This module
imports nothing from sglang, torch or the pipeline.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import threading
from typing import Optional

PATHS = ("vattn", "base")
MODES = ("target_verify", "draft_extend", "decode", "extend", "other")
PREFIX = "vattn paths: "
INTERVAL_ENV = "VATTN_COUNTERS_INTERVAL"
FILE_ENV = "VATTN_COUNTERS_FILE"

logger = logging.getLogger(__name__)


class PathCounters:
    """Cumulative forward counts by path and mode (one per process; see `process_counters`)."""

    def __init__(self, base_backend: Optional[str] = None):
        self.base_backend = base_backend
        self._counts = {path: dict.fromkeys(MODES, 0) for path in PATHS}
        self._lock = threading.Lock()
        self._version = 0  # bumped on every count: the reporter logs only when it moved

    def count(self, path: str, mode: str) -> None:
        if path not in PATHS:
            raise ValueError(f"path: got {path!r}; allowed: {', '.join(PATHS)}")
        mode = mode if mode in MODES else "other"
        with self._lock:
            self._counts[path][mode] += 1
            self._version += 1

    def reset(self) -> None:
        """Zero every count (tests; counts are otherwise cumulative for the process)."""
        with self._lock:
            for modes in self._counts.values():
                modes.update(dict.fromkeys(MODES, 0))
            self._version += 1

    def snapshot(self) -> dict:
        with self._lock:
            counts = {path: dict(modes) for path, modes in self._counts.items()}
        return {"pid": os.getpid(), "base_backend": self.base_backend, **counts}

    def line(self) -> str:
        return PREFIX + json.dumps(self.snapshot(), sort_keys=False)

    def publish(self, path: Optional[str] = None) -> None:
        """One log line, and the JSON file when a path is given."""
        logger.info(self.line())
        if path:
            _write_atomic(path.replace("{pid}", str(os.getpid())), json.dumps(self.snapshot()))


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            fh.write(text + "\n")
        os.replace(tmp, path)
    except OSError as exc:  # a bad path must not take the server down; say so once per call
        logger.warning("vattn paths: cannot write %s (%s)", path, exc)


class _Reporter:
    """A daemon thread that publishes the counters when they moved, plus once at exit."""

    def __init__(self, counters: PathCounters, interval: float, path: Optional[str]):
        self.counters, self.interval, self.path = counters, interval, path
        self._seen = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vattn-paths", daemon=True)

    def start(self) -> None:
        self._thread.start()
        atexit.register(self.final)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def tick(self) -> None:
        version = self.counters._version
        if version != self._seen:
            self._seen = version
            self.counters.publish(self.path)

    def final(self) -> None:
        self._stop.set()
        self._seen = -1  # always one last line
        self.tick()


_process: Optional[PathCounters] = None
_reporter: Optional[_Reporter] = None


def process_counters(base_backend: Optional[str] = None, *, publisher: bool = True) -> PathCounters:
    """This process's counters; the first call by a publishing rank starts the reporter."""
    global _process, _reporter
    if _process is None:
        _process = PathCounters(base_backend)
    if base_backend and _process.base_backend is None:
        _process.base_backend = base_backend
    if publisher and _reporter is None:
        interval = float(os.environ.get(INTERVAL_ENV, "10") or 10)
        if interval <= 0:
            raise ValueError(f"{INTERVAL_ENV}: got {interval}; must be > 0 seconds")
        _reporter = _Reporter(_process, interval, os.environ.get(FILE_ENV) or None)
        _reporter.start()
    return _process


def parse_log(text: str) -> dict:
    """Server-log text -> {"vattn": {mode: n}, "base": {mode: n}, "base_backend", "processes"}.

    Each line is cumulative for its process, so the last line of each pid counts and the pids are
    summed (several schedulers publish under DP attention). A log without any line gives zeros and
    processes 0: the caller decides whether that is an error."""
    last: dict = {}
    for line in text.splitlines():
        at = line.find(PREFIX)
        if at < 0:
            continue
        try:
            record = json.loads(line[at + len(PREFIX):])
        except json.JSONDecodeError:
            continue  # a line cut by a crash or interleaved output
        last[record.get("pid")] = record
    totals = {path: dict.fromkeys(MODES, 0) for path in PATHS}
    bases = set()
    for record in last.values():
        if record.get("base_backend"):
            bases.add(record["base_backend"])
        for path in PATHS:
            for mode, n in (record.get(path) or {}).items():
                totals[path][mode if mode in MODES else "other"] += int(n)
    base = bases.pop() if len(bases) == 1 else (",".join(sorted(bases)) or None)
    return {**totals, "base_backend": base, "processes": len(last)}
