"""benchmarks.kernel.shapes: KERNEL.md's shapes, seeded and exact."""

from __future__ import annotations

import pytest

from benchmarks.kernel.shapes import AGENTIC_BIG, agentic_lens, select


def test_agentic_batches_are_seeded_and_exact():
    lens = agentic_lens(20, 2_320_000)
    assert lens == agentic_lens(20, 2_320_000)  # seeded
    assert sum(lens) == 2_320_000 and lens[0] == AGENTIC_BIG and len(lens) == 20
    assert all(1000 <= n <= 200_000 for n in lens[1:])


def test_shape_bytes_and_selection():
    s = select("16x35k")[0]
    assert s.kv_bytes == 16 * 35_000 * 1 * 256 * 2 * 1  # fp8: one byte per element, K and V
    assert select("16x35k-bf16")[0].kv_bytes == 2 * s.kv_bytes
    with pytest.raises(ValueError, match=r"--shapes: got 'nope'; allowed: main, variants, grid, skew, host, paired, "
                                         r"tails-rule, peer-table, all"):
        select("nope")


def test_peer_table_selection_is_kernel_md_shapes_with_tiny_and_skewed_batches():
    names = [s.name for s in select("peer-table")]
    assert names[:17] == [s.name for s in select("main,variants")]  # KERNEL.md's 17
    assert names[17:] == ["host-64x24", "host-64x128", "long-among-short", "long-among-short-uniform"]


def test_tails_rule_batches_lie_on_the_sides_of_balanced_auto_that_their_docstring_says():
    from vattn.planner import kv_tiles, packs_tails, plan_python

    packed = {"8x35k", "16x40k", "16x55k", "bs16-agentic-0.7M", "bs20-agentic-0.9M", "bs32-agentic-1.0M"}
    shapes = select("tails-rule")
    assert {s.name for s in shapes} == packed | {"16x45k", "16x52k", "32x25k"}
    for s in shapes:  # at the H200's 132 SMs and the Hopper kernel's piece overhead
        lens, qs = list(s.seq_lens), list(s.q_lens)
        assert packs_tails("balanced_auto", kv_tiles(lens, qs), 1, 132, 8) == (s.name in packed), s.name
        plans = [plan_python(lens, qs, num_kv_heads=1, slots=132, mode=m, overhead=8)
                 for m in ("balanced", "balanced_tails")]
        assert plans[0] != plans[1], s.name  # the rounds compare two different plans


def test_long_among_short_and_its_uniform_twin():
    # issue 18's batch and its twin: the same batch size and KV tokens, so their TB/s compare directly
    skew = select("skew")
    assert [s.name for s in skew] == ["long-among-short", "long-among-short-uniform", "long-among-short-q1",
                                      "long-among-short-uniform-q1", "long-among-short-last"]
    long, twin = select("long-among-short,long-among-short-uniform")
    assert long.seq_lens == (256_000,) + (512,) * 63 and twin.seq_lens == (4504,) * 64
    assert long.kv_bytes == twin.kv_bytes and long.q_lens == twin.q_lens == (4,) * 64
    assert select("long-among-short-last")[0].seq_lens == (512,) * 63 + (256_000,)
    assert {s.q_lens for s in select("long-among-short-q1,long-among-short-uniform-q1")} == {(1,) * 64}
