"""`python -m benchmarks.kernel.tail_plans`: the balanced_tails planner against balanced, layer by layer (NOTES P114).

balanced gives every piece of a split sequence a slot of its one wave, so a batch of equal sequences leaves SMs
idle and its largest piece is the one-wave cap: 16x35k's 16 sequences of 547 tiles take 8 pieces of 69 tiles on
128 of the H200's 132 SMs, where 132 even shares would be 66.3 tiles. balanced_tails packs the short last pieces
as the short sequences are (vattn/planner.py), so a smaller cap fits: 16x35k 8 pieces of 68 and a 3-tile tail
each, the 16 tails on the 4 spare SMs behind the full pieces. This times the layer (main + reduce on a plan made
before, as an engine runs each layer) on both plans as the plan kernel writes them, round by round in turns (the
order reversed every other round, as the long rows drift by 10% under the power cap), and checks both against the
fp32 reference. balanced_auto takes one of the two plans a batch (vattn/planner.py's tails_pay): `--shapes tails-rule`
holds batches its rule was not fitted to, on which these rounds say whether it took the faster."""

from __future__ import annotations

import statistics

from benchmarks.kernel import harness
from vattn.planner import KV_TILE

DEFAULT_SHAPES = "16x35k,16x70k,16x119k,32x8k-hd128-gqa8,bs20-agentic-2.32M,long-among-short"
PLANS = ("balanced", "balanced_tails")  # the first is the one the others are counted faster than


def _pieces(lists) -> str:
    n = lists["num_items"][0]
    lens = [-(-(e - s) // KV_TILE) for s, e in zip(lists["work_start"][:n], lists["work_end"][:n])]
    return f"{n} pieces, largest {max(lens)} tiles"


def measure(shapes, device: str, rounds: int, replays: int, sustained: tuple[float, float] = (0.0, 0.0)):
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
    for shape in shapes:
        b = batches.get(shape)
        ws = _workspace(shape, b, None)
        backend = _backend_name(ws, b)
        plans = {}
        for mode in reversed(PLANS):  # each plan's lists as the plan kernel wrote them; `pl`, balanced's, is
            # the one every layer runs, its tensors rewritten by use()
            pl = vattn.plan(b.seq_lens, b.cu, num_kv_heads=shape.num_kv_heads, page_size=shape.page_size,
                            mode=mode, workspace=ws)
            plans[mode] = {f: pl.tensors[f].tolist() for f in FIELDS}
        plans = {mode: plans[mode] for mode in PLANS}

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
            print(f"{shape.name:28s} {name:14s} {_pieces(plans[name]):28s} rel_err {rel_err:.1e} "
                  + " ".join(f"{v:8.1f}" for v in values)
                  + (f"  faster than balanced in {faster[name][0]} of {faster[name][1]} rounds" if name in faster else ""),
                  flush=True)
            yield dict(shape=shape.name, backend=backend, plan=name, pieces=_pieces(plans[name]),
                       us=statistics.median(values), rounds=values, faster_rounds=faster.get(name), rel_err=rel_err,
                       nan=nan, replicas=b.replicas, replays=replays, sustained_s=seconds or None,
                       loads=loads[name] or None)


def main(argv=None) -> int:
    return harness.rounds_cli(argv, module="benchmarks.kernel.tail_plans", doc=__doc__, default_shapes=DEFAULT_SHAPES,
                              default_rounds=5, default_out="tail-plans.json",
                              header=f"{'shape':28s} {'plan':14s} {'pieces':28s} us a layer, round by round",
                              measure=measure, sustained=True)


if __name__ == "__main__":
    raise SystemExit(main())
