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
                                         r"peer-table, all"):
        select("nope")


def test_peer_table_selection_is_kernel_md_shapes_with_tiny_and_skewed_batches():
    names = [s.name for s in select("peer-table")]
    assert names[:17] == [s.name for s in select("main,variants")]  # KERNEL.md's 17
    assert names[17:] == ["host-64x24", "host-64x128", "long-among-short", "long-among-short-uniform"]


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
