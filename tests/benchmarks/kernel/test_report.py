"""benchmarks.kernel.report: the markdown table BENCHMARKS.md quotes."""

from __future__ import annotations

from benchmarks.kernel.report import format_table, markdown_table, rounds_table


def test_markdown_table_shows_default_rows_only():
    base = dict(shape="16x35k", kv_dtype="fp8", q_len="4", page_size=16, planner="balanced", us=150.0, plan_us=13.0,
                main_us=130.0, reduce_us=7.0, tbps=1.91, read_ceiling_tbps=4.55, flashinfer_fp8_us=207,
                rel_err=1.8e-3, run="r")
    text = markdown_table([dict(base, default_config=True), dict(base, planner="fixed", default_config=False)])
    assert "| 16x35k | fp8 | 4 | 16 | balanced | 150.0 |" in text and "1.38x" in text and "fixed" not in text


def test_tables_name_the_backend_that_ran_vattns_main_kernel_where_it_is_not_triton():
    row = dict(shape="16x35k", kv_dtype="fp8", q_len="4", page_size=16, impl="vattn", planner="balanced", us=99.8,
               plan_us=3.9, main_us=90.9, reduce_us=5.5, tbps=2.87, read_ceiling_tbps=4.55, rel_err=2.2e-3, run="r")
    hopper, triton = dict(row, backend="hopper_sm90"), dict(row, backend="triton")
    assert " | vattn/hopper_sm90 | " in format_table([hopper])
    assert "hopper" not in format_table([triton]) and "hopper" not in markdown_table([triton])
    assert "| balanced (hopper_sm90) |" in markdown_table([hopper])


def test_rounds_table_gives_medians_and_the_rounds_each_planner_beat_the_first():
    def row(planner, rnd, us, layer):
        return dict(shape="16x119k", backend="hopper_sm90", planner=planner, round=rnd, us=us, layer_us=layer)
    # tails beat balanced's call in rounds 0 and 2, lost round 1; its layer won round 1 only
    records = [row("balanced", 0, 270.0, 300.0), row("balanced_tails", 0, 265.0, 301.0),
               row("balanced_tails", 1, 280.0, 290.0), row("balanced", 1, 275.0, 295.0),
               row("balanced", 2, 268.0, 296.0), row("balanced_tails", 2, 262.0, 299.0),
               dict(shape="16x119k", impl="flashinfer", planner="-", us=466.0),  # a peer: no round, not counted
               dict(row("balanced", 0, 390.0, 388.0), backend="triton")]  # the other path: a row of its own
    lines = rounds_table(records).splitlines()
    assert lines[2] == "| 16x119k | hopper_sm90 | balanced | 3 | 270.0 | 296.0 | - | - |"
    assert lines[3] == "| 16x119k | hopper_sm90 | balanced_tails | 3 | 265.0 | 299.0 | 2 of 3 | 1 of 3 |"
    assert lines[4] == "| 16x119k | triton | balanced | 1 | 390.0 | 388.0 | - | - |"
    assert len(lines) == 5
