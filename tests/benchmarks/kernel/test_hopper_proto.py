"""benchmarks.kernel.hopper_proto's choice of the best Hopper time: timing-only builds and wrong outputs never count."""

import pytest

from benchmarks.kernel.hopper_proto import (STAMP_ROW, _variants, alternating_rounds, best_main_us,
                                            loop_stage_cycles, main, time_in_rounds)


def _rec(**variants):
    """name -> (main us, rel_err, nan) as run_shape records them for the descriptor 8192:1024."""
    rec = {}
    for name, (us, err, nan) in variants.items():
        rec |= {f"hopper_main_us_{name}": us, f"rel_err_{name}_v8192_1024": err, f"nan_{name}_v8192_1024": nan}
    return rec


def test_variants_parse_names_and_defines():
    assert _variants("serial:;overlap:OVERLAP=1;noload:PROFILE_NO_LOAD=1,OVERLAP=1") == {
        "serial": {}, "overlap": {"OVERLAP": "1"}, "noload": {"PROFILE_NO_LOAD": "1", "OVERLAP": "1"}}


def test_best_skips_profile_builds_and_out_of_tolerance_outputs():
    variants = _variants("serial:;overlap:OVERLAP=1;noload:PROFILE_NO_LOAD=1;bad:OVERLAP=2;nan:OVERLAP=3")
    rec = _rec(serial=(130.0, 1.7e-3, False), overlap=(118.0, 1.7e-3, False), noload=(70.0, 0.9, False),
               bad=(60.0, 0.5, False), nan=(50.0, 1e-3, True))
    assert best_main_us(rec, variants, (8192, 1024), "fp8") == 118.0


def test_best_is_none_when_nothing_counts():
    variants = _variants("noload:PROFILE_NO_LOAD=1")
    assert best_main_us(_rec(noload=(70.0, 1e-3, False)), variants, (8192, 1024), "fp8") is None


def test_rounds_alternate_so_that_a_drift_weighs_on_every_variant_alike():
    assert alternating_rounds(["a", "b", "c"], 1) == ["a", "b", "c"]
    assert alternating_rounds(["a", "b", "c"], 3) == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    # a GPU that slows by 1 us a measurement: a steady 10 us build and its twin get the same median
    clock = iter(range(100))
    times = time_in_rounds({"a": lambda: 10 + next(clock), "b": lambda: 10 + next(clock)}, 4)
    assert times == {"a": [10, 13, 14, 17], "b": [11, 12, 15, 16]}
    assert sorted(times["a"])[1:3] == [13, 14] and sorted(times["b"])[1:3] == [12, 15]  # medians 13.5 both


def test_rounds_below_one_are_refused():
    with pytest.raises(SystemExit):
        main(["--rounds", "0"])


def test_loop_stages_are_medians_of_each_ctas_own_differences_and_skip_ctas_without_the_loop():
    def cta(top, *stages):  # clock64 at the iteration's top, then the cycles each stage took
        row = [0] * STAMP_ROW
        row[18] = top
        for slot, took in zip(range(19, 24), stages):
            row[slot] = row[slot - 1] + took
        return row

    ctas = [cta(1000, 500, 400, 100, 700, 150), cta(9000, 600, 450, 200, 800, 100), cta(50, 550, 420, 150, 750, 120),
            [0] * STAMP_ROW]  # the last CTA's piece was too short to reach the stamped tile
    assert loop_stage_cycles(ctas) == {
        "tile 16: top -> S issued": 550, "tile 16: S issued -> P.V(15) issued": 420,
        "tile 16: P.V(15) issued -> S done": 150, "tile 16: S done -> softmax done": 750,
        "tile 16: softmax done -> P packed": 120}
    assert loop_stage_cycles([[0] * STAMP_ROW]) == {}
