"""benchmarks.kernel.tail_plans' plan on a CPU: what the GPU measurement compares against balanced must be a
valid plan (every sequence's KV once, in KV order) with the cap and launch order its docstring says."""

from __future__ import annotations

import random
import re

import pytest

from benchmarks.kernel import tail_plans
from benchmarks.kernel.tail_plans import _need, plan_lists, tail_cap
from vattn.planner import KV_TILE, plan_python

O = 8  # the Hopper backend's e4m3 piece overhead


def _covered(lists, seq_lens):
    n = lists.num_items[0]
    for b, L in enumerate(seq_lens):
        rows = range(lists.seq_part_start[b], lists.seq_part_start[b + 1])
        assert all(lists.work_seq[w] == b for w in rows)
        bounds = [(lists.work_start[w], lists.work_end[w]) for w in rows]
        if not L:
            assert not bounds
            continue
        assert [s for s, _ in bounds] == [0] + [e for _, e in bounds[:-1]] and bounds[-1][1] == L
    assert sorted(lists.work_order[:n]) == list(range(n)) and set(lists.work_order[n:]) <= {-1}


def test_equal_sequences_get_a_smaller_cap_with_their_tails_packed_behind_the_full_pieces():
    lens = [35_000] * 16  # 547 tiles: balanced's one-wave cap is 69 (8 pieces, 128 slots of 132)
    lists = plan_lists(lens, [4] * 16, num_kv_heads=1, slots=132, overhead=O)
    _covered(lists, lens)
    n = lists.num_items[0]
    tiles = [-(-(e - s) // KV_TILE) for s, e in zip(lists.work_start[:n], lists.work_end[:n])]
    assert n == 144 and max(tiles) == 68 and sorted(tiles).count(3) == 16
    assert [tiles[w] for w in lists.work_order[:128]] == [68] * 128  # the full pieces launch first
    assert _need([547] * 16, 68, O) == 131 and _need([547] * 16, 67, O) == 133


@pytest.mark.parametrize("seed", range(20))
def test_random_batches_plan_validly_and_never_above_balanced(seed):
    rng = random.Random(seed)
    lens = [rng.choice([rng.randint(1, 2_000), rng.randint(1, 120_000)]) for _ in range(rng.randint(1, 64))]
    q = [rng.randint(0, 4) for _ in lens]
    lists = plan_lists(lens, q, num_kv_heads=1, slots=132, overhead=O)
    base = plan_python(lens, q, num_kv_heads=1, slots=132, mode="balanced", overhead=O)
    _covered(lists, [L if qq else 0 for L, qq in zip(lens, q)])

    def largest(pl):
        n = pl.num_items[0]
        return max((-(-(e - s) // KV_TILE) for s, e in zip(pl.work_start[:n], pl.work_end[:n])), default=0)
    assert largest(lists) <= max(largest(base), O)


def test_need_is_non_increasing_in_the_cap():
    rng = random.Random(0)
    tiles = [rng.randint(1, 2_000) for _ in range(40)]
    needs = [_need(tiles, c, O) for c in range(1, 400)]
    assert all(a >= b for a, b in zip(needs, needs[1:]))
    assert tail_cap(tiles, 1, 132, O) == next(c for c in range(O, 3_000) if _need(tiles, c, O) <= 132)


@pytest.mark.parametrize("args, message", [
    (["--sustained", "-1"], r"--sustained: got -1.0; allowed: seconds >= 0"),
    (["--sustained", "3", "--rest", "-2"], r"--rest: got -2.0; allowed: seconds >= 0"),
    (["--sustained", "3", "--dry-run"], r"--sustained: needs a CUDA GPU"),
])
def test_sustained_input_errors_name_the_field(args, message, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SystemExit):
        tail_plans.main(args)
    assert re.search(message, capsys.readouterr().err)
