"""The plan kernel alone, by the width of its cap search (NCAND: caps tested a round), on the bench's batches.

    python -m benchmarks.kernel.plan_search --shapes 16x35k,host-64x24 --out plan-search.json

Each width's plan is checked against plan_python (balanced, one CTA per SM on 132 SMs, piece overhead 8: the
Hopper backend's), then timed as a graph of 20 launches (us a launch, median of 20 replays). The search's
result is the same at any width; only the number of rounds and the work of each change.
"""
from __future__ import annotations

import argparse
import json

from benchmarks.kernel import harness
from benchmarks.kernel.shapes import select

WIDTHS = (8, 16, 32, 64, 128)
LAUNCHES = 20
SLOTS, OVERHEAD = 132, 8


def run_shape(shape, device: str) -> dict:
    import torch

    from vattn import launcher
    from vattn.planner import FIELDS, _plan_kernel, max_work_items, plan_launch_args, plan_python

    b = harness.BatchCache(device).get(shape)
    width = max_work_items(shape.batch, shape.num_kv_heads, SLOTS)
    sizes = {f: width for f in FIELDS} | {"seq_part_start": shape.batch + 1, "num_items": 1}
    out = {f: torch.empty(n, dtype=torch.int32, device=device) for f, n in sizes.items()}
    args, constexprs = plan_launch_args(b.seq_lens, b.cu, out, num_kv_heads=shape.num_kv_heads, slots=SLOTS,
                                        mode="balanced", overhead=OVERHEAD)
    want = plan_python(list(shape.seq_lens), list(shape.q_lens), num_kv_heads=shape.num_kv_heads, slots=SLOTS,
                       mode="balanced", overhead=OVERHEAD)
    kernel = launcher.kernel(_plan_kernel())
    rec = dict(shape=shape.name, batch=shape.batch, default_ncand=constexprs["NCAND"])
    for ncand in WIDTHS:
        kw = dict(constexprs, NCAND=ncand)
        launch = lambda: kernel.launch((1, 1, 1), args, kw)
        launch()
        rec[f"matches_plan_python_ncand{ncand}"] = all(out[f].tolist() == getattr(want, f) for f in FIELDS)
        rec[f"plan_us_ncand{ncand}"] = harness.timed_graph(lambda: [launch() for _ in range(LAUNCHES)], 20,
                                                           device) / LAUNCHES
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="16x35k,host-64x24")
    ap.add_argument("--device", default="cuda", help="cuda; cpu under TRITON_INTERPRET=1 checks the plans only")
    ap.add_argument("--out", default="plan-search.json")
    a = ap.parse_args(argv)
    records = [run_shape(shape, a.device) for shape in select(a.shapes)]
    with open(a.out, "w") as f:
        json.dump(records, f, indent=1)
    for r in records:  # us a launch by width; a plan that differs from plan_python is marked
        cells = [f"{n}:{r[f'plan_us_ncand{n}']:.2f}" + ("" if r[f"matches_plan_python_ncand{n}"] else "(WRONG)")
                 for n in WIDTHS]
        print(f"{r['shape']:20s} " + " ".join(cells))
    return 0 if all(v for r in records for k, v in r.items() if k.startswith("matches")) else 1


if __name__ == "__main__":
    raise SystemExit(main())
