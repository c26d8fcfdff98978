"""analysis.acceptance on hand-built sglang `request.finished` lines joined to aiperf-like records.

Ten sessions of four turns; request i has 100 completion tokens over 40 + i % 7 verify steps, so its
acceptance length is 100 / (40 + i % 7). The "slower" on arm needs 10 more verify steps per request.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from analysis import acceptance as acc
from analysis.load import RECORD_COLUMNS
from pipeline.paths import RunPaths

N = 40


def _line(rid: str | None, tokens: int, steps: int) -> str:
    doc = {"timestamp": "2026-11-30T19:48:43", "event": "request.finished", "rid": "r",
           "out": {"meta_info": {"completion_tokens": tokens, "spec_verify_ct": steps, "prompt_tokens": 9}}}
    if rid:
        doc["headers"] = {"x-request-id": rid}
    return f"[2026-11-30 19:48:43] {json.dumps(doc)}"


def _arm_run(root, name: str, extra_steps: int = 0, logged: bool = True) -> SimpleNamespace:
    paths = RunPaths(root).arm(name)
    paths.root.mkdir(parents=True)
    rows, log = [], ["[t] The server is fired up and ready to roll!"]
    for i in range(N):
        rid = f"{name}-{i}"  # aiperf's ids are random per run: pairing goes through the match key
        rows.append({"conversation_id": f"s{i // 4}", "turn_index": i % 4, "phase": "profiling", "start_ns": i,
                     "end_ns": i + 1, "cancelled": False, "error": None, "ok": True, "tpot_ms": 5.0,
                     "ttft_ms": 1.0, "latency_ms": 9.0, "osl": 100, "isl": 10, "x_request_id": rid})
        log.append(_line(rid, 100, 40 + i % 7 + extra_steps))
    if logged:
        paths.server_log.write_text("\n".join(log) + "\n")
    records = pd.DataFrame(rows, columns=RECORD_COLUMNS).assign(occurrence=0)
    return SimpleNamespace(name=name, records=records, paths=paths)


def test_finished_requests_keeps_only_lines_it_can_join():
    text = "\n".join([_line("a", 100, 40), _line(None, 100, 40), _line("b", 5, 0),
                      _line("c", 12, 4)[:60], '[t] {"event": "request.received", "headers": {"x-request-id": "d"}}',
                      _line("e", 30, 10)])
    got = acc.finished_requests(text)
    assert got["x_request_id"].tolist() == ["a", "e"]
    assert got["accept_len"].tolist() == [2.5, 3.0]


def test_exact_kernel_same_acceptance(tmp_path):
    off, on = _arm_run(tmp_path, "off"), _arm_run(tmp_path, "on")
    r = acc.matched_acceptance(acc.with_acceptance(off), acc.with_acceptance(on))
    assert r["n"] == N and r["same"] == N and (r["lower"], r["higher"]) == (0, 0)
    assert r["delta"].pct == 0.0 and r["delta"].lo == 0.0 and r["delta"].hi == 0.0


def test_fewer_accepted_tokens_show_as_a_negative_delta(tmp_path):
    off, on = _arm_run(tmp_path, "off"), _arm_run(tmp_path, "on", extra_steps=10)
    r = acc.matched_acceptance(acc.with_acceptance(off), acc.with_acceptance(on))
    a = np.mean([100 / (40 + i % 7) for i in range(N)])
    b = np.mean([100 / (50 + i % 7) for i in range(N)])
    assert r["a"] == pytest.approx(a) and r["b"] == pytest.approx(b)
    assert r["delta"].pct == pytest.approx((b - a) / a * 100)
    assert r["delta"].hi < 0 and r["lower"] == N


def test_section_tables_and_aa_rows(tmp_path):
    c = SimpleNamespace(a_runs=[_arm_run(tmp_path, "off"), _arm_run(tmp_path, "off.2")],
                        b_runs=[_arm_run(tmp_path, "on", extra_steps=10), _arm_run(tmp_path, "on.2", extra_steps=10)])
    lines = acc.acceptance_md(c)
    pooled = 100 * N / sum(40 + i % 7 for i in range(N))
    assert f"| off | {N} / {N} | {np.mean([100 / (40 + i % 7) for i in range(N)]):.3f} | {pooled:.3f} |" in lines
    rows = [line.split(" | ")[0] for line in lines if line.startswith("| o") and " vs " in line]
    assert rows == ["| off vs on", "| off.2 vs on.2", "| off vs off.2 (A/A)", "| on vs on.2 (A/A)"]
    assert next(line for line in lines if line.startswith("| off vs off.2")).split(" | ")[4] == "+0.00% [+0.00, +0.00]"


def test_no_lines_no_section_except_for_sglang(tmp_path):
    c = SimpleNamespace(a_runs=[_arm_run(tmp_path, "off", logged=False)], b_runs=[_arm_run(tmp_path, "on", logged=False)])
    assert acc.section_md(c, "emulator") == []
    assert acc.section_md(c, "sglang")[2].startswith("Not logged: start sglang with `--log-requests")
