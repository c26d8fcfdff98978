"""`python -m benchmarks.kernel.tail_plans`: balanced with split sequences' short last pieces packed (NOTES P114).

balanced gives every piece of a split sequence a slot of its one wave, so a batch of equal sequences leaves SMs
idle and its largest piece is the one-wave cap: 16x35k's 16 sequences of 547 tiles take 8 pieces of 69 tiles on
128 of the H200's 132 SMs, where 132 even shares would be 66.3 tiles. With the short last pieces packed as the
short sequences are (a piece of at most half the cap shares a slot, its tiles + the overhead), a smaller cap fits:
16x35k 8 pieces of 68 and a 3-tile tail each, the 16 tails run on the 4 spare SMs behind the full pieces (the
launch order puts every piece over half the cap first). This times the layer (main + reduce on a plan made
before, as an engine runs each layer) on both plans, round by round in turns (the order reversed every other
round, as the long rows drift by 10% under the power cap), and checks both against the fp32 reference. A
measurement: vattn's planner is unchanged until it shows a gain."""

from __future__ import annotations

import statistics

from benchmarks.kernel import harness
from vattn.planner import KV_TILE, PlanLists, _smallest, max_work_items, slot_budget

DEFAULT_SHAPES = "16x35k,16x70k,16x119k,32x8k-hd128-gqa8,bs20-agentic-2.32M,long-among-short"


