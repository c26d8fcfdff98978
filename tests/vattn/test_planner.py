"""Planners: hand-worked cases for each mode, then invariants over random batches (CPU only)."""
import random

import pytest

from vattn.planner import (
    BALANCED, KV_TILE, MIN_PIECE_TILES, PIECE_OVERHEAD_TILES, PLANNERS, SEG_MAX, kv_tiles, max_work_items,
    plan_python, plan_splits, slot_budget,
)
from vattn.planner import _smallest_cap  # the one-wave cap, which balanced's is held against


def pieces_by_seq(plan, batch):
    out = {b: [] for b in range(batch)}
    for s, a, e in plan.pieces():
        out[s].append((a, e))
    return out


# -- hand-worked cases ----------------------------------------------------------------------------

def test_fixed_hand_worked():
    # B=4, Hkv=1, SLOTS=16 -> nseg = pow2floor(16/4) = 4. 1000 tokens = 16 tiles -> 4-tile (256) pieces;
    # 100 tokens = 2 tiles -> fewer pieces than nseg; L=0 and q_len=0 get none.
    p = plan_python([1000, 100, 0, 5], [1, 4, 2, 0], num_kv_heads=1, slots=16, mode="fixed")
    assert p.pieces() == [(0, 0, 256), (0, 256, 512), (0, 512, 768), (0, 768, 1000), (1, 0, 64), (1, 64, 100)]
    assert p.seq_part_start == [0, 4, 6, 6, 6]
    assert p.num_items == [6]
    assert len(p.work_seq) == 20  # W = max(B, SLOTS/Hkv) + B
    assert p.work_seq[6:] == [-1] * 14 and p.work_part == list(range(6)) + [-1] * 14
    assert p.work_start[6:] == [0] * 14 and p.work_end[6:] == [0] * 14
    assert p.work_order == list(range(6)) + [-1] * 14  # fixed launches in row order


def test_fixed_nseg_caps():
    # SLOTS/(B*Hkv) = 1000 -> pow2floor 512 -> capped at SEG_MAX; 100 tiles / 64 -> 2-tile pieces.
    p = plan_python([6400], [1], num_kv_heads=1, slots=1000, mode="fixed")
    assert p.num_items == [50] and all(e - a == 128 for _, a, e in p.pieces())
    # SLOTS < B*Hkv -> one piece per sequence
    p = plan_python([6400, 6400], [1, 1], num_kv_heads=8, slots=8, mode="fixed")
    assert p.pieces() == [(0, 0, 6400), (1, 0, 6400)]


def test_length_aware_hand_worked():
    # Hkv=2, SLOTS=16 -> 8 pieces. Tiles 16, 2, 5: seg 4 tiles gives 4+1+2 = 7 <= 8; seg 3 gives 9.
    p = plan_python([1000, 100, 300], [4, 4, 4], num_kv_heads=2, slots=16, mode="length_aware")
    assert p.pieces() == [
        (0, 0, 256), (0, 256, 512), (0, 512, 768), (0, 768, 1000), (1, 0, 100), (2, 0, 256), (2, 256, 300)]
    assert p.seq_part_start == [0, 4, 5, 7]
    assert len(p.work_seq) == max_work_items(3, 2, 16) == 11


def test_length_aware_seg_max():
    # 130 tiles with a budget of 1000: seg 2 would give 65 > SEG_MAX pieces, so seg = 3 tiles (192 tokens).
    p = plan_python([130 * 64], [1], num_kv_heads=1, slots=1000, mode="length_aware")
    assert p.num_items == [44]
    assert p.pieces()[-1] == (0, 43 * 192, 130 * 64)
    assert all(e - a == 192 for _, a, e in p.pieces()[:-1])


