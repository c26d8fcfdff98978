"""The Hopper main kernel (vattn/hopper/main_sm90.cu) against the Triton main kernel on the same batches,
one H200 invocation: correctness against vattn.reference through vattn's reduce, and main-kernel time.

    python -m benchmarks.kernel.hopper_proto --shapes 16x35k,16x70k --out proto.json

The Hopper kernels run one CTA per SM (160 KB of shared memory; k8: 225 KB), so their plan is balanced for 132
slots per KV head; the Triton kernel keeps its own plan (2 programs per SM). Both are timed like the bench: CUDA-graph
replays over L2-cold replicas of the KV pool.

Identical builds can drift apart by several percent within one run on the long batches (benchmarks/NOTES.md
P45), so `--rounds R` times the variants R times in alternating order (forward, then backward) and records each
variant's median over the rounds, with every round's time beside it and the rounds in which it ran faster than
the first variant (`faster_rounds_NAME`).

    python -m benchmarks.kernel.hopper_proto --shapes 16x35k --variants "a:K8=1;b:K8=1,BLOCK_N=128" --rounds 3

`--pack-heads 2` builds every variant to read two adjacent KV heads a CTA (MainSm90's pack_heads: head_dim 128 on
the k8 kernel, as the backend runs it where the rows fit), planned for half the KV heads and reduced as the
backend does (vattn.Workspace.partials)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from benchmarks.kernel import harness
from benchmarks.kernel.shapes import select


def _plan_tensors(shape, slots: int, device: str, overhead: int, num_kv_heads: int):
    import torch

    from vattn.planner import plan_python

    lists = plan_python(list(shape.seq_lens), list(shape.q_lens), num_kv_heads=num_kv_heads, slots=slots,
                        mode="balanced", overhead=overhead)
    return {f: torch.tensor(getattr(lists, f), dtype=torch.int32, device=device)
            for f in ("work_seq", "work_start", "work_end", "work_part", "work_order", "seq_part_start", "num_items")}


def run_shape(shape, batches, replays: int, descriptors, variants: dict, slots_per_sm=(1,),
              reduce_variants: dict | None = None, chain: bool = False, overhead: int | None = None,
              rounds: int = 1, pack_heads: int = 1, cuda_reduces: tuple = ()) -> dict:
    """overhead: the balanced plan's piece overhead in tiles (None: the one the Hopper backend plans with);
    reduce_variants: name -> launch_reduce keyword arguments (ints); cuda_reduces: (warps, unroll, slice[, trigger[,
    after_wait]]) of vattn.hopper.reduce's CUDA reduce, timed as reduce variants cudaW_U_S...; rounds: alternating_rounds (harness) of
    the timing; pack_heads: KV heads a CTA reads (the module docstring)."""
    import functools

    import torch

    from benchmarks.kernel.bench import _time_planner, _workspace
    from vattn import kernel as K
    from vattn.hopper.backend import piece_overhead_tiles
    from vattn.hopper.build import MainSm90

    b = batches.get(shape)
    if shape.num_kv_heads % pack_heads:
        raise ValueError(f"--pack-heads: got {pack_heads}; {shape.name} has {shape.num_kv_heads} KV heads")
    heads = shape.num_kv_heads // pack_heads  # the CTAs of a work item; each serves gqa query heads
    gqa = shape.num_q_heads // heads
    qlen = max(shape.q_lens)
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    if overhead is None:
        overhead = piece_overhead_tiles(b.kv_dtype)
    plans = {spm: _plan_tensors(shape, spm * sm, "cuda", overhead, heads) for spm in slots_per_sm}
    plan = plans[slots_per_sm[0]]
    width = max(p["work_seq"].shape[0] for p in plans.values())
    # the partials' O as each build stores it (PARTIAL_BF16: bf16), the first variant's for the reduce's own timings
    o_parts = {dtype: torch.empty(width, heads, 64, shape.head_dim, dtype=dtype, device="cuda")
               for dtype in (torch.float32, torch.bfloat16)}
    o_part_of = {name: o_parts[torch.bfloat16 if defines.get("PARTIAL_BF16") else torch.float32]
                 for name, defines in variants.items()}
    o_part = next(iter(o_part_of.values()))
    lse_part = torch.empty(width, heads, 64, dtype=torch.float32, device="cuda")
    ref = b.reference()
    rec = dict(shape=shape.name, batch=shape.batch, kv_bytes=shape.kv_bytes, slots=sm, items=width, overhead=overhead,
               pack_heads=pack_heads)

    def reduce(o_part=o_part):
        K.launch_reduce(o_part, lse_part, plan["seq_part_start"], b.cu, b.out, gqa=gqa, max_q_len=qlen,
                        skip_whole=True)

    per = lambda fn: harness.timed_graph(fn, replays) / b.replicas
    kernels, timers = {}, {}
    for name, defines in variants.items():
        kern = kernels[name] = MainSm90(head_dim=shape.head_dim, gqa=gqa // pack_heads, page=shape.page_size,
                                        extra_defines=defines, pack_heads=pack_heads)

        def hopper(r, v_lbo, v_sbo, kern=kern, o_part=o_part_of[name]):  # an ordinary launch: as a programmatic
            # dependent, each replica's kernel would start in the tail of the one before (kern bound now: it is
            # timed after the loop)
            kern.launch(*b.attention_args(r), plan, o_part, lse_part, b.out, v_lbo=v_lbo, v_sbo=v_sbo, pdl=False)

        for lbo, sbo in descriptors:  # which reading of the MN-major V descriptor is right shows here
            o_part_of[name].fill_(float("nan"))
            b.out.fill_(float("nan"))  # the kernel writes the rows of one-piece sequences itself
            hopper(0, lbo, sbo)
            reduce(o_part_of[name])
            torch.cuda.synchronize()
            rec[f"rel_err_{name}_v{lbo}_{sbo}"], rec[f"nan_{name}_v{lbo}_{sbo}"] = harness.check(b.out, ref)
        lbo, sbo = descriptors[0]
        timers[name] = lambda hopper=hopper, lbo=lbo, sbo=sbo: per(
            lambda: [hopper(r, lbo, sbo) for r in range(b.replicas)])
    timed = harness.time_in_rounds(timers, rounds)
    if rounds > 1:
        for name, (won, of) in harness.rounds_faster(timed).items():
            rec[f"faster_rounds_{name}"] = f"{won}/{of}"  # than the first variant, round by round
    for name, times in timed.items():
        rec[f"hopper_main_us_{name}"] = statistics.median(times)
        if rounds > 1:
            rec[f"rounds_us_{name}"] = times
        if "PROFILE_STAMPS" in variants[name]:  # the kernel's last launch's CTAs, stage by stage
            rec[f"stamps_{name}"] = read_stamps(kernels[name], variants[name].get("IN_KERNEL_PLAN", 0) != 0)
    lbo, sbo = descriptors[0]
    for name in variants:
        for spm in slots_per_sm[1:]:  # the same build on a plan for more CTAs than SMs (timed only)
            kern = kernels[name]
            rec[f"hopper_main_us_{name}@{spm}perSM"] = per(lambda: [
                kern.launch(*b.attention_args(r), plans[spm], o_part_of[name], lse_part, b.out, v_lbo=lbo, v_sbo=sbo,
                            pdl=False) for r in range(b.replicas)])
    rec["hopper_main_us"] = best_main_us(rec, variants, descriptors[0], shape.kv_dtype)
    rec["hopper_reduce_us"] = per(lambda: [reduce() for _ in range(b.replicas)])
    if any(o.dtype != o_part.dtype for o in o_part_of.values()):  # the reduce on the other builds' partials too
        other = next(o for o in o_part_of.values() if o.dtype != o_part.dtype)
        rec[f"hopper_reduce_us_{str(other.dtype).removeprefix('torch.')}"] = per(
            lambda: [reduce(other) for _ in range(b.replicas)])
    reducers = {name: functools.partial(K.launch_reduce, skip_whole=True, **kw)
                for name, kw in (reduce_variants or {}).items()}
    if cuda_reduces:
        from vattn.hopper.reduce import ReduceSm90

        reducers |= {f"cuda{'_'.join(map(str, c))}": ReduceSm90(shape.head_dim, *c) for c in cuda_reduces}
    if reducers:  # the reduce's launch shapes, on the first variant's partials (checked, then timed)
        kern = next(iter(kernels.values()))
        for name, fn in reducers.items():
            red = lambda fn=fn: fn(o_part, lse_part, plan["seq_part_start"], b.cu, b.out, gqa=gqa, max_q_len=qlen,
                                   pdl=False)
            b.out.fill_(float("nan"))
            kern.launch(*b.attention_args(0), plan, o_part, lse_part, b.out, v_lbo=descriptors[0][0],
                        v_sbo=descriptors[0][1])
            red()
            torch.cuda.synchronize()
            rec[f"rel_err_reduce_{name}"], _ = harness.check(b.out, ref)
            rec[f"reduce_us_{name}"] = per(lambda: [red() for _ in range(b.replicas)])
    if chain:  # the plan kernel, each real build's main kernel and the reduce in one graph, with and without PDL;
        # the first real build also with each reduce variant
        real = [n for n in kernels if not _timing_only(variants[n])]
        for name in real:
            # a build that plans itself runs with every reduce variant: its reduce must read seq_part_start late
            ik = variants[name].get("IN_KERNEL_PLAN", 0) != 0
            for rname, kw in [("", {})] + [(f"_{r}", fn) for r, fn in reducers.items() if name == real[0] or ik]:
                rec.update({f"{k}_{name}{rname}": v for k, v in chain_us(
                    shape, b, ref, plan, kernels[name], o_part_of[name], lse_part, gqa, qlen, descriptors[0], replays,
                    overhead, kw, heads, in_kernel=ik).items()})
    ws = _workspace(shape, b, None)
    times, _ = _time_planner(shape, "balanced", b, ws, replays)
    rec.update({f"triton_{k}": v for k, v in times.items()})
    rec["hopper_main_tbps"] = shape.kv_bytes / rec["hopper_main_us"] / 1e6 if rec["hopper_main_us"] else None
    rec["triton_main_tbps"] = shape.kv_bytes / rec["triton_main_us"] / 1e6
    rec["device"] = torch.cuda.get_device_name(0)
    rec["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return rec


def chain_us(shape, b, ref, plan, kern, o_part, lse_part, gqa: int, qlen: int, descriptor: tuple,
             replays: int, overhead: int, reduce_kw=None, heads: int | None = None, in_kernel: bool = False) -> dict:
    """plan + main + reduce per call, in one graph, as vattn.attention runs them on the Hopper path (pdl: the main
    kernel a programmatic dependent of the plan, which lets it launch at once, and the reduce (vattn's Triton
    reduce, launch_reduce's defaults, or reduce_kw: the backend's own where it serves is `--cuda-reduce 8:8:128`) of
    the main kernel), with the reduce's alone (reducepdl) and as ordinary launches
    (nopdl); each checked. Where the chain's time over the main kernel's goes: the main kernel on the plan
    already made, then the reduce as its dependent (mainreduce, checked), and the plan then the main kernel as
    its dependent without a reduce (planmain, timed only: it leaves split sequences' rows unmerged), pdl on the fixed
    planner's plan (pdlfixed: on a uniform batch balanced's pieces without its cap search), and the plan kernel
    alone, balanced and fixed. heads: the CTAs of a work item (KV heads / pack_heads; default the shape's KV heads),
    gqa the query heads of each. reduce_kw: launch_reduce's keyword arguments, or a reduce called as launch_reduce
    (skip_whole implied).
    in_kernel: a build with IN_KERNEL_PLAN (it plans itself and writes seq_part_start): no plan kernel; the reduce as
    an ordinary launch (iknopdl) and, where it reads seq_part_start after its wait (ReduceSm90's after_wait,
    launch_reduce's indices_after_wait), as the main kernel's programmatic dependent (ikpdl); seq_part_start and
    num_items checked against the plan's."""
    import functools

    import torch

    from vattn import kernel as K
    from vattn.planner import plan_gpu

    out_plan = dict(plan) | {"num_items": torch.zeros(1, dtype=torch.int32, device="cuda")}
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    lbo, sbo = descriptor
    reduce = reduce_kw if callable(reduce_kw) else functools.partial(K.launch_reduce, skip_whole=True,
                                                                     **(reduce_kw or {}))
    rec = {}
    stages = (("pdl", True, True, True, True), ("reducepdl", True, False, True, True),
              ("nopdl", True, False, True, False), ("mainreduce", False, False, True, True),
              ("planmain", True, True, False, False), ("pdlfixed", "fixed", True, True, True))
    if in_kernel:
        after_wait = getattr(reduce, "after_wait", False) or getattr(reduce, "keywords", {}).get("indices_after_wait")
        stages = (("ikpdl", False, True, True, True),) * bool(after_wait) + (
            ("iknopdl", False, False, True, False),)
    for name, with_plan, main_pdl, with_reduce, pdl in stages:
        def call(r, with_plan=with_plan, main_pdl=main_pdl, with_reduce=with_reduce, pdl=pdl):
            if with_plan:
                plan_gpu(b.seq_lens, b.cu, num_kv_heads=heads or shape.num_kv_heads, slots=sm,
                         mode="fixed" if with_plan == "fixed" else "balanced", out=out_plan, overhead=overhead,
                         let_next_launch=main_pdl)
            kern.launch(*b.attention_args(r), out_plan if with_plan or in_kernel else plan, o_part, lse_part, b.out,
                        v_lbo=lbo, v_sbo=sbo, pdl=main_pdl)
            if with_reduce:
                reduce(o_part, lse_part, out_plan["seq_part_start"], b.cu, b.out, gqa=gqa, max_q_len=qlen, pdl=pdl)

        b.out.fill_(float("nan"))
        if in_kernel:
            out_plan["seq_part_start"].fill_(-7)
            out_plan["num_items"].fill_(-7)
        call(0)
        torch.cuda.synchronize()
        if in_kernel:
            rec[f"ik_plan_ok_{name}"] = bool(torch.equal(out_plan["seq_part_start"], plan["seq_part_start"])
                                             and torch.equal(out_plan["num_items"], plan["num_items"]))
        if with_reduce:
            rec[f"rel_err_chain_{name}"], rec[f"nan_chain_{name}"] = harness.check(b.out, ref)
        rec[f"chain_us_{name}"] = harness.timed_graph(lambda: [call(r) for r in range(b.replicas)], replays) / b.replicas
    for mode in ("balanced", "fixed") * (not in_kernel):  # the plan kernel alone, back to back
        rec[f"plan_alone_us_{mode}"] = harness.timed_graph(lambda: [plan_gpu(
            b.seq_lens, b.cu, num_kv_heads=heads or shape.num_kv_heads, slots=sm, mode=mode, out=out_plan,
            overhead=overhead) for _ in range(b.replicas)], replays) / b.replicas
    return rec


# PROFILE_STAMPS builds: what each slot of main_sm90.cu's vattn_stamps marks (clock64 of one thread of the CTA),
# STAMP_ROW slots a CTA; slots 14 and 15 are %globaltimer at the CTA's start and end
STAMP_ROW = 30
STAMP_SLOTS = {1: "work item read", 2: "barriers initialised", 3: "Q arrived", 4: "Q split and stored",
               5: "K(0) landed", 6: "S(0) done", 7: "V(0) widened", 8: "P.V done", 16: "next kernel let launch",
               17: "result staged", 9: "result stored", 10: "copy: pages read", 11: "copy: tile 0 issued",
               12: "widen: tile 0 landed", 13: "widen: V(0) widened", 18: "tile 16: top", 19: "tile 16: S issued",
               20: "tile 16: last P.V issued", 21: "tile 16: S done", 22: "tile 16: softmax done",
               23: "tile 16: P packed", 24: "tile 17: top", 25: "tile 17: S issued", 26: "tile 17: last P.V issued",
               27: "tile 17: S done", 28: "tile 17: softmax done", 29: "tile 17: P packed"}
# a steady-state iteration of the consumer loop (main_sm90.cu STAMP_LOOP): tile 16 by thread 0, tile 17 by thread
# 256 (the second consumer warpgroup's first thread, where there is one)
LOOP_SLOTS = (18, 19, 20, 21, 22, 23)
SECOND_LOOP_SLOTS = (24, 25, 26, 27, 28, 29)
# an IN_KERNEL_PLAN build stamps its plan's steps in the second warpgroup's slots (it has one consumer warpgroup)
PLAN_SLOTS = {24: "plan: lengths loaded", 25: "plan: totals", 28: "plan: first search round", 26: "plan: cap",
              27: "plan: item"}


def loop_stage_cycles(ctas: list, slots: tuple = LOOP_SLOTS) -> dict:
    """One steady-state iteration of the consumer loop, stage by stage: for each pair of consecutive slots, the
    median over the CTAs that stamped them all of the SM cycles between the two (clock64 counts cycles)."""
    import statistics

    looped = [c for c in ctas if all(c[slot] for slot in slots)]
    return {f"{STAMP_SLOTS[a]} -> {STAMP_SLOTS[b].split(': ')[1]}": statistics.median(c[b] - c[a] for c in looped)
            for a, b in zip(slots, slots[1:])} if looped else {}


def second_warpgroup_timeline(ctas: list) -> dict:
    """Two consumer warpgroups: each of the second's stamped stages (tile 17) in SM cycles after the first's tile
    16 began (median over the CTAs that stamped both), to see whether one's softmax runs while the other issues."""
    import statistics

    both = [c for c in ctas if all(c[slot] for slot in LOOP_SLOTS + SECOND_LOOP_SLOTS)]
    return {STAMP_SLOTS[slot]: statistics.median(c[slot] - c[LOOP_SLOTS[0]] for c in both)
            for slot in SECOND_LOOP_SLOTS} if both else {}


def read_stamps(kern, in_kernel_plan: bool = False) -> dict:
    """Per stage of a PROFILE_STAMPS build's last launch: the median over its CTAs of the time since the CTA
    started, in us (clock64 at the SM clock that %globaltimer gives over the CTA's life); and the spread of the
    CTAs' starts and the kernel's span from start to the last CTA's end, by %globaltimer. in_kernel_plan: an
    IN_KERNEL_PLAN build, whose slots 24-28 are its plan's steps (PLAN_SLOTS)."""
    import ctypes
    import statistics

    import torch

    from vattn.native.cuda import driver

    torch.cuda.synchronize()
    drv = driver()
    ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
    drv.check(drv.lib.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), kern.module, b"vattn_stamps"),
              "cuModuleGetGlobal(vattn_stamps)")
    raw = (ctypes.c_uint64 * (size.value // 8))()
    drv.check(drv.lib.cuMemcpyDtoH_v2(raw, ptr, size), "cuMemcpyDtoH(vattn_stamps)")
    ctas = [raw[i:i + STAMP_ROW] for i in range(0, len(raw), STAMP_ROW) if raw[i + 14] and raw[i + 15] and raw[i + 9]]
    if not ctas:  # a kernel without the stamps of a CTA's start, end and stored result (only k8 has them)
        return {"CTAs": 0}
    ghz = statistics.median((c[9] - c[0]) / max(1, c[15] - c[14]) for c in ctas)
    names = STAMP_SLOTS | (PLAN_SLOTS if in_kernel_plan else {})
    out = {name: round(statistics.median((c[slot] - c[0]) / ghz / 1e3 for c in ctas if c[slot]), 2)
           for slot, name in names.items() if any(c[slot] for c in ctas)}
    second = () if in_kernel_plan else (("tile 17 cycles", loop_stage_cycles(ctas, SECOND_LOOP_SLOTS)),
                                        ("tile 17 after tile 16's top", second_warpgroup_timeline(ctas)))
    for key, value in (("tile 16 cycles", loop_stage_cycles(ctas)),) + second:
        if value:
            out[key] = value
    starts, ends = [c[14] for c in ctas], [c[15] for c in ctas]
    return out | {"CTAs": len(ctas), "SM GHz": round(ghz, 3), "CTA start spread": (max(starts) - min(starts)) / 1e3,
                  "kernel span": (max(ends) - min(starts)) / 1e3}


def best_main_us(rec: dict, variants: dict, descriptor: tuple, kv_dtype: str) -> float | None:
    """The fastest variant's main time among those that count: builds that compute the real thing (no
    timing-only PROFILE_ switch) and whose output, with the timed V descriptor, is within tolerance."""
    lbo, sbo = descriptor
    ok = [rec[f"hopper_main_us_{n}"] for n, defines in variants.items()
          if not _timing_only(defines)
          and harness.within_tolerance(rec[f"rel_err_{n}_v{lbo}_{sbo}"], rec[f"nan_{n}_v{lbo}_{sbo}"], kv_dtype)]
    return min(ok) if ok else None


def _timing_only(defines: dict) -> bool:
    """A build with a PROFILE_ switch: it cuts the kernel short, so only its time means anything."""
    return any(d.startswith("PROFILE_") for d in defines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="16x35k")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--descriptors", default="8192:1024,1024:8192",
                    help="V descriptor (LBO:SBO bytes) readings to check; the first is timed")
    ap.add_argument("--variants", default="base", help="kernel builds to check and time: ';'-separated "
                    "NAME[:DEFINE=VALUE,...] (extra -D constants of main_sm90.cu)")
    ap.add_argument("--slots-per-sm", default="1", help="comma-separated plan widths in CTAs per SM; the first "
                    "is checked and timed, the others timed as NAME@NperSM")
    ap.add_argument("--reduce-variants", default="", help="vattn reduce launch shapes to check and time on the "
                    "first variant's partials (and in its --chain): ';'-separated NAME:KWARG=INT,... "
                    "(kernel.launch_reduce's block_p, block_d, num_warps, block_b)")
    ap.add_argument("--chain", action="store_true", help="also time plan + main + reduce in one graph, the reduce "
                    "launched as a programmatic dependent and not (each variant without a timing-only PROFILE_ switch)")
    ap.add_argument("--overhead", type=int, default=None, help="the balanced plan's piece overhead in tiles "
                    "(default: the Hopper backend's for the shape's KV dtype)")
    ap.add_argument("--rounds", type=int, default=1, help="time the variants this many times, in alternating order; "
                    "each variant's time is its median over the rounds")
    ap.add_argument("--pack-heads", type=int, default=1, help="KV heads a CTA reads (2: head_dim 128's two heads as "
                    "one of 256, as the backend runs them where the rows fit); 1 or 2")
    ap.add_argument("--cuda-reduce", default="", help="vattn.hopper.reduce's CUDA reduce as reduce variants (the backend's, where it serves a call: 8:8:128): "
                    "comma-separated WARPS:UNROLL:SLICE[:TRIGGER[:AFTER_WAIT[:LONG_PATH]]] (warps a CTA, loads in flight a lane, "
                    "values of a row a warp; 1: lets the next kernel launch at its start; 1: reads seq_part_start after "
                    "its wait, as an IN_KERNEL_PLAN build needs; 0: no long-sequence CTAs, every sequence merged by its rows' own "
                    "warps), named cudaWARPS_UNROLL_SLICE[_TRIGGER[_AFTER_WAIT[_LONG_PATH]]]")
    ap.add_argument("--out", default="hopper-proto.json")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error(f"--rounds: got {a.rounds}; allowed: an integer >= 1")
    if a.pack_heads not in (1, 2):
        ap.error(f"--pack-heads: got {a.pack_heads}; allowed: 1 or 2")
    descriptors = [tuple(int(x) for x in d.split(":")) for d in a.descriptors.split(",")]
    try:
        variants = harness.parse_named_defines(a.variants, "--variants")
        reduce_variants = harness.parse_named_defines(a.reduce_variants, "--reduce-variants", allow_none=True)
    except ValueError as exc:
        ap.error(str(exc))
    batches = harness.BatchCache("cuda")
    records = []
    for shape in select(a.shapes):
        try:
            rec = run_shape(shape, batches, a.replays, descriptors, variants,
                            tuple(int(x) for x in a.slots_per_sm.split(",")), reduce_variants,
                            a.chain, a.overhead, a.rounds, a.pack_heads,
                            tuple(tuple(int(x) for x in c.split(":")) for c in filter(None, a.cuda_reduce.split(","))))
        except Exception as e:  # keep the other shapes' rows
            rec = dict(shape=shape.name, error=f"{type(e).__name__}: {e}")
        records.append(rec)
        print(json.dumps(rec), flush=True)
    with open(a.out, "w") as f:
        json.dump(records, f, indent=1)
    print(f"{'shape':20s} {'hopper main':>12s} {'TB/s':>6s} {'triton main':>12s} {'TB/s':>6s} {'ratio':>6s}  rel_err")
    for r in records:
        if "error" in r:
            print(f"{r['shape']:20s} error: {r['error'][:200]}")
            continue
        errs = " ".join(f"{k[8:]}={v:.1e}" for k, v in r.items() if k.startswith("rel_err"))
        stages = " ".join(f"{k[15:]}={v:.1f}" + (f" (faster in {r['faster_rounds_' + k[15:]]})"
                                                   if f"faster_rounds_{k[15:]}" in r else "")
                          for k, v in r.items() if k.startswith("hopper_main_us_"))
        stages += "".join(f" {k}={v:.1f}" for k, v in r.items() if k.startswith(("reduce_us_", "chain_us_")))
        best = r["hopper_main_us"]
        hopper = f"{best:12.1f} {r['hopper_main_tbps']:6.2f}" if best else f"{'-':>12s} {'-':>6s}"
        ratio = f"{r['triton_main_us'] / best:6.2f}" if best else f"{'-':>6s}"
        print(f"{r['shape']:20s} {hopper} {r['triton_main_us']:12.1f} {r['triton_main_tbps']:6.2f} {ratio}  "
              f"{stages} {errs}")
    for r in records:
        for key, st in r.items():
            if key.startswith("stamps_"):
                print(f"{r['shape']} {key[7:]} (us since the CTA's start, median over CTAs): "
                      + "; ".join(f"{k} {v}" for k, v in st.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
