"""Read a run directory's artifacts into pandas frames.

One row per aiperf record: `records_frame(lines)` turns the parsed lines of
`profile_export.jsonl` into a flat frame; `profiling_only` drops the warmup;
`add_match_key` numbers repeated (conversation_id, turn_index) pairs in
dispatch order. Everything here is pure except the `read_*` functions, which
only read files. Errors that a user can cause raise `AnalysisError` with one
line naming the file, what was found and what to do.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd


class AnalysisError(ValueError):
    """A run directory or artifact the analysis cannot use; the message is one line for the user."""


# aiperf metric tag -> our column. inter_token_latency is aiperf's per-request
# (latency - TTFT) / (output tokens - 1): the decode time per token (TPOT).
METRIC_COLUMNS = {
    "inter_token_latency": "tpot_ms",
    "time_to_first_token": "ttft_ms",
    "request_latency": "latency_ms",
    "output_sequence_length": "osl",
    "input_sequence_length": "isl",
}

RECORD_COLUMNS = [
    "conversation_id", "turn_index", "phase", "start_ns", "end_ns",
    "cancelled", "error", "ok", *METRIC_COLUMNS.values(), "x_request_id",
]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Parse a JSON-lines file; a malformed line is an error naming its line number."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise AnalysisError(f"{path}:{n}: not valid JSON ({e.msg}); the file is truncated or corrupt") from None
    return out


def records_frame(lines: list[dict[str, Any]]) -> "pd.DataFrame":
    """aiperf 0.13 `MetricRecordInfo` lines -> one row per request (all phases, errors kept)."""
    import pandas as pd

    rows = []
    for rec in lines:
        meta = rec.get("metadata") or {}
        metrics = rec.get("metrics") or {}
        err = rec.get("error")
        row = {
            "conversation_id": meta.get("conversation_id"),
            "turn_index": meta.get("turn_index"),
            "phase": meta.get("benchmark_phase"),
            "start_ns": meta.get("request_start_ns"),
            "end_ns": meta.get("request_end_ns"),
            "cancelled": bool(meta.get("was_cancelled", False)),
            "error": None if not err else (err.get("type") or err.get("message") or "error"),
            # aiperf's X-Request-ID header: joins a record to the server's own log line for that request
            "x_request_id": meta.get("x_request_id"),
        }
        for tag, col in METRIC_COLUMNS.items():
            m = metrics.get(tag)
            row[col] = m.get("value") if isinstance(m, dict) else None
        rows.append(row)
    df = pd.DataFrame(rows, columns=[c for c in RECORD_COLUMNS if c != "ok"])
    for col in METRIC_COLUMNS.values():
        df[col] = pd.to_numeric(df[col], errors="coerce")
    # A cancelled request is also an error in aiperf's export; "ok" means it completed and has a TPOT.
    df["ok"] = ~df["cancelled"] & df["error"].isna() & usable_tpot(df["tpot_ms"])
    return df[RECORD_COLUMNS]


def usable_tpot(tpot: "pd.Series") -> "pd.Series":
    """A TPOT that measures something: finite and positive. An inf one passed a notna() test, so the per-arm
    table and the matched pairs counted its request while the verdict, which takes logs, dropped it: the
    tables disagreed on n. Such a request counts as having no TPOT, everywhere."""
    import numpy as np

    return (np.isfinite(tpot) & (tpot > 0)).astype(bool)


def root_sessions(conversation_ids) -> "np.ndarray":
    """The session each request belongs to, the unit every CI resamples and every sign test counts: aiperf
    names a subagent's or a spawned chain's conversation `<trace>::sa:<id>` or `<trace>::fa:NNN`, and those
    requests hang on their parent session (they start from its context and run while it waits), so they are
    one independent unit with it, not units of their own."""
    import numpy as np

    return np.array([c.split("::", 1)[0] if isinstance(c, str) else c for c in conversation_ids], dtype=object)


def profiling_only(df: "pd.DataFrame") -> "pd.DataFrame":
    """Drop warmup records: only the profiling phase is measured."""
    return df[df["phase"] == "profiling"].reset_index(drop=True)


def outcome_counts(df: "pd.DataFrame") -> dict[str, int]:
    """Requests by outcome: completed, cancelled, failed (errors that were not cancellations)."""
    cancelled = int(df["cancelled"].sum())
    failed = int((~df["cancelled"] & df["error"].notna()).sum())
    # Records with neither error nor TPOT (e.g. one output token, or an inf TPOT) are neither ok nor failed.
    no_tpot = int((~df["cancelled"] & df["error"].isna() & ~usable_tpot(df["tpot_ms"])).sum())
    return {"total": len(df), "completed": int(df["ok"].sum()), "cancelled": cancelled,
            "failed": failed, "no_tpot": no_tpot}


def add_match_key(df: "pd.DataFrame") -> "pd.DataFrame":
    """Add `occurrence`: the k-th time (0-based) this (conversation_id, turn_index) was dispatched.

    Dispatch order is request start time. x_correlation_id is random per run, so
    it can never pair requests across arms; this key can.
    """
    out = df.sort_values("start_ns", kind="stable").copy()
    out["occurrence"] = out.groupby(["conversation_id", "turn_index"], dropna=False).cumcount()
    return out.reset_index(drop=True)


def window_seconds(df: "pd.DataFrame", phase_window_ns: tuple[int, int] | None = None) -> float:
    """The measured window: from aiperf's profiling phase start (else the first request's) to its last
    request's end. aiperf's phase end can lie a whole grace period later, idle after the last request
    finished, which would understate every rate over the window."""
    if phase_window_ns is not None and phase_window_ns[1] > phase_window_ns[0]:
        start, end = phase_window_ns
        if not df.empty and df["end_ns"].notna().any():
            end = min(end, int(df["end_ns"].max()))
        return (end - start) / 1e9
    if df.empty:
        return float("nan")
    return float(df["end_ns"].max() - df["start_ns"].min()) / 1e9


def read_phase_window(path: Path) -> tuple[int, int] | None:
    """(start_ns, end_ns) of the profiling phase from aiperf's phase_manifest.json (`path`), if present."""
    try:
        phases = json.loads(path.read_text()).get("phases", [])
    except (OSError, ValueError, AttributeError):
        return None
    for ph in phases:
        if ph.get("phase_kind") == "profiling" and ph.get("start_ns") and ph.get("end_ns"):
            return int(ph["start_ns"]), int(ph["end_ns"])
    return None


