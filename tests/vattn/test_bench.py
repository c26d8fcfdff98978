"""vattn.bench's pure parts: shapes, the sweep filter, the tables (the timing itself needs a GPU)."""

from __future__ import annotations

import pytest

from vattn.bench import _best_of_sweep, _for_shape
from vattn.bench_report import markdown_table
from vattn.bench_shapes import AGENTIC_BIG, agentic_lens, select, uniform


def test_agentic_batches_are_seeded_and_exact():
    lens = agentic_lens(20, 2_320_000)
    assert lens == agentic_lens(20, 2_320_000)  # seeded
    assert sum(lens) == 2_320_000 and lens[0] == AGENTIC_BIG and len(lens) == 20
    assert all(1000 <= n <= 200_000 for n in lens[1:])


def test_shape_bytes_and_selection():
    s = select("16x35k")[0]
    assert s.kv_bytes == 16 * 35_000 * 1 * 256 * 2 * 1  # fp8: one byte per element, K and V
    assert select("16x35k-bf16")[0].kv_bytes == 2 * s.kv_bytes
    with pytest.raises(ValueError, match=r"--shapes: got 'nope'; allowed: main, variants, grid, all"):
        select("nope")


def test_sweep_winner_must_meet_the_tolerance():
    from vattn.kernel import MainConfig

    fast_coarse = dict(kv_dtype="fp8", rel_err=0.024, us=135.0, config=MainConfig(qk_fp8=1).__dict__)
    slower_exact = dict(kv_dtype="fp8", rel_err=0.0018, us=150.0, config=MainConfig(qk_fp8=2).__dict__)
    assert _best_of_sweep([fast_coarse, slower_exact]) == MainConfig(qk_fp8=2)
    assert _best_of_sweep([fast_coarse]) is None
    # a template keeps fp8 Q.K^T off bf16 KV and picks warps by the shape's packed rows
    bf16 = _for_shape(MainConfig(qk_fp8=2), select("16x35k-bf16")[0])
    assert bf16.qk_fp8 == 0 and bf16.num_warps == 4
    assert _for_shape(MainConfig(qk_fp8=2), uniform(16, 35_000, q_len=8)).num_warps == 8


def test_markdown_table_shows_default_rows_only():
    base = dict(shape="16x35k", kv_dtype="fp8", q_len="4", page_size=16, planner="balanced", us=150.0, plan_us=13.0,
                main_us=130.0, reduce_us=7.0, tbps=1.91, read_ceiling_tbps=4.55, flashinfer_fp8_us=207,
                rel_err=1.8e-3, run="r")
    text = markdown_table([dict(base, default_config=True), dict(base, planner="fixed", default_config=False)])
    assert "| 16x35k | fp8 | 4 | 16 | balanced | 150.0 |" in text and "1.38x" in text and "fixed" not in text


def test_sglang_triton_is_the_baseline_when_sglang_imports(monkeypatch):
    from vattn import bench, peers

    monkeypatch.setattr(peers, "sglang_importable", lambda: None)
    assert bench.sglang_baseline()[0] == ["sglang_triton"]
    monkeypatch.setattr(peers, "sglang_importable", lambda: "sglang: ModuleNotFoundError: No module named 'orjson'")
    names, note = bench.sglang_baseline()
    assert names == [] and "orjson" in note and "skipped" in note
