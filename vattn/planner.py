"""Split planners: cut each sequence's KV range into pieces, one program per (piece, KV head).

A plan is a fixed-size work list, W = max_work_items(B, Hkv, SLOTS):

    work_seq[W]          sequence of item w; -1 = idle item (padding past the real items)
    work_start[W]        first KV position of the piece (a multiple of KV_TILE)
    work_end[W]          one past its last KV position (min(L, tile boundary))
    work_part[W]         partial row of item w (== w for real items, -1 for idle)
    seq_part_start[B+1]  pieces of sequence b are rows seq_part_start[b] .. seq_part_start[b+1]-1,
                         contiguous and in KV order
    num_items[1]         number of real items
    work_order[W]        launch order: program w of the main grid runs item work_order[w]; -1 past
                         num_items. fixed, length_aware: w itself. balanced: the pieces of split
                         sequences (k >= 2) first, then the single pieces, each group in row order.
                         balanced_tails: the held pieces (over half the cap) first, then the packed ones;
                         balanced_auto: as the rule it took (balanced's or balanced_tails')

Every planner first reduces a sequence to (pieces k, segment tiles s): piece p covers KV positions
p*s*KV_TILE .. min(L, (p+1)*s*KV_TILE) (whole segments, the last one short). A sequence with L = 0 or
q_len = 0 gets k = 0.

balanced is the min-max plan of one wave of slot time: the smallest piece cap c (>= o, no per-sequence
cap) whose pieces fit SLOTS/Hkv slots, each slot busy for one piece's time c + o (o: a piece's fixed
cost in tiles on the kernel that runs the plan, `overhead`; PIECE_OVERHEAD_TILES for the Triton kernel,
a backend's own otherwise): a sequence of more than c/2 tiles holds one slot per piece (ceil(tiles/c));
the sequences of at most c/2 tiles (one piece each) are packed end to end, tiles + o each, into slots
of c + o. Packed, the short sequences of a batch take the slot time they use instead of a slot each:
1 x 256k + 63 x 512 at 264 slots had the long request in 200 pieces of 20 tiles while 63 slots idled
after 8 tiles (issue 18); packed it gets 223 pieces of 18, as a uniform batch of the same tokens does.
Packing launches more programs than slots, so the main grid runs the split sequences' pieces first
(work_order): the short ones fill the slots left over, and those that free up, behind them. Every
one-wave plan fits this budget, so the cap is never above the one-wave cap (sum ceil(tiles/c) <=
SLOTS/Hkv), and equals it when no sequence is at most half the cap. Without packed sequences balanced
equals length_aware whenever SEG_MAX does not bind, and beats it when one long request would need
more than SEG_MAX pieces.

balanced_tails is balanced with the last piece of a split sequence packed as a short sequence is, when it
is at most c/2 tiles: balanced gives every piece a slot of its one wave, so a batch of equal sequences
leaves slots idle and its largest piece is the one-wave cap (16 x 35k at 132 slots: 8 pieces of 69
tiles on 128 slots). With the short last pieces packed a smaller cap fits (8 pieces of 68 and a 3-tile
tail each, the 16 tails on the 4 spare slots behind the full pieces); the launch order runs every piece
over half the cap first. On an H200 (benchmarks/NOTES.md P114) its layers ran 0.7-5% faster in a burst
on every batch whose plan it changes, on both kernels, but 16x119k ran 0.7% slower under sustained load
(more programs, each with its fixed cost, where energy sets the time): opt-in, not the default.

balanced_auto makes both plans and keeps balanced_tails' where what it gains beats what it costs by
TAILS_MIN_GAIN_PCT: it gains the cap's drop (c - c') / c, the slowest slot's time, and costs its extra pieces'
fixed costs against the batch's work, (n' - n) * o / sum(tiles), which under the board's power cap is time too.
On an H200 under sustained load (benchmarks/NOTES.md P117; o = 8) the packed tails ran 0.9% slower on 16x35k
(gain 1.4%, cost 1.5%) and 0.6-2.9% faster on 16x70k, 16x119k and both agentic batches (gain less cost 1.5-4.5%);
the margin sits between them. On held-out batches on an H100 (P118) three of the six it packs ran 0.5-1.1% slower
in every round: the slowest slot's drop does not predict the time gained, so it stays opt-in.

Why not stream-K chunks laid end to end: here one program runs one piece of one sequence, so C chunks cut at sequence
boundaries make up to C + B - 1 programs, past one wave; within one wave no plan of in-sequence
pieces has a smaller largest piece than the one-wave cap. (A Hopper build whose CTAs ran runs of stream-K
items was 19-23% slower on the H200: benchmarks/NOTES.md P29, P30.) An even split inside each sequence was tried and
dropped: the cost model (processor sharing) ran it ~1% slower on the agentic batches, because
pieces of unequal size across sequences leave a tail of few programs.

Bounds (they define W = max(B, SLOTS/Hkv) + B): fixed gives <= B * nseg <= max(B, SLOTS/Hkv) pieces;
length_aware <= max(n_nonempty, SLOTS/Hkv); the balanced planners <= max(n_nonempty, SLOTS/Hkv) +
n_packed (a slot holds one held piece or several packed ones; a sequence has at most one packed piece).
balanced has no per-sequence cap: one long sequence may get up to SLOTS/Hkv pieces, so the reduce must
loop over a sequence's rows (not assume <= 64).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

# The planner names, everywhere (API, cost model, switch, bench). Their order is the plan kernel's MODE id.
PLANNERS = ("fixed", "length_aware", "balanced", "balanced_tails", "balanced_auto")
DEFAULT_PLANNER = "balanced"
BALANCED = ("balanced", "balanced_tails", "balanced_auto")  # the planners that pack (`overhead` weighs in)
# what balanced_auto's packed tails must gain beyond their cost, in percent of the balanced plan's time (module
# docstring)
TAILS_MIN_GAIN_PCT = 1
KV_TILE = 64  # tokens per KV tile: every piece starts on a tile boundary
SEG_MAX = 64  # most pieces per sequence for fixed and length_aware (the MI355X reference's cap)
# A piece's fixed cost in KV-tile equivalents on the Triton kernel: loading Q and writing the fp32 partial
# (QROWS x D x 4 bytes = 64 KB at q4 x GQA16 x hd256, two 32 KB fp8 K+V tiles' worth). A backend whose
# kernel pays more per piece names its own (vattn.backends.Backend.piece_overhead_tiles); balanced takes it
# as `overhead`.
PIECE_OVERHEAD_TILES = 2
# balanced's floor on its piece cap: a piece reads at least as much KV as its overhead costs (the overhead
# itself; this is its value for the default). Without it a lone 16k request would become 250 one-tile
# pieces, each writing a 64 KB partial for 32 KB of KV.
MIN_PIECE_TILES = PIECE_OVERHEAD_TILES

FIELDS = ("work_seq", "work_start", "work_end", "work_part", "seq_part_start", "num_items", "work_order")
WORK_FIELDS = ("work_seq", "work_start", "work_end", "work_part", "work_order")  # the [W] ones


@dataclass(frozen=True)
class PlanLists:
    """The plan as Python lists, padded to W (the pure-Python twin of plan_gpu's tensors)."""

    work_seq: list[int]
    work_start: list[int]
    work_end: list[int]
    work_part: list[int]
    seq_part_start: list[int]
    num_items: list[int]
    work_order: list[int]

    def pieces(self) -> list[tuple[int, int]]:
        """The real items as (seq, start, end), in work-list order."""
        n = self.num_items[0]
        return list(zip(self.work_seq[:n], self.work_start[:n], self.work_end[:n]))


def slot_budget(num_kv_heads: int, slots: int) -> int:
    """Pieces that fit one wave: each piece runs as Hkv programs."""
    return max(1, slots // num_kv_heads)


def max_work_items(batch: int, num_kv_heads: int, slots: int) -> int:
    """W: the work-list length for a batch size, the same for every planner and every layer
    (balanced's bound: one wave of slots or one piece per sequence, plus a packed piece per sequence)."""
    _check_positive(num_kv_heads=num_kv_heads, slots=slots)
    if batch < 0:
        raise ValueError(f"batch: got {batch}; must be >= 0")
    return max(1, batch, slot_budget(num_kv_heads, slots)) + batch


def _check_positive(**kwargs: int) -> None:
    for name, value in kwargs.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: got {value!r}; must be an int >= 1")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2floor(x: int) -> int:
    return 1 << (x.bit_length() - 1) if x >= 1 else 1


def _smallest(lo: int, hi: int, ok) -> int:
    """Smallest x in [lo, hi] with ok(x), ok monotone and ok(hi) true (the GPU twin: same bracket, k-ary search)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return hi


def _split_fixed(tiles: list[int], num_kv_heads: int, slots: int, overhead: int) -> list[tuple[int, int]]:
    nseg = max(1, min(SEG_MAX, _pow2floor(slots // (len(tiles) * num_kv_heads))))
    out = []
    for t in tiles:
        seg = _cdiv(t, nseg)  # ceil(L / nseg) rounded up to the tile, in tiles
        out.append((_cdiv(t, seg), seg) if t else (0, 0))
    return out


def _smallest_cap(live: list[int], budget: int, per_seq_max: int | None) -> int:
    """Smallest cap c (tiles) with sum ceil(t/c) <= budget (and ceil(max t / c) <= per_seq_max).

    Bracketed first so the bisection takes a few steps: sum ceil(t/c) >= sum(t)/c gives the lower end, and
    sum ceil(t/c) <= sum(t)/c + n gives a feasible upper end when budget > n.
    """
    total, longest, n = sum(live), max(live), len(live)
    lo = max(1, _cdiv(total, budget))
    hi = longest if budget <= n else min(longest, max(lo, _cdiv(total, budget - n)))
    if per_seq_max is not None:
        lo = max(lo, _cdiv(longest, per_seq_max))
        hi = max(hi, lo)
    return _smallest(lo, hi, lambda c: sum([-(-t // c) for t in live]) <= budget)  # hot: the cost model


def _split_length_aware(tiles: list[int], num_kv_heads: int, slots: int, overhead: int) -> list[tuple[int, int]]:
    live = [t for t in tiles if t]
    if not live:
        return [(0, 0)] * len(tiles)
    budget = max(slot_budget(num_kv_heads, slots), len(live))
    seg = _smallest_cap(live, budget, SEG_MAX)  # ceil(L / (seg*KV_TILE)) == ceil(tiles / seg)
    return [(_cdiv(t, seg), seg) if t else (0, 0) for t in tiles]


def _slot_need(live: list[int], cap: int, o: int) -> int:
    """Slots of time cap + o that a cap needs (module docstring): one per piece of a sequence over cap/2
    tiles; the rest packed, tiles + o each. Non-increasing in cap, which the search relies on."""
    held = sum([-(-t // cap) for t in live if 2 * t > cap])
    packed = sum([t + o for t in live if 2 * t <= cap])
    return held - (-packed // (cap + o))


def held(tiles: int, cap: int) -> bool:
    """Whether a piece of `tiles` holds a slot of its own under cap (more than half of it) rather than being
    packed: the rule of the balanced planners' slot budget and launch order (the cost model's too)."""
    return 2 * tiles > cap


def _last_piece(t: int, cap: int) -> int:
    """Tiles of the last piece of a sequence of t tiles cut at cap."""
    return t - (-(-t // cap) - 1) * cap


def _slot_need_tails(live: list[int], cap: int, o: int) -> int:
    """_slot_need with the last piece of every sequence packed when it is at most cap/2 tiles (a short
    sequence is its own last piece). Non-increasing in cap as well: a last piece moves from held to packed
    as the cap grows, and where the piece count drops the new last piece is held."""
    held = packed = 0
    for t in live:
        last = _last_piece(t, cap)
        small = 2 * last <= cap
        held += -(-t // cap) - small
        packed += (last + o) * small
    return held - (-packed // (cap + o))


def _split_balanced(tiles: list[int], num_kv_heads: int, slots: int, overhead: int,
                    need=_slot_need) -> list[tuple[int, int]]:
    live = [t for t in tiles if t]
    if not live:
        return [(0, 0)] * len(tiles)
    budget = max(slot_budget(num_kv_heads, slots), len(live))
    # _smallest_cap's bracket: its upper end fits one wave, so it fits the packed budget too; the lower
    # end drops by o, since a slot now holds c + o tiles of work (need(c) >= total / (c + o)).
    total, longest, n = sum(live), max(live), len(live)
    lo = max(1, _cdiv(total, budget) - overhead)
    hi = longest if budget <= n else min(longest, max(_cdiv(total, budget), _cdiv(total, budget - n)))
    cap = max(_smallest(lo, max(hi, lo), lambda c: need(live, c, overhead) <= budget), overhead)
    return [(_cdiv(t, cap), cap) if t else (0, 0) for t in tiles]


def _split_balanced_tails(tiles: list[int], num_kv_heads: int, slots: int, overhead: int) -> list[tuple[int, int]]:
    return _split_balanced(tiles, num_kv_heads, slots, overhead, need=_slot_need_tails)


def tails_pay(total: int, cap: int, pieces: int, tails_cap: int, tails_pieces: int, overhead: int) -> bool:
    """balanced_auto's rule: the packed tails' plan (tails_cap, tails_pieces) against balanced's (cap, pieces)
    on `total` tiles, in integers as the plan kernel has it: 100 (c - c') / c >= 100 (n' - n) o / total + margin."""
    return 100 * (cap - tails_cap) * total >= cap * (100 * (tails_pieces - pieces) * overhead
                                                      + TAILS_MIN_GAIN_PCT * total)


def _balanced_plans(tiles: list[int], num_kv_heads: int, slots: int, overhead: int):
    """balanced's splits, balanced_tails', and whether balanced_auto takes the latter."""
    plain = _split_balanced(tiles, num_kv_heads, slots, overhead)
    packed = _split_balanced_tails(tiles, num_kv_heads, slots, overhead)
    cap, tails_cap = (max(seg for _, seg in splits) for splits in (plain, packed))
    pay = tails_pay(sum(tiles), cap, sum(k for k, _ in plain), tails_cap, sum(k for k, _ in packed), overhead)
    return plain, packed, pay


# (tiles, num_kv_heads, slots, overhead) -> per sequence (pieces, segment tiles); only the balanced ones weigh overhead
_SPLITTERS = {"fixed": _split_fixed, "length_aware": _split_length_aware, "balanced": _split_balanced,
              "balanced_tails": _split_balanced_tails}


def _splits_and_tails(tiles: list[int], mode: str, num_kv_heads: int, slots: int,
                      overhead: int) -> tuple[list[tuple[int, int]], bool]:
    """The mode's splits, and whether they pack the split sequences' short last pieces (always for balanced_tails,
    for balanced_auto where tails_pay): the launch order's rule."""
    if mode != "balanced_auto":
        return _SPLITTERS[mode](tiles, num_kv_heads, slots, overhead), mode == "balanced_tails"
    if not any(tiles):
        return [(0, 0)] * len(tiles), False
    plain, packed, pay = _balanced_plans(tiles, num_kv_heads, slots, overhead)
    return (packed if pay else plain), pay


def packs_tails(mode: str, tiles: list[int], num_kv_heads: int, slots: int, overhead: int) -> bool:
    """Whether the plan of `tiles` (per sequence, 0 = absent) packs the split sequences' short last pieces."""
    return _splits_and_tails(tiles, mode, num_kv_heads, slots, overhead)[1]


def _check_lens(seq_lens: list[int], q_lens: list[int]) -> None:
    if len(seq_lens) != len(q_lens):
        raise ValueError(f"q_lens: got {len(q_lens)} entries for {len(seq_lens)} seq_lens; need one per sequence")
    for name, vals in (("seq_lens", seq_lens), ("q_lens", q_lens)):
        if set(map(type, vals)) <= {int} and min(vals, default=0) >= 0:
            continue  # the common case, checked at C speed (the cost model plans every decode cycle)
        for i, v in enumerate(vals):
            if int(v) != v or v < 0:
                raise ValueError(f"{name}[{i}]: got {v!r}; must be an int >= 0")


def plan_splits(seq_lens: list[int], q_lens: list[int], *, num_kv_heads: int, slots: int, mode: str,
                overhead: int = PIECE_OVERHEAD_TILES) -> list[tuple[int, int]]:
    """Per sequence (pieces k, segment tiles s): piece p covers KV p*s*KV_TILE .. min(L, (p+1)*s*KV_TILE).
    overhead: a piece's fixed cost in tiles on the kernel that will run the plan (balanced only)."""
    return plan_splits_and_tails(seq_lens, q_lens, num_kv_heads=num_kv_heads, slots=slots, mode=mode,
                                 overhead=overhead)[0]


def plan_splits_and_tails(seq_lens: list[int], q_lens: list[int], *, num_kv_heads: int, slots: int, mode: str,
                          overhead: int = PIECE_OVERHEAD_TILES) -> tuple[list[tuple[int, int]], bool]:
    """plan_splits' splits, and whether they pack the split sequences' short last pieces (packs_tails)."""
    if mode not in PLANNERS:
        raise ValueError(f"mode: got {mode!r}; allowed: {', '.join(PLANNERS)}")
    _check_positive(num_kv_heads=num_kv_heads, slots=slots, overhead=overhead)
    _check_lens(seq_lens, q_lens)
    tiles = kv_tiles(seq_lens, q_lens)
    return _splits_and_tails(tiles, mode, num_kv_heads, slots, overhead) if tiles else ([], False)


def kv_tiles(seq_lens: list[int], q_lens: list[int]) -> list[int]:
    """KV tiles per sequence as the planners see them: 0 for a sequence without query tokens."""
    return [_cdiv(int(L), KV_TILE) if q else 0 for L, q in zip(seq_lens, q_lens)]


def plan_python(seq_lens: list[int], q_lens: list[int], *, num_kv_heads: int, slots: int, mode: str,
                overhead: int = PIECE_OVERHEAD_TILES) -> PlanLists:
    """Pure-Python planner, the oracle for plan_gpu and the input of the cost model.

    seq_lens[b]: KV length L incl. the new tokens; q_lens[b]: query tokens (0 = absent from this call).
    overhead: as plan_splits'.
    """
    splits, tails = plan_splits_and_tails(seq_lens, q_lens, num_kv_heads=num_kv_heads, slots=slots, mode=mode,
                                          overhead=overhead)
    width = max_work_items(len(seq_lens), num_kv_heads, slots)
    seq, start, end, part_start = [], [], [], [0]
    for b, (k, seg) in enumerate(splits):
        for p in range(k):
            seq.append(b)
            start.append(p * seg * KV_TILE)
            end.append(min(int(seq_lens[b]), (p + 1) * seg * KV_TILE))
        part_start.append(len(seq))
    n = len(seq)
    assert n <= width, f"planner {mode} made {n} pieces > W={width}"  # the bounds in the module docstring
    order = list(range(n))
    if mode in BALANCED and not tails:  # split sequences' pieces first; the packed single pieces run behind them
        order = [w for w in order if splits[seq[w]][0] > 1] + [w for w in order if splits[seq[w]][0] == 1]
    elif tails:  # the held pieces first; the packed ones run behind them
        first = [held(_cdiv(end[w] - start[w], KV_TILE), splits[seq[w]][1]) for w in order]
        order = [w for w in order if first[w]] + [w for w in order if not first[w]]
    pad = width - n
    return PlanLists(
        work_seq=seq + [-1] * pad,
        work_start=start + [0] * pad,
        work_end=end + [0] * pad,
        work_part=list(range(n)) + [-1] * pad,
        seq_part_start=part_start,
        num_items=[n],
        work_order=order + [-1] * pad,
    )


# -- GPU planners: one single-program Triton launch, fixed-size outputs, no host sync ---------------
# The kernel body names `tl`, bound in this module's globals at first use: importing vattn.planner (the
# cost model, the emulator) must not import triton. Its `tl.constexpr` annotations stay unevaluated
# strings (from __future__ import annotations), which triton.jit reads as constexpr. Built per interpreter mode, since triton.jit
# decides between compiling and interpreting when it wraps the function.

_MODE_IDS = {mode: i for i, mode in enumerate(PLANNERS)}


def _plan_kernel_body(seq_lens, cu_seqlens_q, work_seq, work_start, work_end, work_part, seq_part_start,
                      num_items, work_order, batch, width, budget, nseg,
                      MODE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_W: tl.constexpr, NCAND: tl.constexpr,
                      TILE: tl.constexpr, SEG_CAP: tl.constexpr, MIN_CAP: tl.constexpr, OVERHEAD: tl.constexpr,
                      MIN_GAIN_PCT: tl.constexpr, LET_NEXT_LAUNCH: tl.constexpr = False):
    # seq_lens: [B] int32; cu_seqlens_q: [B+1] int32; work_*: [W] int32; seq_part_start: [B+1]; num_items: [1]
    if LET_NEXT_LAUNCH:  # a main kernel launched as its programmatic dependent (vattn's Hopper kernel) starts its
        # prologue now and waits for this kernel's end before it reads the plan (a no-op for any other next kernel)
        gdc_launch_dependents()
    # One program, latency-bound: its time is the instruction count of its serial path. The 2-D tiles put
    # the batch on axis 0 and reduce over it, which Triton's default layout keeps inside each thread (the
    # other axis runs across lanes): a reduction is one add or max a value, not a warp reduction a row.
    offs = tl.arange(0, BLOCK_B)
    in_b = offs < batch
    seq_len = tl.load(seq_lens + offs, mask=in_b, other=0)
    q_len = tl.load(cu_seqlens_q + offs + 1, mask=in_b, other=0) - tl.load(cu_seqlens_q + offs, mask=in_b, other=0)
    tiles = tl.where(q_len > 0, (seq_len + TILE - 1) // TILE, 0)
    # -- segment length (tiles) of every sequence --
    if MODE == 0:  # fixed: nseg segments per sequence (nseg depends on the shape only, computed on the host)
        seg = (tiles + nseg - 1) // nseg
        tails = False
    else:  # length_aware / balanced: the smallest cap that fits the budget (_smallest_cap's bracket)
        # (balanced: _split_balanced's, whose lower end is OVERHEAD below)
        live = tl.sum((tiles > 0).to(tl.int32), 0)
        total = tl.sum(tiles, 0)
        longest = tl.max(tiles, 0)
        cap_budget = tl.maximum(live, budget)
        lo = tl.maximum((total + cap_budget - 1) // cap_budget, 1)
        slack = tl.maximum(cap_budget - live, 1)  # only read when cap_budget > live
        hi = tl.where(cap_budget <= live, longest,
                      tl.minimum(longest, tl.maximum(lo, (total + slack - 1) // slack)))
        if MODE == 1:
            lo = tl.maximum(lo, (longest + SEG_CAP - 1) // SEG_CAP)
            hi = tl.maximum(hi, lo)
        if MODE >= 2:
            lo = tl.maximum(lo - OVERHEAD, 1)
        # NCAND-ary search instead of bisection: each round tests NCAND caps at once (one [BLOCK_B, NCAND]
        # tile) and keeps the gap between the last infeasible and the first feasible one, so the span
        # shrinks from s to <= ceil(s / NCAND) - 1 per round: few serial rounds (usually 1, since the
        # bracket is tight), each a division per tile element. hi counts as feasible (as bisection never
        # tests it), which makes the answer the bisection's one exactly. balanced_auto searches twice from the
        # same bracket: balanced's cap, then balanced_tails'.
        cand = tl.arange(0, NCAND)
        t2 = tiles[:, None].to(tl.uint32)
        bracket_lo, bracket_hi = lo, hi
        for search in tl.static_range(2 if MODE == 4 else 1):
            lo, hi = bracket_lo, bracket_hi
            while lo < hi:
                step = (hi - lo + NCAND - 1) // NCAND
                caps = tl.minimum(lo + cand * step, hi)  # [NCAND], non-decreasing
                c2 = caps[None, :].to(tl.uint32)
                held = ((t2 + c2 - 1) // c2).to(tl.int32)  # [BLOCK_B, NCAND] pieces per cap (unsigned: cheaper)
                if MODE < 2:
                    need = tl.sum(held, 0)
                elif MODE == 3 or search == 1:  # _slot_need_tails: every last piece of <= cap/2 tiles packed
                    last = tiles[:, None] - (held - 1) * caps[None, :]  # int32: an empty sequence's is cap (not small)
                    small = (2 * last <= caps[None, :]) & (tiles[:, None] > 0)
                    packed = tl.sum(tl.where(small, last + OVERHEAD, 0), 0)
                    need = tl.sum(held - small.to(tl.int32), 0) + (packed + caps + OVERHEAD - 1) // (caps + OVERHEAD)
                else:  # _slot_need: sequences of <= cap/2 tiles packed, tiles + OVERHEAD each
                    small = (2 * t2 <= c2) & (t2 > 0)
                    packed = tl.sum(tl.where(small, tiles[:, None] + OVERHEAD, 0), 0)
                    need = tl.sum(tl.where(small, 0, held), 0) + (packed + caps + OVERHEAD - 1) // (caps + OVERHEAD)
                fits = (need <= cap_budget) | (caps >= hi)  # monotone in the cap: a prefix fails, the rest fits
                new_lo = tl.max(tl.where(fits, lo - 1, caps), 0) + 1
                hi = tl.min(tl.where(fits, caps, hi), 0)
                lo = new_lo
            if MODE >= 2:
                hi = tl.maximum(hi, MIN_CAP)
            if MODE == 4 and search == 0:
                plain_cap = hi
        if MODE == 4:  # tails_pay, in int64 (100 x cap x total passes 2^31)
            plain_pieces = tl.sum(tl.where(tiles > 0, (tiles + plain_cap - 1) // plain_cap, 0), 0)
            tails_pieces = tl.sum(tl.where(tiles > 0, (tiles + hi - 1) // hi, 0), 0)
            gain = 100 * (plain_cap - hi).to(tl.int64) * total
            cost = plain_cap.to(tl.int64) * (100 * (tails_pieces - plain_pieces) * OVERHEAD
                                             + MIN_GAIN_PCT * total.to(tl.int64))
            tails = gain >= cost  # a runtime branch from here on
            hi = tl.where(tails, hi, plain_cap)
        else:
            tails = MODE == 3
        seg = tl.zeros_like(tiles) + hi
    seg = tl.maximum(seg, 1)  # sequences without tiles get no pieces; keep the division defined
    pieces = tl.where(tiles > 0, (tiles + seg - 1) // seg, 0)
    # -- partial rows: sequence b owns rows starts[b] .. ends[b]-1 --
    ends = tl.cumsum(pieces, 0)
    starts = ends - pieces
    n_items = tl.sum(pieces, 0)
    tl.store(seq_part_start + offs, starts, mask=offs == 0)
    tl.store(seq_part_start + offs + 1, ends, mask=in_b)
    tl.store(num_items, n_items)
    # -- work items: item w < n_items belongs to sequence #{b : ends[b] <= w} (ends is non-decreasing), whose
    # first row is the largest such end (0 if none). Those b are a prefix, so both come from one max over
    # the batch of key[b] = ends[b] << 16 | (b + 1) where ends[b] <= w (the host keeps W < 2^15). key is
    # built from the scan's output alone, so the tile takes one converted vector and the per-sequence
    # arithmetic above is not recomputed in the tile's layout. The item's length is gathered from memory.
    # balanced's launch order places a split sequence's item among the split items by their running count
    # in row order, a single one among the rest after the n_first split ones; a plan with the tails packed the
    # same with the held items (over half the cap) first. Blocks past n_items only pad. --
    key = ((ends << 16) | (offs + 1))[:, None]  # padded b: ends == n_items > w
    if tails:
        small_last = ((2 * (tiles - (pieces - 1) * seg) <= seg) & (tiles > 0)).to(tl.int32)
        n_first = tl.sum(pieces - small_last, 0)
    else:
        n_first = tl.sum(tl.where(pieces > 1, pieces, 0), 0)
    first_seen = n_items * 0  # first-group items before the current block
    for w0 in range(0, n_items, BLOCK_W):
        w = w0 + tl.arange(0, BLOCK_W)
        found = tl.max(tl.where(key <= ((w << 16) | 0xFFFF)[None, :], key, 0), 0)  # the last such b's key
        seq = found & 0xFFFF  # the count of such b
        first = found >> 16
        real = w < n_items
        length = tl.load(seq_lens + seq, mask=real, other=0)
        if MODE == 0:  # a real item's sequence has q_len > 0, so its tiles are cdiv(L, TILE)
            seg_tokens = (((length + TILE - 1) // TILE + nseg - 1) // nseg) * TILE
        else:
            seg_tokens = hi * TILE
        start = (w - first) * seg_tokens
        end = tl.minimum(length, start + seg_tokens)
        m = w < width
        tl.store(work_seq + w, tl.where(real, seq, -1), mask=m)
        tl.store(work_start + w, tl.where(real, start, 0), mask=m)
        tl.store(work_end + w, tl.where(real, end, 0), mask=m)
        tl.store(work_part + w, tl.where(real, w, -1), mask=m)
        if MODE >= 2:  # a permutation of 0..n_items-1 (scattered), then -1 past it
            if tails:  # held: more than half the cap
                first_group = (real & (2 * ((end - start + TILE - 1) // TILE) > hi)).to(tl.int32)
            else:  # more than one piece: tiles > hi
                first_group = (real & (length > seg_tokens)).to(tl.int32)
            before = first_seen + tl.cumsum(first_group, 0) - first_group
            first_seen += tl.sum(first_group, 0)
            slot = tl.where(first_group > 0, before, n_first + w - before)
            tl.store(work_order + slot, w, mask=real)
            tl.store(work_order + w, -1, mask=m & (w >= n_items))
        else:
            tl.store(work_order + w, tl.where(real, w, -1), mask=m)
    for w0 in range((n_items + BLOCK_W - 1) // BLOCK_W * BLOCK_W, width, BLOCK_W):
        w = w0 + tl.arange(0, BLOCK_W)
        m = w < width
        tl.store(work_seq + w, -1, mask=m)
        tl.store(work_start + w, 0, mask=m)
        tl.store(work_end + w, 0, mask=m)
        tl.store(work_part + w, -1, mask=m)
        tl.store(work_order + w, -1, mask=m)


_KERNELS: dict = {}


def _plan_kernel():
    import triton
    import triton.language

    interpret = bool(triton.knobs.runtime.interpret)
    if interpret not in _KERNELS:
        from triton.language.extra.cuda import gdc_launch_dependents

        globals().update(tl=triton.language, gdc_launch_dependents=gdc_launch_dependents)
        _KERNELS[interpret] = triton.jit(_plan_kernel_body)
    return _KERNELS[interpret]


def _check_out(out: dict, batch: int, width: int, device) -> None:
    import torch

    want = {f: (width,) for f in WORK_FIELDS} | {"seq_part_start": (batch + 1,), "num_items": (1,)}
    if not isinstance(out, dict) or set(out) != set(want):
        got = sorted(out) if isinstance(out, dict) else type(out).__name__
        raise ValueError(f"out: got {got}; expected a dict with keys {', '.join(FIELDS)}")
    for name, shape in want.items():
        t = out[name]
        if t.dtype != torch.int32 or tuple(t.shape) != shape or t.device != device or not t.is_contiguous():
            raise ValueError(f"out[{name!r}]: got {t.dtype} {tuple(t.shape)} on {t.device}; expected contiguous "
                             f"int32 {shape} on {device} (W = max_work_items(B={batch}, ...) = {width})")


def plan_gpu(seq_lens, cu_seqlens_q, *, num_kv_heads: int, slots: int, mode: str, out: dict,
             overhead: int = PIECE_OVERHEAD_TILES, let_next_launch: bool = False) -> None:
    """The planner as one Triton launch writing into `out` (keys FIELDS); equals plan_python exactly.
    let_next_launch: let a programmatic dependent (vattn's Hopper main kernel, which waits for the plan itself)
    launch at once; sm_90 and later, not under the interpreter.

    seq_lens: [B] int32, cu_seqlens_q: [B+1] int32, on one device. Shapes and dtypes are checked on the
    host, values never read: no sync, so the launch can be captured in a CUDA graph and replayed with
    new lengths. Under TRITON_INTERPRET=1 it runs on CPU tensors.
    """
    import torch

    if mode not in PLANNERS:
        raise ValueError(f"mode: got {mode!r}; allowed: {', '.join(PLANNERS)}")
    _check_positive(num_kv_heads=num_kv_heads, slots=slots, overhead=overhead)
    batch = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    if batch < 0 or seq_lens.dtype != torch.int32 or not seq_lens.is_contiguous():
        raise ValueError(f"seq_lens: got {seq_lens.dtype} {tuple(seq_lens.shape)}; expected contiguous int32 [B]")
    if (cu_seqlens_q.dtype != torch.int32 or tuple(cu_seqlens_q.shape) != (batch + 1,)
            or cu_seqlens_q.device != seq_lens.device or not cu_seqlens_q.is_contiguous()):
        raise ValueError(f"cu_seqlens_q: got {cu_seqlens_q.dtype} {tuple(cu_seqlens_q.shape)} on "
                         f"{cu_seqlens_q.device}; expected contiguous int32 [{batch + 1}] on {seq_lens.device}")
    width = max_work_items(batch, num_kv_heads, slots)
    _check_out(out, batch, width, seq_lens.device)
    launch_plan(seq_lens, cu_seqlens_q, out, num_kv_heads=num_kv_heads, slots=slots, mode=mode, overhead=overhead,
                let_next_launch=let_next_launch)


def launch_plan(seq_lens, cu_seqlens_q, out: dict, *, num_kv_heads: int, slots: int, mode: str,
                overhead: int = PIECE_OVERHEAD_TILES, let_next_launch: bool = False) -> None:
    """plan_gpu's launch without its checks, for a caller that has checked the same things (vattn.plan:
    the lengths against its workspace, `out` the workspace's own views)."""
    from vattn import launcher

    args, kwargs = plan_launch_args(seq_lens, cu_seqlens_q, out, num_kv_heads=num_kv_heads, slots=slots, mode=mode,
                                    overhead=overhead, let_next_launch=let_next_launch)
    launcher.kernel(_plan_kernel()).launch((1, 1, 1), args, kwargs)


PLAN_LIVE = (0, 1)  # positions in plan_launch_args' args of seq_lens, cu_seqlens_q (vattn.plans' bindings)


def plan_launch_args(seq_lens, cu_seqlens_q, out: dict, *, num_kv_heads: int, slots: int, mode: str,
                     overhead: int = PIECE_OVERHEAD_TILES, let_next_launch: bool = False):
    """(args, kwargs) of the plan kernel: the lengths, `out`'s views, the shape's scalars; constexprs."""
    scalars, constexprs = _launch_params(seq_lens.shape[0], num_kv_heads, slots, mode, overhead)
    return (seq_lens, cu_seqlens_q, out["work_seq"], out["work_start"], out["work_end"], out["work_part"],
            out["seq_part_start"], out["num_items"], out["work_order"], *scalars), \
        dict(constexprs) | (dict(LET_NEXT_LAUNCH=True) if let_next_launch else {})


@functools.lru_cache(maxsize=1024)
def _launch_params(batch: int, num_kv_heads: int, slots: int, mode: str, overhead: int) -> tuple[tuple, dict]:
    """(batch, width, budget, nseg) and the constexpr kwargs of the plan kernel: a function of the shape
    only, so built once per batch size, not on every call (the caller copies the dict into its call)."""
    nseg = max(1, min(SEG_MAX, _pow2floor(slots // (max(batch, 1) * num_kv_heads))))
    width = max_work_items(batch, num_kv_heads, slots)
    if width >= 1 << 15:  # the item loop packs a count and a row index into one int32 sum
        raise ValueError(f"batch: got {batch}; the plan kernel needs max_work_items < 32768, got {width}")
    block_b = 1 << max(batch - 1, 0).bit_length()
    # A one-program launch on a tiny problem, bound by the latency of its serial instructions. Each thread
    # holds a whole column of the [BLOCK_B, *] tiles (at most 64 rows: warps split the batch axis past 64),
    # so reductions over the batch are adds in registers. NCAND: caps a search round (the bracket spans a
    # few caps, so one round is the rule); BLOCK_W: items a step, each step a serial max over the batch, so
    # the fewer steps the better while the tile fits. Up to 32 sequences, the best overall of 13 launch
    # shapes timed on an H100 for 1, 4, 16, 20 and 32 sequences, both planners and both backends' slot
    # counts (benchmarks/NOTES.md P116: 0.1-0.7 us a plan below P115's rule, most where the items outgrew
    # one step); 64 as P115's sweep chose; past 64 as first written (~8 tile values a thread).
    if block_b <= 32:
        num_warps = 4
        ncand, block_w = (32, 256) if block_b <= 16 else (16, 128)
    else:
        num_warps, ncand = 4 if block_b <= 256 else 8, 8
        block_w = max(32 * (num_warps // min(num_warps, max(1, block_b // 64))), min(256, 2048 // block_b))
    scalars = (batch, width, slot_budget(num_kv_heads, slots), nseg)
    return scalars, dict(
        MODE=_MODE_IDS[mode], BLOCK_B=block_b, BLOCK_W=block_w, NCAND=ncand, TILE=KV_TILE, SEG_CAP=SEG_MAX,
        MIN_CAP=overhead, OVERHEAD=overhead, MIN_GAIN_PCT=TAILS_MIN_GAIN_PCT, num_warps=num_warps)
