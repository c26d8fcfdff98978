"""`python -m benchmarks.kernel.layer_gap`: what the per-layer chain loses between its kernels (NOTES P108).

An engine plans once a forward and runs vattn's main kernel and reduce every layer; the bench's `layer_us` times R
replicas of that chain in one graph. On the long rows it came out 5-18% over main + reduce, while the call, whose
plan kernel sits between one replica's reduce and the next replica's main kernel, did not; launching the main
kernel without programmatic dependence changed nothing. This times, round by round in turns, R replicas of the
layer with nothing between them, with a one-element add between them, and with the plan kernel between them (the
call), so that the effect of a gap shows apart from the machine's drift."""

from __future__ import annotations

import statistics

from benchmarks.kernel import harness

VARIANTS = ("layer", "layer, an add between", "layer, the plan between")
DEFAULT_SHAPES = "16x119k,20x116k-uniform-of-bs20,bs16-agentic-1.85M,16x35k"


def chains(shape, b, tick=None) -> dict:
    """The three chains of one batch, each a function that runs R replicas (for harness.timed_graph); tick: the
    one-element tensor the add writes (a new one on the batch's device by default)."""
    import torch

    import vattn
    from benchmarks.kernel.bench import _workspace

    ws = _workspace(shape, b, None)

    def plan():
        return vattn.plan(b.seq_lens, b.cu, num_kv_heads=shape.num_kv_heads, page_size=shape.page_size,
                          mode="balanced", workspace=ws)

    pl = plan()
    tick = torch.zeros(1, device=b.device) if tick is None else tick

    def chain(between):
        def run():
            for r in range(b.replicas):
                between()
                vattn.attention(*b.attention_args(r), plan=pl, out=b.out)
        return run

    return dict(zip(VARIANTS, (chain(lambda: None), chain(lambda: tick.add_(1)), chain(plan))))


def measure(shapes, device: str, rounds: int, replays: int):
    """Yields one record per (shape, variant): us a replica in each round (the variants in turns), and their median."""
    batches = harness.BatchCache(device)
    for shape in shapes:
        b = batches.get(shape)
        fns = chains(shape, b)
        us = harness.time_in_rounds({name: (lambda fn=fn: harness.timed_graph(fn, replays, device) / b.replicas)
                                     for name, fn in fns.items()}, rounds)
        for name, values in us.items():
            print(f"{shape.name:28s} {name:26s} " + " ".join(f"{v:8.1f}" for v in values), flush=True)
            yield dict(shape=shape.name, variant=name, us=statistics.median(values), rounds=values,
                       replicas=b.replicas, replays=replays)


def main(argv=None) -> int:
    return harness.rounds_cli(argv, module="benchmarks.kernel.layer_gap", doc=__doc__, default_shapes=DEFAULT_SHAPES,
                              default_rounds=3, default_out="layer-gap.json",
                              header=f"{'shape':28s} {'chain':26s} us a replica, round by round", measure=measure)


if __name__ == "__main__":
    raise SystemExit(main())
