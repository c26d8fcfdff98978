"""The plan kernel alone, by its launch shape (warps, NCAND caps a search round, BLOCK_W items a step) and planner,
on the bench's batches.

    python -m benchmarks.kernel.plan_search --shapes 16x35k,host-64x24 --launch "1:8:64,2:32:128" --out plan-search.json

Each launch shape's plan is checked against plan_python, then timed as a graph of 20 launches (us a launch, the
median of 20 replays), the shapes taking turns round by round. `default` is vattn.planner's own choice for the
batch size. --backends plans as each backend does on a 132-SM Hopper: `hopper` one CTA an SM and the e4m3 piece
overhead (8 tiles), `triton` two programs an SM and the Triton kernel's overhead. The plan is the same at any
launch shape; only the time differs.
"""
from __future__ import annotations

import argparse
import statistics

from benchmarks.kernel import harness
from benchmarks.kernel.shapes import select
from vattn.planner import PIECE_OVERHEAD_TILES, PLANNERS

LAUNCHES = 20
BACKENDS = {"hopper": (132, 8), "triton": (264, PIECE_OVERHEAD_TILES)}  # (slots, piece overhead in tiles)


def parse_launch(text: str) -> list[str]:
    """'default' and 'WARPS:NCAND:BLOCK_W' entries, comma-separated; default first if not named."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.split(":")
        if item != "default" and (len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts)
                                  or any(int(p) & (int(p) - 1) for p in parts)):
            raise SystemExit(f"--launch: got {item!r}; allowed: default or WARPS:NCAND:BLOCK_W, each a power of two")
        out.append(item)
    return (["default"] if "default" not in out else []) + out


def run_shape(shape, device: str, backend: str, planners, launches, rounds: int) -> list[dict]:
    import torch

    from vattn import launcher
    from vattn.planner import FIELDS, _plan_kernel, max_work_items, plan_launch_args, plan_python

    slots, overhead = BACKENDS[backend]
    b = harness.BatchCache(device).get(shape)
    width = max_work_items(shape.batch, shape.num_kv_heads, slots)
    sizes = {f: width for f in FIELDS} | {"seq_part_start": shape.batch + 1, "num_items": 1}
    out = {f: torch.empty(n, dtype=torch.int32, device=device) for f, n in sizes.items()}
    kernel = launcher.kernel(_plan_kernel())
    records = []
    for mode in planners:
        args, default = plan_launch_args(b.seq_lens, b.cu, out, num_kv_heads=shape.num_kv_heads, slots=slots,
                                         mode=mode, overhead=overhead)
        want = plan_python(list(shape.seq_lens), list(shape.q_lens), num_kv_heads=shape.num_kv_heads, slots=slots,
                           mode=mode, overhead=overhead)
        shapes = {name: default if name == "default"
                  else dict(default, **dict(zip(("num_warps", "NCAND", "BLOCK_W"), map(int, name.split(":")))))
                  for name in launches}

        def timer(kw):
            def time_it():
                return harness.timed_graph(lambda: [kernel.launch((1, 1, 1), args, kw) for _ in range(LAUNCHES)],
                                           20, device) / LAUNCHES
            return time_it

        matches = {}
        for name, kw in shapes.items():
            kernel.launch((1, 1, 1), args, kw)
            matches[name] = all(out[f].tolist() == getattr(want, f) for f in FIELDS)
        times = harness.time_in_rounds({name: timer(kw) for name, kw in shapes.items()}, rounds)
        for name, kw in shapes.items():
            records.append(dict(shape=shape.name, batch=shape.batch, backend=backend, slots=slots, overhead=overhead,
                                planner=mode, launch=name, num_warps=kw["num_warps"], ncand=kw["NCAND"],
                                block_w=kw["BLOCK_W"], items=want.num_items[0], matches_plan_python=matches[name],
                                us=statistics.median(times[name]), rounds=times[name]))
    return records


def print_record(r: dict) -> None:
    """One line a launch shape: its rounds' times, and WRONG where its plan differs from plan_python."""
    print(f"{r['shape']:20s} {r['backend']:6s} {r['planner']:14s} {r['launch']:9s} warps {r['num_warps']} "
          f"NCAND {r['ncand']:2d} BLOCK_W {r['block_w']:3d} items {r['items']:4d} "
          + " ".join(f"{t:6.2f}" for t in r["rounds"]) + ("" if r["matches_plan_python"] else "  WRONG"), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="16x35k,host-64x24")
    ap.add_argument("--planners", default="balanced", help=f"comma-separated, of {', '.join(PLANNERS)}")
    ap.add_argument("--backends", default="hopper", help=f"comma-separated, of {', '.join(BACKENDS)}")
    ap.add_argument("--launch", default="default", help="comma-separated launch shapes WARPS:NCAND:BLOCK_W; "
                    "default (vattn's own choice) is always timed")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the launch shapes in turns (default 2)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu under TRITON_INTERPRET=1 checks the plans only")
    ap.add_argument("--out", default="plan-search.json")
    a = ap.parse_args(argv)
    planners = [p for p in a.planners.split(",") if p]
    backends = [b for b in a.backends.split(",") if b]
    for field, values, allowed in (("--planners", planners, PLANNERS), ("--backends", backends, tuple(BACKENDS))):
        for v in values:
            if v not in allowed:
                raise SystemExit(f"{field}: got {v!r}; allowed: {', '.join(allowed)}")
    if a.rounds < 1:
        raise SystemExit(f"--rounds: got {a.rounds}; allowed: a positive integer")
    launches = parse_launch(a.launch)
    import torch

    device = torch.cuda.get_device_name() if a.device == "cuda" else f"{a.device} (Triton's interpreter)"
    date, command = harness.provenance("benchmarks.kernel.plan_search", argv)
    records = []
    for backend in backends:
        for shape in select(a.shapes):
            shape_records = run_shape(shape, a.device, backend, planners, launches, a.rounds)
            for r in shape_records:
                r.update(device=device, date=date, command=command)
                print_record(r)
            records += shape_records
            harness.save_records(a.out, records)  # after every shape: a run cut short keeps what it measured
    return 0 if all(r["matches_plan_python"] for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
