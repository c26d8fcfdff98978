"""benchmarks.kernel.report: the markdown table BENCHMARKS.md quotes."""

from __future__ import annotations

from benchmarks.kernel.report import markdown_table


def test_markdown_table_shows_default_rows_only():
    base = dict(shape="16x35k", kv_dtype="fp8", q_len="4", page_size=16, planner="balanced", us=150.0, plan_us=13.0,
                main_us=130.0, reduce_us=7.0, tbps=1.91, read_ceiling_tbps=4.55, flashinfer_fp8_us=207,
                rel_err=1.8e-3, run="r")
    text = markdown_table([dict(base, default_config=True), dict(base, planner="fixed", default_config=False)])
    assert "| 16x35k | fp8 | 4 | 16 | balanced | 150.0 |" in text and "1.38x" in text and "fixed" not in text