def _need(tiles: list[int], cap: int, o: int) -> int:
    """Slots of time cap + o: a piece of more than cap / 2 tiles holds one; the others (short sequences and the
    short last pieces of split ones) are packed end to end, tiles + o each. Non-increasing in cap."""
    held = packed = 0
    for t in tiles:
        last = t - (-(-t // cap) - 1) * cap
        held += -(-t // cap) - 1 + (2 * last > cap)
        packed += (last + o) * (2 * last <= cap)
    return held - (-packed // (cap + o))


def tail_cap(tiles: list[int], num_kv_heads: int, slots: int, overhead: int) -> int:
    live = [t for t in tiles if t]
    budget = max(slot_budget(num_kv_heads, slots), len(live))
    lo = max(1, -(-sum(live) // budget) - overhead)
    return max(_smallest(lo, max(live), lambda c: _need(live, c, overhead) <= budget), overhead)


def plan_lists(seq_lens: list[int], q_lens: list[int], *, num_kv_heads: int, slots: int, overhead: int) -> PlanLists:
    """vattn.planner.plan_python's lists for the tail-packing cap; launch order: every piece over half the cap
    (held) first, then the packed ones, each group in row order."""
    tiles = [-(-L // KV_TILE) if q else 0 for L, q in zip(seq_lens, q_lens)]
    cap = tail_cap(tiles, num_kv_heads, slots, overhead)
    width = max_work_items(len(seq_lens), num_kv_heads, slots)
    seq, start, end, part_start, held = [], [], [], [0], []
    for b, t in enumerate(tiles):
        for p in range(-(-t // cap) if t else 0):
            seq.append(b)
            start.append(p * cap * KV_TILE)
            end.append(min(seq_lens[b], (p + 1) * cap * KV_TILE))
            held.append(2 * min(cap, t - p * cap) > cap)
        part_start.append(len(seq))
    n = len(seq)
    if n > width:
        raise ValueError(f"tail-packed plan: {n} pieces > the workspace's {width} work items")
    order = [w for w in range(n) if held[w]] + [w for w in range(n) if not held[w]]
    pad = width - n
    return PlanLists(work_seq=seq + [-1] * pad, work_start=start + [0] * pad, work_end=end + [0] * pad,
                     work_part=list(range(n)) + [-1] * pad, seq_part_start=part_start, num_items=[n],
                     work_order=order + [-1] * pad)


def _pieces(lists) -> str:
    n = lists["num_items"][0]
    lens = [-(-(e - s) // KV_TILE) for s, e in zip(lists["work_start"][:n], lists["work_end"][:n])]
    return f"{n} pieces, largest {max(lens)} tiles"


def measure(shapes, device: str, rounds: int, replays: int, sustained: tuple[float, float] = (0.0, 0.0)) -> list[dict]:
    """sustained: (seconds, rest); with seconds > 0 each round's time is the layer's under that much back-to-back
    load after `rest` idle seconds (the power cap's figure, benchmarks.kernel.sustained), and each record also
    keeps the SM clock and joules a layer of every round."""
    import torch

    import vattn
    from benchmarks.kernel.bench import _backend_name, _workspace
    from vattn.planner import FIELDS

    seconds, rest = sustained
    if seconds:
        from benchmarks.kernel.sustained import Gpu, measure_one

        gpu = Gpu()
    batches = harness.BatchCache(device)
    records = []
    for shape in shapes:
        b = batches.get(shape)
        ws = _workspace(shape, b, None)
        backend = _backend_name(ws, b)
        pl = vattn.plan(b.seq_lens, b.cu, num_kv_heads=shape.num_kv_heads, page_size=shape.page_size,
                        mode="balanced", workspace=ws)
        torch.cuda.synchronize() if device == "cuda" else None
        plans = {"balanced": {f: pl.tensors[f].tolist() for f in FIELDS}}
        tails = plan_lists(list(shape.seq_lens), list(shape.q_lens), num_kv_heads=ws.program_kv_heads,
                           slots=ws.slots, overhead=ws.piece_overhead)
        plans["tails packed"] = {f: getattr(tails, f) for f in FIELDS}

        def use(name):
            for f in FIELDS:
                pl.tensors[f].copy_(torch.tensor(plans[name][f], dtype=torch.int32))

        def layer():
            for r in range(b.replicas):
                vattn.attention(*b.attention_args(r), plan=pl, out=b.out)

        ref = b.reference()
        errs = {}
        for name in plans:
            use(name)
            vattn.attention(*b.attention_args(0), plan=pl, out=b.out)
            errs[name] = harness.check(b.out, ref)
        if seconds:
            graph = harness.capture(layer)  # the graph reads the plan's tensors, which use() rewrites
        loads = {name: [] for name in plans}

        def timer(name):
            def time_layer():
                use(name)
                if not seconds:
                    return harness.timed_graph(layer, replays, device) / b.replicas
                load = measure_one(gpu, graph, b.replicas, seconds, rest, replays)
                loads[name].append(dict(sm_mhz=load["sm_mhz"], mj=load["mj_per_call"],
                                        power_capped_share=load["power_capped_share"], burst_us=load["burst_us"]))
                return load["sustained_us"]
            return time_layer

        us = harness.time_in_rounds({name: timer(name) for name in plans}, rounds)
        faster = harness.rounds_faster(us)
        for name, values in us.items():
            rel_err, nan = errs[name]
            records.append(dict(shape=shape.name, backend=backend, plan=name, pieces=_pieces(plans[name]),
                                us=statistics.median(values),
                                rounds=values, faster_rounds=faster.get(name), rel_err=rel_err, nan=nan,
                                replicas=b.replicas, replays=replays, sustained_s=seconds or None,
                                loads=loads[name] or None))
            print(f"{shape.name:28s} {name:13s} {_pieces(plans[name]):28s} rel_err {rel_err:.1e} "
                  + " ".join(f"{v:8.1f}" for v in values)
                  + (f"  faster than balanced in {faster[name][0]} of {faster[name][1]} rounds" if name in faster else ""),
                  flush=True)
    return records


def main(argv=None) -> int:
    return harness.rounds_cli(argv, module="benchmarks.kernel.tail_plans", doc=__doc__, default_shapes=DEFAULT_SHAPES,
                              default_rounds=5, default_out="tail-plans.json",
                              header=f"{'shape':28s} {'plan':13s} {'pieces':28s} us a layer, round by round", measure=measure,
                              sustained=True)


if __name__ == "__main__":
    raise SystemExit(main())