def test_balanced_hand_worked():
    # Same batch as length_aware, where SEG_MAX does not bind: the same cap (4 tiles), the same pieces. The
    # 2-tile sequence (at most half the cap) is packed, 2 + 2 tiles of work in a slot of 4 + 2: 7 slots.
    p = plan_python([1000, 100, 300], [4, 4, 4], num_kv_heads=2, slots=16, mode="balanced")
    la = plan_python([1000, 100, 300], [4, 4, 4], num_kv_heads=2, slots=16, mode="length_aware")
    assert p.pieces() == la.pieces() and p.seq_part_start == la.seq_part_start
    assert p.work_order == [0, 1, 2, 3, 5, 6, 4] + [-1] * 4  # split sequences first, the single piece last
    # 130 tiles on a budget of 100: cap 2 tiles -> 65 pieces (length_aware stops at SEG_MAX = 64 -> 44 pieces)
    p = plan_python([130 * 64], [1], num_kv_heads=1, slots=100, mode="balanced")
    assert p.num_items == [65] and all(e - a == 128 for _, a, e in p.pieces())


def test_balanced_skewed_fills_the_wave():
    # One 248k request and 15 five-token ones, 264 slots: length_aware is stuck at SEG_MAX pieces for the long
    # one (61-tile pieces); balanced gives it the whole wave but the one slot that the 15 packed requests
    # share (15 x (1 + 2) tiles of work): 259 pieces of 15 tiles, 274 programs, the long one's first.
    lens, qs = [248_000] + [5] * 15, [4] * 16
    la = plan_python(lens, qs, num_kv_heads=1, slots=264, mode="length_aware")
    bal = plan_python(lens, qs, num_kv_heads=1, slots=264, mode="balanced")
    assert la.seq_part_start[1] == SEG_MAX and la.num_items == [SEG_MAX + 15]
    assert max(e - a for _, a, e in la.pieces()) == 61 * KV_TILE
    assert bal.seq_part_start[1] == 259 and bal.num_items == [274]
    assert max(e - a for _, a, e in bal.pieces()) == 15 * KV_TILE
    assert bal.work_order[:274] == list(range(274))


