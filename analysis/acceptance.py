"""Speculative acceptance per request and per arm, from the engine's own per-request log lines.

An exact kernel changes no logits, so it must not change how many draft tokens the target accepts;
a numerics change shows up here before it shows up in answers. sglang reports acceptance per request
when it runs with `--log-requests --log-requests-format json` and `SGLANG_LOG_REQUEST_HEADERS=x-request-id`:
one `request.finished` JSON line per request, with `out.meta_info.{completion_tokens, spec_verify_ct}`
and the X-Request-ID header aiperf sent. That header joins the line to aiperf's record, and the
record's (conversation_id, turn_index, occurrence) pairs it across arms like every matched metric.

Acceptance length of a request = completion_tokens / spec_verify_ct: tokens emitted per verify step
(1 + accepted draft tokens), sglang's own `spec_accept_length`. The aggregate over an arm weighs each
request by its verify steps, so long completions dominate it; the matched per-request comparison
does not.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np

from analysis import stats
from analysis.load import root_sessions
from analysis.metrics import match_requests

if TYPE_CHECKING:
    import pandas as pd

    from analysis.compare import Comparison
    from analysis.rundir import ArmRun

FINISHED_EVENT = '"event": "request.finished"'
HOW_TO_LOG = ("start sglang with `--log-requests --log-requests-level 0 --log-requests-format json` and "
              "env `SGLANG_LOG_REQUEST_HEADERS=x-request-id` (recipes/h200-sglang-qwen3-hd256.yaml does)")


def finished_requests(log_text: str) -> "pd.DataFrame":
    """x_request_id | completion_tokens | verify_steps | accept_len, one row per logged request that
    carries aiperf's X-Request-ID and ran speculative verify at least once."""
    import pandas as pd

    rows = []
    for line in log_text.splitlines():
        if FINISHED_EVENT not in line:
            continue
        try:
            doc = json.loads(line[line.index("{"):])
        except ValueError:  # a line cut off by a crash: the others still count
            continue
        rid = (doc.get("headers") or {}).get("x-request-id")
        meta = (doc.get("out") or {}).get("meta_info") or {}
        tokens, steps = meta.get("completion_tokens"), meta.get("spec_verify_ct")
        if rid and isinstance(tokens, int) and isinstance(steps, int) and steps > 0:
            rows.append({"x_request_id": rid, "completion_tokens": tokens, "verify_steps": steps,
                         "accept_len": tokens / steps})
    return pd.DataFrame(rows, columns=["x_request_id", "completion_tokens", "verify_steps", "accept_len"])


def with_acceptance(run: "ArmRun") -> "pd.DataFrame":
    """The arm run's records with the server's accept_len / verify_steps joined on x_request_id (NaN where
    the log has no line for that request)."""
    log = run.paths.server_log
    logged = finished_requests(log.read_text(errors="replace")) if log.is_file() else finished_requests("")
    logged = logged.drop_duplicates("x_request_id", keep="last")
    return run.records.merge(logged, on="x_request_id", how="left")


def _summary(frame: "pd.DataFrame") -> dict:
    ok = frame[frame["ok"] & frame["accept_len"].notna()]
    steps = ok["verify_steps"].sum()
    return {"n": len(ok), "of": int(frame["ok"].sum()),
            "mean": float(ok["accept_len"].mean()) if len(ok) else float("nan"),
            "pooled": float(ok["completion_tokens"].sum() / steps) if steps else float("nan")}


def matched_acceptance(a: "pd.DataFrame", b: "pd.DataFrame", n_boot: int = stats.N_BOOT,
                       seed: int = stats.SEED) -> dict | None:
    """Per-request accept_len of requests completed and logged in both: mean a / b, delta % [CI] (sessions
    resampled), and the sign test. None when no request pairs up."""
    m = match_requests(a, b)
    pairs = m[(m["status"] == "matched") & m["accept_len_a"].notna() & m["accept_len_b"].notna()]
    if pairs.empty:
        return None
    xa, xb = pairs["accept_len_a"].to_numpy(float), pairs["accept_len_b"].to_numpy(float)
    d = stats.paired_ratio_bootstrap(xa, xb, root_sessions(pairs["conversation_id"]), n_boot, seed)
    lower, higher, _ = stats.sign_test(xb - xa)
    p = stats.session_sign_test(xb - xa, root_sessions(pairs["conversation_id"]))
    return {"n": len(pairs), "a": d.a, "b": d.b, "delta": d, "lower": lower, "higher": higher, "sign_p": p,
            "same": int(np.sum(xa == xb))}


def acceptance_md(c: "Comparison") -> list[str]:
    """The report's section body: [] when no arm run's log carries per-request acceptance."""
    frames = {r.name: with_acceptance(r) for r in c.a_runs + c.b_runs}
    if not any(f["accept_len"].notna().any() for f in frames.values()):
        return []
    lines = ["| arm run | requests with acceptance | mean per request | pooled (tokens / verify steps) |",
             "|---|---|---|---|"]
    for name, f in frames.items():
        s = _summary(f)
        lines.append(f"| {name} | {s['n']} / {s['of']} | {_num(s['mean'])} | {_num(s['pooled'])} |")
    comparisons = [(ra.name, rb.name, "") for ra, rb in zip(c.a_runs, c.b_runs)]
    comparisons += [(runs[0].name, runs[1].name, " (A/A)") for runs in (c.a_runs, c.b_runs) if len(runs) >= 2]
    lines += ["", "| matched requests | n | mean before | mean after | delta [95% CI] | identical | lower / higher "
              "| sign test p (sessions) |", "|---|---|---|---|---|---|---|---|"]
    for x, y, kind in comparisons:
        r = matched_acceptance(frames[x], frames[y])
        if r is None:
            lines.append(f"| {x} vs {y} | 0 | - | - | - | - | - | - |")
            continue
        d = r["delta"]
        lines.append(f"| {x} vs {y}{kind} | {r['n']} | {_num(r['a'])} | {_num(r['b'])} | "
                     f"{_delta(d)} | {r['same']} | {r['lower']} / {r['higher']} | "
                     f"{r['sign_p']:.3g} |")
    lines += ["", "Acceptance length = completion tokens / verify steps of one request (1 + accepted draft "
              "tokens per step), from sglang's `request.finished` log line joined to aiperf's record by "
              "X-Request-ID; matched as the matched requests above. An exact kernel leaves it unchanged: "
              "compare the off-vs-on delta with the A/A rows. The pooled column weighs requests by their "
              "verify steps (long completions dominate it); the matched comparison does not."]
    return lines


def _num(v: float) -> str:
    return f"{v:.3f}" if np.isfinite(v) else "n/a"  # acceptance near 1 needs the third digit


def _delta(d: stats.Delta) -> str:
    ci = f"[{d.lo:+.2f}, {d.hi:+.2f}]" if np.isfinite(d.lo) and np.isfinite(d.hi) else "[no CI]"
    return f"{d.pct:+.2f}% {ci}" if np.isfinite(d.pct) else "n/a"


def section_md(c: "Comparison", engine: str | None) -> list[str]:
    """The whole section; for an sglang run without per-request lines, one line saying how to get them."""
    body = acceptance_md(c)
    if not body and engine == "sglang":
        body = [f"Not logged: {HOW_TO_LOG}."]
    return ["## Speculative acceptance", "", *body, ""] if body else []