def logged_cancellations(aiperf_log: Path) -> int | None:
    """Requests aiperf cancelled at the profiling window's end, from its log's phase summary
    (`Phase profiling (profiling) complete | completed=39, cancelled=2, ...`); None without that line. aiperf 0.13
    writes no export record for a cancelled request, so the log is the only place that counts them."""
    import re

    try:
        text = aiperf_log.read_text(errors="replace")
    except OSError:
        return None
    found = re.findall(r"Phase profiling \(profiling\) complete \|[^|\n]*\bcancelled=(\d+)", text)
    return int(found[-1]) if found else None


def server_metrics_frame(doc: dict[str, Any]) -> "pd.DataFrame":
    """aiperf's server_metrics_export.json -> one row per metric: name, kind, value, description (the engine's
    own HELP text, "" where it gives none).

    Gauges give their time-average over the profiling phase, counters their
    rate per second; series (one per label set / endpoint) are summed for
    counters and averaged for gauges.
    """
    import pandas as pd

    rows = []
    for name, m in (doc.get("metrics") or {}).items():
        kind, description = m.get("type"), str(m.get("description") or "")
        stats = [s.get("stats") or {} for s in m.get("series") or []]
        if kind == "gauge":
            vals = [s["avg"] for s in stats if s.get("avg") is not None]
            if vals:
                rows.append({"name": name, "kind": "gauge (avg)", "value": sum(vals) / len(vals),
                             "description": description})
        elif kind == "counter":
            vals = [s["rate"] for s in stats if s.get("rate") is not None]
            if vals:
                rows.append({"name": name, "kind": "counter (rate/s)", "value": sum(vals),
                             "description": description})
    return pd.DataFrame(rows, columns=["name", "kind", "value", "description"])


def warmup_priming(load_result: Path) -> tuple[int, int] | None:
    """(sessions whose first call ran in the warm-up, sessions in the trace) from the load stage's
    load_result.json; None where it did not record them (no warm-up, or an older run)."""
    try:
        doc = json.loads(load_result.read_text())
    except (OSError, ValueError):
        return None
    primed, sessions = (doc.get(k) if isinstance(doc, dict) else None for k in ("warmup_primed", "trace_sessions"))
    return (primed, sessions) if isinstance(primed, int) and isinstance(sessions, int) and sessions > 0 else None