@pytest.mark.parametrize("long_at", [0, 31, 63])
def test_balanced_packs_short_sequences(long_at):
    # Issue 18: 1 x 256k among 63 x 512, q4, 264 slots. One slot per sequence gave the long one 201 slots
    # (200 pieces of 20 tiles) while 63 slots idled after 8 tiles. Packed (63 x (8 + 2) tiles of work =
    # 32 slots of 18 + 2): 223 pieces of 18 tiles, the cap of the uniform batch of the same tokens, and
    # the main grid runs them first wherever the long one sits in the batch.
    lens = [512] * 63
    lens.insert(long_at, 256_000)
    p = plan_python(lens, [4] * 64, num_kv_heads=1, slots=264, mode="balanced")
    by_seq = pieces_by_seq(p, 64)
    assert len(by_seq[long_at]) == 223 and {e - a for a, e in by_seq[long_at][:-1]} == {18 * KV_TILE}
    assert all(len(by_seq[b]) == 1 for b in by_seq if b != long_at)
    first = p.seq_part_start[long_at]
    assert p.work_order[:223] == list(range(first, first + 223))
    assert sorted(p.work_order[223:286]) == [w for w in range(286) if not first <= w < first + 223]
    uniform = plan_python([sum(lens) // 64] * 64, [4] * 64, num_kv_heads=1, slots=264, mode="balanced")
    assert max(e - a for _, a, e in uniform.pieces()) == 18 * KV_TILE and uniform.num_items == [256]


def test_empty_batch_and_all_empty():
    for mode in PLANNERS:
        p = plan_python([], [], num_kv_heads=1, slots=8, mode=mode)
        assert p.num_items == [0] and p.seq_part_start == [0] and p.work_seq == [-1] * 8
        p = plan_python([0, 7], [3, 0], num_kv_heads=1, slots=8, mode=mode)
        assert p.num_items == [0] and p.seq_part_start == [0, 0, 0]


# -- errors ----------------------------------------------------------------------------------------

def test_errors():
    with pytest.raises(ValueError, match=r"mode: got 'lean'; allowed: fixed, length_aware, balanced"):
        plan_python([1], [1], num_kv_heads=1, slots=8, mode="lean")
    with pytest.raises(ValueError, match=r"q_lens: got 1 entries for 2 seq_lens"):
        plan_python([1, 2], [1], num_kv_heads=1, slots=8, mode="fixed")
    with pytest.raises(ValueError, match=r"seq_lens\[1\]: got -3; must be an int >= 0"):
        plan_python([1, -3], [1, 1], num_kv_heads=1, slots=8, mode="fixed")
    with pytest.raises(ValueError, match=r"num_kv_heads: got 0; must be an int >= 1"):
        plan_python([1], [1], num_kv_heads=0, slots=8, mode="fixed")
    with pytest.raises(ValueError, match=r"slots: got 0; must be an int >= 1"):
        max_work_items(4, 1, 0)
    with pytest.raises(ValueError, match=r"batch: got -1; must be >= 0"):
        max_work_items(-1, 1, 8)


# -- invariants over random batches ----------------------------------------------------------------

def random_batch(rng):
    batch = rng.randint(1, 40)
    lens = []
    for _ in range(batch):
        kind = rng.random()
        if kind < 0.1:
            lens.append(0)
        elif kind < 0.4:
            lens.append(rng.randint(1, 300))
        elif kind < 0.9:
            lens.append(int(rng.lognormvariate(9.5, 1.2)))
        else:
            lens.append(rng.randint(100_000, 262_144))
    qs = [rng.choice([0, 1, 1, 2, 3, 4, 4, 8]) for _ in range(batch)]
    return lens, qs, rng.choice([1, 2, 4, 8]), rng.choice([16, 66, 132, 264, 528, 1056])


CASES = [random_batch(random.Random(seed)) for seed in range(300)]


def check_structure(p, lens, qs, hkv, slots):
    batch = len(lens)
    width = max_work_items(batch, hkv, slots)
    n = p.num_items[0]
    assert all(len(getattr(p, f)) == width for f in ("work_seq", "work_start", "work_end", "work_part", "work_order"))
    assert len(p.seq_part_start) == batch + 1 and p.seq_part_start[0] == 0 and p.seq_part_start[-1] == n
    assert p.work_seq[n:] == [-1] * (width - n) and p.work_part[n:] == [-1] * (width - n)
    assert p.work_part[:n] == list(range(n))
    assert sorted(p.work_order[:n]) == list(range(n)) and p.work_order[n:] == [-1] * (width - n)
    by_seq = pieces_by_seq(p, batch)
    for b in range(batch):
        rows = range(p.seq_part_start[b], p.seq_part_start[b + 1])
        assert [p.work_seq[w] for w in rows] == [b] * len(rows)  # contiguous rows
        got = by_seq[b]
        if lens[b] == 0 or qs[b] == 0:
            assert got == []
            continue
        # every KV position exactly once, in KV order, pieces on tile boundaries
        assert got[0][0] == 0 and got[-1][1] == lens[b]
        assert all(a < e and a % KV_TILE == 0 for a, e in got)
        assert all(got[i][1] == got[i + 1][0] for i in range(len(got) - 1))
    return by_seq


@pytest.mark.parametrize("mode", PLANNERS)
def test_invariants(mode):
    for lens, qs, hkv, slots in CASES:
        p = plan_python(lens, qs, num_kv_heads=hkv, slots=slots, mode=mode)
        check_structure(p, lens, qs, hkv, slots)


def tiles_of(a, e):
    return -(-(e - a) // KV_TILE)


def test_fixed_counts():
    for lens, qs, hkv, slots in CASES:
        p = plan_python(lens, qs, num_kv_heads=hkv, slots=slots, mode="fixed")
        nseg = 1
        while nseg * 2 <= min(SEG_MAX, slots // (len(lens) * hkv)):
            nseg *= 2
        for b, got in pieces_by_seq(p, len(lens)).items():
            if got:
                seg = -(-(-(-lens[b] // nseg)) // KV_TILE) * KV_TILE  # ceil(L/nseg) rounded up to the tile
                assert len(got) <= nseg and all(e - a == seg for a, e in got[:-1]) and got[-1][1] - got[-1][0] <= seg


def test_length_aware_is_the_smallest_feasible_segment():
    for lens, qs, hkv, slots in CASES:
        p = plan_python(lens, qs, num_kv_heads=hkv, slots=slots, mode="length_aware")
        by_seq = pieces_by_seq(p, len(lens))
        live = [lens[b] for b in by_seq if by_seq[b]]
        if not live:
            continue
        budget = max(slot_budget(hkv, slots), len(live))
        seg = max(e - a for got in by_seq.values() for a, e in got)
        assert seg % KV_TILE == 0 or seg == max(live)
        assert all(e - a == seg for got in by_seq.values() for a, e in got[:-1])  # one T for the batch
        assert p.num_items[0] <= budget and max(len(g) for g in by_seq.values()) <= SEG_MAX
        smaller = (-(-seg // KV_TILE) - 1) * KV_TILE
        if smaller:  # one tile less must break a constraint
            counts = [-(-L // smaller) for L in live]
            assert sum(counts) > budget or max(counts) > SEG_MAX


def slot_need(tiles, cap, o):
    """Slots of time cap + o a cap needs, written out: a sequence over cap/2 tiles holds one per piece,
    the others share slots, each taking its tiles plus the per-piece overhead o."""
    held = sum(-(-t // cap) for t in tiles if 2 * t > cap)
    packed = sum(t + o for t in tiles if 2 * t <= cap)
    return held + -(-packed // (cap + o))


def live_plans(mode, o):
    """For each CASES batch with a live sequence: (its plan, pieces by sequence, the live sequences, the slot
    budget, their tiles)."""
    for lens, qs, hkv, slots in CASES:
        p = plan_python(lens, qs, num_kv_heads=hkv, slots=slots, mode=mode, overhead=o)
        by_seq = pieces_by_seq(p, len(lens))
        live = [b for b in by_seq if by_seq[b]]
        if live:
            yield (lens, qs, hkv, slots), p, by_seq, live, max(slot_budget(hkv, slots), len(live)), \
                [-(-lens[b] // KV_TILE) for b in live]


@pytest.mark.parametrize("o", [PIECE_OVERHEAD_TILES, 8])  # the Triton kernel's overhead, the Hopper kernel's
def test_balanced_is_the_min_max_packed_wave_plan(o):
    for _, p, by_seq, live, budget, tiles in live_plans("balanced", o):
        cap = max(tiles_of(a, e) for b in live for a, e in by_seq[b])
        for b in live:  # whole cap-sized segments, the last one short
            assert all(tiles_of(a, e) == cap for a, e in by_seq[b][:-1])
        assert slot_need(tiles, cap, o) <= budget
        if cap > o:  # any smaller cap would not fit the wave's slot time (o is also the floor on the cap)
            assert slot_need(tiles, cap - 1, o) > budget
        # the one-wave cap (sum ceil(tiles / c) <= budget): never below balanced's, the same pieces when
        # no sequence is packed
        one_wave = max(_smallest_cap(tiles, budget, None), o)
        assert cap <= one_wave
        if all(2 * t > cap for t in tiles):
            assert [len(by_seq[b]) for b in live] == [-(-t // one_wave) for t in tiles]
        # launch order: the split sequences' pieces, then the single ones, each in row order
        split = [w for w in range(p.num_items[0]) if len(by_seq[p.work_seq[w]]) > 1]
        assert p.work_order[:p.num_items[0]] == split + [w for w in range(p.num_items[0]) if w not in split]


def slot_need_tails(tiles, cap, o):
    """slot_need with the last piece of every sequence packed when it is at most cap/2 tiles."""
    held = packed = 0
    for t in tiles:
        pieces = -(-t // cap)
        last = t - (pieces - 1) * cap
        held += pieces - (2 * last <= cap)
        packed += (last + o) if 2 * last <= cap else 0
    return held + -(-packed // (cap + o))


@pytest.mark.parametrize("o", [PIECE_OVERHEAD_TILES, 8])
def test_balanced_tails_is_the_min_max_packed_wave_plan(o):
    for (lens, qs, hkv, slots), p, by_seq, live, budget, tiles in live_plans("balanced_tails", o):
        # the cap the planner chose (one for the batch); below, checked to be the smallest that fits
        (cap,) = {seg for k, seg in plan_splits(lens, qs, num_kv_heads=hkv, slots=slots, mode="balanced_tails",
                                                  overhead=o) if k}
        for b in live:
            assert all(tiles_of(a, e) == cap for a, e in by_seq[b][:-1]) and tiles_of(*by_seq[b][-1]) <= cap
        assert slot_need_tails(tiles, cap, o) <= budget
        if cap > o:
            assert slot_need_tails(tiles, cap - 1, o) > budget
        # never a larger cap than balanced's, which fits this budget too (a packed last piece takes no more
        # slot time than a held one)
        assert cap <= max(seg for _, seg in plan_splits(lens, qs, num_kv_heads=hkv, slots=slots, mode="balanced",
                                                        overhead=o))
        # launch order: the pieces over half the cap, then the rest, each in row order
        n = p.num_items[0]
        held = [w for w in range(n) if 2 * tiles_of(p.work_start[w], p.work_end[w]) > cap]
        assert p.work_order[:n] == held + [w for w in range(n) if w not in held]


def test_balanced_tails_packs_equal_sequences_last_pieces_behind_the_full_ones():
    lens = [35_000] * 16  # 547 tiles: balanced's one-wave cap is 69 (8 pieces, 128 slots of 132)
    p = plan_python(lens, [4] * 16, num_kv_heads=1, slots=132, mode="balanced_tails", overhead=8)
    n = p.num_items[0]
    tiles = [tiles_of(s, e) for _, s, e in p.pieces()]
    assert n == 144 and max(tiles) == 68 and sorted(tiles).count(3) == 16
    assert [tiles[w] for w in p.work_order[:128]] == [68] * 128  # the full pieces launch first
    assert slot_need_tails([547] * 16, 68, 8) == 131 and slot_need_tails([547] * 16, 67, 8) == 133
    base = plan_python(lens, [4] * 16, num_kv_heads=1, slots=132, mode="balanced", overhead=8)
    assert base.num_items[0] == 128 and max(tiles_of(s, e) for _, s, e in base.pieces()) == 69


@pytest.mark.parametrize("o", [PIECE_OVERHEAD_TILES, 8])
def test_balanced_auto_takes_the_packed_tails_where_their_gain_beats_their_cost(o):
    from vattn.planner import TAILS_MIN_GAIN_PCT

    rng = random.Random(o)
    took = {"balanced": 0, "balanced_tails": 0}
    for _ in range(80):
        hkv, slots = rng.choice([1, 2, 8]), rng.choice([132, 264])
        if rng.random() < 0.5:  # equal sequences, whose tails are near break-even (16x35k's)
            batch = rng.randint(1, 40)
            lens = [rng.randint(1_000, 150_000)] * batch
        else:
            batch = rng.randint(1, 2 * slot_budget(hkv, slots))
            lens = [rng.choice([rng.randint(1, 300_000), rng.randint(1, 3_000)]) for _ in range(batch)]
        qs = [0 if rng.random() < 0.1 else 4 for _ in range(batch)]
        kw = dict(num_kv_heads=hkv, slots=slots, overhead=o)
        plain, packed = (plan_splits(lens, qs, mode=m, **kw) for m in ("balanced", "balanced_tails"))
        if not any(k for k, _ in plain):
            continue
        (cap, n), (tails_cap, tails_n) = ((max(s for _, s in p), sum(k for k, _ in p)) for p in (plain, packed))
        gain_pct, cost_pct = 100 * (cap - tails_cap) / cap, 100 * (tails_n - n) * o / sum(kv_tiles(lens, qs))
        want = "balanced_tails" if gain_pct >= cost_pct + TAILS_MIN_GAIN_PCT - 1e-9 else "balanced"
        took[want] += 1
        assert plan_python(lens, qs, mode="balanced_auto", **kw) == plan_python(lens, qs, mode=want, **kw), (
            lens, qs, hkv, slots)
    assert min(took.values()) >= 10, took  # the cases reach both sides of the rule


def test_balanced_auto_keeps_16x35k_balanced_and_packs_16x70k_tails_on_the_hopper_kernel():
    kw = dict(num_kv_heads=1, slots=132, overhead=8)  # an H200's SMs, the Hopper kernel's piece overhead
    for kv_len, want in ((35_000, "balanced"), (70_000, "balanced_tails")):
        lens = [kv_len] * 16
        got = plan_python(lens, [4] * 16, mode="balanced_auto", **kw)
        assert got == plan_python(lens, [4] * 16, mode=want, **kw)
        assert got != plan_python(lens, [4] * 16, mode={"balanced": "balanced_tails"}.get(want, "balanced"), **kw)


def test_balanced_tails_need_is_non_increasing_in_the_cap():
    # the GPU's k-ary search relies on it
    from vattn.planner import _slot_need_tails

    rng = random.Random(0)
    for _ in range(20):
        tiles = [rng.choice([rng.randint(1, 40), rng.randint(1, 2_000)]) for _ in range(rng.randint(1, 64))]
        o = rng.choice([PIECE_OVERHEAD_TILES, 8])
        needs = [_slot_need_tails(tiles, c, o) for c in range(1, 2_100)]
        assert all(a >= b for a, b in zip(needs, needs[1:])), tiles
        assert needs == [slot_need_tails(tiles, c, o) for c in range(1, 2_100)]


def test_planner_makespans_ordered():
    # Largest piece (tiles): balanced <= length_aware <= fixed, whenever the batch fits one wave.
    for lens, qs, hkv, slots in CASES:
        big = {m: max([tiles_of(a, e) for _, a, e in
                       plan_python(lens, qs, num_kv_heads=hkv, slots=slots, mode=m).pieces()] or [0])
               for m in PLANNERS}
        if len(lens) <= slot_budget(hkv, slots):
            assert big["length_aware"] <= big["fixed"]
        assert big["balanced"] <= max(big["length_aware"], MIN_PIECE_TILES)


def test_width_depends_only_on_shape():
    assert max_work_items(16, 1, 264) == 264 + 16
    assert max_work_items(16, 8, 264) == 33 + 16
    assert max_work_items(64, 8, 264) == 64 + 64
    assert max_work_items(0, 1, 1) == 1


def test_fixed_and_length_aware_launch_in_row_order():
    for lens, qs, hkv, slots in CASES[:50]:
        for mode in ("fixed", "length_aware"):
            p = plan_python(lens, qs, num_kv_heads=hkv, slots=slots, mode=mode)
            assert p.work_order[:p.num_items[0]] == list(range(p.num_items[0]))


# -- the Triton twin: same plans, one launch, no host sync ------------------------------------------

def run_gpu(lens, qs, hkv, slots, mode, device="cpu", overhead=PIECE_OVERHEAD_TILES):
    import itertools

    import torch

    from vattn.planner import WORK_FIELDS, plan_gpu

    width = max_work_items(len(lens), hkv, slots)
    out = {f: torch.full((width,), 77, dtype=torch.int32, device=device) for f in WORK_FIELDS}
    out["seq_part_start"] = torch.full((len(lens) + 1,), 77, dtype=torch.int32, device=device)
    out["num_items"] = torch.full((1,), 77, dtype=torch.int32, device=device)
    cu = torch.tensor([0] + list(itertools.accumulate(qs)), dtype=torch.int32, device=device)
    plan_gpu(torch.tensor(lens, dtype=torch.int32, device=device), cu, num_kv_heads=hkv, slots=slots, mode=mode,
             out=out, overhead=overhead)
    return {f: t.tolist() for f, t in out.items()}


GPU_EDGE_CASES = [
    ([1000, 100, 0, 5], [1, 4, 2, 0], 1, 16),  # hand-worked fixed case: L = 0, q_len = 0
    ([1000, 100, 300], [4, 4, 4], 2, 16),
    ([130 * 64], [1], 1, 1000),  # SEG_MAX binds for length_aware
    ([248_000] + [5] * 15, [4] * 16, 1, 264),  # the skewed batch
    ([], [], 1, 8),
    ([0, 7], [3, 0], 4, 264),
    ([64, 65, 63, 1], [1, 1, 1, 1], 8, 8),  # B * Hkv > SLOTS
]
# Cases that stress the GPU's k-ary cap search and its item-to-sequence lookup.
_rng = random.Random(11)
GPU_SEARCH_CASES = [
    ([262_144] + [3] * 31, [4] * 32, 1, 264),  # one 256k request + many tiny ones
    ([512] * 40 + [256_000] + [512] * 23, [4] * 64, 1, 264),  # issue 18's long among short: packed, reordered
    ([256_000] + [16] * 63, [1] * 64, 2, 264), ([16] * 63 + [256_000], [4] * 64, 1, 132),
    ([100_000, 300, 90_000, 0, 700, 5] * 6, [4, 1, 2, 3, 0, 4] * 6, 1, 264),  # two groups interleaved
    ([35_000] * 16, [4] * 16, 1, 264),  # all lengths equal
    ([5000], [1], 1, 264), ([262_144], [4], 1, 264), ([1], [1], 1, 1),  # B = 1
    ([0, 0, 0], [1, 2, 0], 1, 264), ([9, 9], [0, 0], 2, 264),  # all empty
    ([1000] * 40, [1] * 40, 8, 264),  # budget (33) <= live count (40)
    ([64, 100, 20, 129], [1] * 4, 1, 264),  # one-tile caps: balanced hits its MIN_PIECE_TILES floor
    ([2_000_000_000, 5, 0, 70_000], [1, 2, 3, 1], 1, 132),  # a span of ~2^25 tiles to search
    ([_rng.choice([0, _rng.randint(1, 300_000), _rng.randint(1, 300)]) for _ in range(300)],
     [_rng.randint(0, 4) for _ in range(300)], 8, 528),  # B = 300, Hkv 8 (B > SLOTS / Hkv)
    ([_rng.randint(1, 500_000) for _ in range(37)], [1] * 37, 2, 1056),  # B not a power of two
    # balanced_auto on either side of its rule at the Hopper overhead (8): 16x52k's tails gain 1.96% for a cost
    # of 0.96%, just under the margin; 16x55k's gain 2.8% for 0.9%
    ([52_000] * 16, [4] * 16, 1, 132), ([55_000] * 16, [4] * 16, 1, 132),
]


INTERPRETER_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_planner import CASES, GPU_EDGE_CASES, GPU_SEARCH_CASES, run_gpu
from vattn.planner import BALANCED, PLANNERS
cases = GPU_EDGE_CASES + GPU_SEARCH_CASES + CASES[:6]
out = {m: [run_gpu(*case, m) for case in cases] for m in PLANNERS}
for m in BALANCED:
    out[f"{m}-o8"] = [run_gpu(*case, m, overhead=8) for case in cases]
print(json.dumps(out))
"""


def test_plan_gpu_equals_python_under_interpreter():
    # In a fresh process: TRITON_INTERPRET must be set before triton is first imported (its own helpers,
    # e.g. the scan behind tl.cumsum, are wrapped at import), and this session may have imported it.
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", INTERPRETER_SCRIPT, str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    for mode, overhead in [(m, PIECE_OVERHEAD_TILES) for m in PLANNERS] + [(m, 8) for m in BALANCED]:
        key = mode if overhead == PIECE_OVERHEAD_TILES else f"{mode}-o{overhead}"
        for case, plan in zip(GPU_EDGE_CASES + GPU_SEARCH_CASES + CASES[:6], got[key]):
            lens, qs, hkv, slots = case
            want = plan_python(lens, qs, num_kv_heads=hkv, slots=slots, mode=mode, overhead=overhead)
            assert plan == want.__dict__, (key, case)


def test_plan_gpu_checks_its_arguments():
    torch = pytest.importorskip("torch")
    from vattn.planner import WORK_FIELDS, plan_gpu

    lens, cu = torch.tensor([5, 6], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"seq_lens: got torch.int64 \(2,\); expected contiguous int32 \[B\]"):
        plan_gpu(lens.long(), cu, num_kv_heads=1, slots=8, mode="fixed", out={})
    with pytest.raises(ValueError, match=r"cu_seqlens_q: got torch.int32 \(2,\) on cpu; expected contiguous int32 \[3\]"):
        plan_gpu(lens, cu[:2], num_kv_heads=1, slots=8, mode="fixed", out={})
    with pytest.raises(ValueError, match=r"out: got \[\]; expected a dict with keys work_seq, work_start"):
        plan_gpu(lens, cu, num_kv_heads=1, slots=8, mode="fixed", out={})
    out = {f: torch.zeros(10, dtype=torch.int32) for f in WORK_FIELDS}
    out.update(seq_part_start=torch.zeros(3, dtype=torch.int32), num_items=torch.zeros(1, dtype=torch.int32))
    out["work_end"] = torch.zeros(7, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"out\['work_end'\]: got torch.int32 \(7,\) on cpu; expected contiguous "
                                         r"int32 \(10,\) on cpu \(W = max_work_items\(B=2, ...\) = 10\)"):
        plan_gpu(lens, cu, num_kv_heads=1, slots=8, mode="fixed", out=out)
    with pytest.raises(ValueError, match=r"mode: got 'lean'"):
        plan_gpu(lens, cu, num_kv_heads=1, slots=8, mode="lean", out=out)


def cuda_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode, overhead", [(m, PIECE_OVERHEAD_TILES) for m in PLANNERS] + [(m, 8) for m in BALANCED])
def test_plan_gpu_equals_python_on_cuda(mode, overhead):
    rng = random.Random(7)
    cases = GPU_EDGE_CASES + GPU_SEARCH_CASES + CASES
    for _ in range(40):  # larger batches than the CPU cases: B up to 256, L up to 2M
        batch = rng.randint(41, 256)
        cases.append(([rng.choice([0, rng.randint(1, 2_000_000), rng.randint(1, 5000)]) for _ in range(batch)],
                      [rng.randint(0, 8) for _ in range(batch)], rng.choice([1, 2, 8]), rng.choice([132, 264, 528])))
    for lens, qs, hkv, slots in cases:
        want = plan_python(lens, qs, num_kv_heads=hkv, slots=slots, mode=mode, overhead=overhead)
        assert run_gpu(lens, qs, hkv, slots, mode, device="cuda", overhead=overhead) == want.__dict__, (
            lens, qs, hkv, slots)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", PLANNERS)
def test_plan_gpu_replays_in_a_cuda_graph(mode):
    import itertools

    import torch

    from vattn.planner import WORK_FIELDS, plan_gpu

    batch, hkv, slots = 20, 1, 264
    width = max_work_items(batch, hkv, slots)
    out = {f: torch.zeros(width, dtype=torch.int32, device="cuda") for f in WORK_FIELDS}
    out["seq_part_start"] = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    out["num_items"] = torch.zeros(1, dtype=torch.int32, device="cuda")
    lens = torch.full((batch,), 1000, dtype=torch.int32, device="cuda")
    cu = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * 4
    plan_gpu(lens, cu, num_kv_heads=hkv, slots=slots, mode=mode, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan_gpu(lens, cu, num_kv_heads=hkv, slots=slots, mode=mode, out=out)
    rng = random.Random(3)
    for _ in range(5):  # new lengths written in place, then replay: the plan follows
        new_lens = [248_000] + [rng.choice([0, rng.randint(1, 150_000)]) for _ in range(batch - 1)]
        new_qs = [rng.randint(0, 4) for _ in range(batch)]
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        cu.copy_(torch.tensor([0] + list(itertools.accumulate(new_qs)), dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want = plan_python(new_lens, new_qs, num_kv_heads=hkv, slots=slots, mode=mode)
        assert {f: t.tolist() for f, t in out.items()} == want.__dict__
