"""benchmarks.kernel.hopper_proto's choice of the best Hopper time: timing-only builds and wrong outputs never count."""

import pytest

from benchmarks.kernel.harness import alternating_rounds, parse_named_defines, rounds_faster, time_in_rounds
from benchmarks.kernel.hopper_proto import (SECOND_LOOP_SLOTS, STAMP_ROW, best_main_us,
                                            loop_stage_cycles, main, second_warpgroup_timeline)


def _rec(**variants):
    """name -> (main us, rel_err, nan) as run_shape records them for the descriptor 8192:1024."""
    rec = {}
    for name, (us, err, nan) in variants.items():
        rec |= {f"hopper_main_us_{name}": us, f"rel_err_{name}_v8192_1024": err, f"nan_{name}_v8192_1024": nan}
    return rec


def test_best_skips_profile_builds_and_out_of_tolerance_outputs():
    variants = parse_named_defines("serial:;overlap:OVERLAP=1;noload:PROFILE_NO_LOAD=1;bad:OVERLAP=2;nan:OVERLAP=3", "--variants")
    rec = _rec(serial=(130.0, 1.7e-3, False), overlap=(118.0, 1.7e-3, False), noload=(70.0, 0.9, False),
               bad=(60.0, 0.5, False), nan=(50.0, 1e-3, True))
    assert best_main_us(rec, variants, (8192, 1024), "fp8") == 118.0


def test_best_is_none_when_nothing_counts():
    variants = parse_named_defines("noload:PROFILE_NO_LOAD=1", "--variants")
    assert best_main_us(_rec(noload=(70.0, 1e-3, False)), variants, (8192, 1024), "fp8") is None


def test_rounds_alternate_so_that_a_drift_weighs_on_every_variant_alike():
    assert alternating_rounds(["a", "b", "c"], 1) == ["a", "b", "c"]
    assert alternating_rounds(["a", "b", "c"], 3) == ["a", "b", "c", "c", "b", "a", "a", "b", "c"]
    # a GPU that slows by 1 us a measurement: a steady 10 us build and its twin get the same median
    clock = iter(range(100))
    times = time_in_rounds({"a": lambda: 10 + next(clock), "b": lambda: 10 + next(clock)}, 4)
    assert times == {"a": [10, 13, 14, 17], "b": [11, 12, 15, 16]}
    assert sorted(times["a"])[1:3] == [13, 14] and sorted(times["b"])[1:3] == [12, 15]  # medians 13.5 both


def test_rounds_faster_pairs_each_round_with_the_first_variants():
    # a GPU slowing by 10 us a round hides a 1 us gain from the medians' ranges, not from the pairing
    times = {"base": [80.0, 90.0, 100.0], "new": [79.0, 89.0, 99.0], "worse": [81.0, 89.5, 101.0]}
    assert rounds_faster(times) == {"new": (3, 3), "worse": (1, 3)}
    assert rounds_faster({"only": [1.0, 2.0]}) == {}


def test_rounds_below_one_are_refused():
    with pytest.raises(SystemExit):
        main(["--rounds", "0"])


def test_pack_heads_other_than_one_or_two_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--pack-heads", "4"])
    assert "--pack-heads: got 4; allowed: 1 or 2" in capsys.readouterr().err


def test_a_define_that_is_not_an_integer_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["--variants", "ef:K8=1,PARTIAL_BF16=yes"])
    assert "--variants: 'PARTIAL_BF16=yes'" in capsys.readouterr().err


def _cta(top, stages, first=18):
    """A CTA's stamp row: clock64 at an iteration's top in slot `first`, then the cycles each stage took."""
    row = [0] * STAMP_ROW
    row[first] = top
    for slot, took in zip(range(first + 1, first + 6), stages):
        row[slot] = row[slot - 1] + took
    return row


def test_loop_stages_are_medians_of_each_ctas_own_differences_and_skip_ctas_without_the_loop():
    ctas = [_cta(1000, (500, 400, 100, 700, 150)), _cta(9000, (600, 450, 200, 800, 100)),
            _cta(50, (550, 420, 150, 750, 120)),
            [0] * STAMP_ROW]  # the last CTA's piece was too short to reach the stamped tile
    assert loop_stage_cycles(ctas) == {
        "tile 16: top -> S issued": 550, "tile 16: S issued -> last P.V issued": 420,
        "tile 16: last P.V issued -> S done": 150, "tile 16: S done -> softmax done": 750,
        "tile 16: softmax done -> P packed": 120}
    assert loop_stage_cycles([[0] * STAMP_ROW]) == {}
    assert second_warpgroup_timeline(ctas) == {}  # one consumer warpgroup: no tile 17 stamps


def test_second_warpgroup_stages_are_timed_from_the_first_ones_iteration():
    # the second warpgroup's tile 17 starts 300 cycles after the first's tile 16 in one CTA, 500 in another
    ctas = []
    for top, offset in ((1000, 300), (7000, 500), (40, 400)):
        row = _cta(top, (500, 400, 100, 700, 150))
        second = _cta(top + offset, (100, 200, 300, 400, 500), first=SECOND_LOOP_SLOTS[0])
        ctas.append([a or b for a, b in zip(row, second)])
    assert second_warpgroup_timeline(ctas) == {
        "tile 17: top": 400, "tile 17: S issued": 500, "tile 17: last P.V issued": 700, "tile 17: S done": 1000,
        "tile 17: softmax done": 1400, "tile 17: P packed": 1900}
    assert loop_stage_cycles(ctas, SECOND_LOOP_SLOTS)["tile 17: S done -> softmax done"] == 400
