"""`python -m benchmarks.kernel.bench`: vattn's bandwidth on KERNEL.md's shapes, by KERNEL.md's method.

- the streaming-read ceiling is measured in the same run (a Triton read of a 4 GiB buffer);
- cold L2: the KV pool holds R >= 4 replicas of the batch (together >= 4 x the L2), each read
  through its own randomly permuted page table; one captured CUDA graph runs all R calls;
- time = median over graph replays / R; plan, main and reduce are captured and timed
  separately and together (us = plan + main + reduce in one graph), and layer_us is the attention call
  alone on a plan made before, as an engine runs each layer and as the peers are timed (peers/run.py);
- each shape's output is checked against vattn.reference (rel Frobenius error);
- the paged-gather ceiling: the same batch's KV read through the same page tables by the plainest kernel
  (gather.py), timed the same way: gather_tbps, a practical ceiling for that layout.
Bandwidth = KV bytes (sum L x Hkv x D x 2 x bytes per element) / time. The measurement itself
(batches, timing, the check) is harness.py's, shared with the peers.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from benchmarks.kernel import gather, harness, peers
from benchmarks.kernel.configs import CONFIG_FIELDS, best_of_sweep, for_shape, label, parse_config, sweep_configs
from benchmarks.kernel.harness import Batch, BatchCache
from benchmarks.kernel.report import format_table, markdown_table, rounds_table
from benchmarks.kernel.shapes import FLASHINFER_BEST_US, FLASHINFER_FP8_US, Shape, host_shapes, select, tiny_shapes
from vattn import switch
from vattn.planner import DEFAULT_PLANNER, PLANNERS

# the default (balanced) first, then the others, the MI355X reference's (fixed) last
PLANNER_ORDER = (DEFAULT_PLANNER,) + tuple(p for p in reversed(PLANNERS) if p != DEFAULT_PLANNER)


def _workspace(shape: Shape, batch: Batch, config):
    import vattn

    return vattn.Workspace(head_dim=shape.head_dim, num_q_heads=shape.num_q_heads,
                           num_kv_heads=shape.num_kv_heads, kv_dtype=batch.kv_dtype, q_dtype=batch.q.dtype,
                           page_size=shape.page_size, max_q_len=max(shape.q_lens), max_batch=shape.batch,
                           config=config)


def _time_planner(shape: Shape, mode: str, b: Batch, ws, replays: int):
    """(us of plan, main, reduce and all three in one graph, per replica; the planning call). The main
    kernel is the one vattn.attention dispatches this batch to (vattn.api.select_backend)."""
    import vattn
    from vattn import api
    from vattn import kernel as K

    on_gpu = b.device == "cuda"

    def do_plan():
        return vattn.plan(b.seq_lens, b.cu, num_kv_heads=shape.num_kv_heads, page_size=shape.page_size,
                          mode=mode, workspace=ws)

    pl = do_plan()
    backend = api.select_backend(ws, b.q, b.k)
    # the main kernel alone as an ordinary launch: as a programmatic dependent of the plan (Backend.pdl), each
    # replica's would start in the tail of the one before
    main = (backend.bind_main or api.TRITON.bind_main)(*b.attention_args(0), pl,
                                                       **({"pdl": False} if backend.pdl else {}))

    def main_all():
        for r in range(b.replicas):
            main(*b.attention_args(r)[:8], b.out)

    o_part, lse_part, gqa = ws.partials(by_program=backend is not api.TRITON)

    def reduce_all():
        for _ in range(b.replicas):
            K.launch_reduce(o_part, lse_part, pl.tensors["seq_part_start"], b.cu, b.out, gqa=gqa,
                            max_q_len=ws.max_q_len, skip_whole=backend.writes_whole)

    def full_all():
        for r in range(b.replicas):
            if on_gpu:  # the plan kernel is part of the captured call; the CPU twin plans outside it
                do_plan()
            vattn.attention(*b.attention_args(r), plan=pl, out=b.out)

    def layer_all():  # one layer's call: the batch's plan made once before, as the peers' plans are
        for r in range(b.replicas):
            vattn.attention(*b.attention_args(r), plan=pl, out=b.out)

    def per_replica(fn):
        return harness.timed_graph(fn, replays, b.device) / b.replicas

    times = dict(main_us=per_replica(main_all), reduce_us=per_replica(reduce_all), us=per_replica(full_all),
                 layer_us=per_replica(layer_all))
    if on_gpu:
        times["plan_us"] = per_replica(lambda: [do_plan() for _ in range(b.replicas)])
    else:
        times["plan_us"] = harness.host_us(do_plan, 5, sync=False, warmup=False)
    # the records' column order: us, plan, main, reduce, layer
    return {k: times[k] for k in ("us", "plan_us", "main_us", "reduce_us", "layer_us")}, do_plan


def bench_shape(shape: Shape, planners, batches: BatchCache, *, replays: int, config=None,
                check: bool = True) -> list[dict]:
    """Time every planner on one shape; one record per planner (without device/date/ceiling)."""
    import vattn

    b = batches.get(shape)
    ws = _workspace(shape, b, config)
    ref = b.reference() if check else None
    records = []
    for mode in planners:
        times, do_plan = _time_planner(shape, mode, b, ws, replays)
        pl = do_plan()  # the workspace holds one plan: this shape's, for this planner
        rel_err, nan = None, None
        if check:
            rel_err, nan = harness.check(vattn.attention(*b.attention_args(0), plan=pl), ref)
        records.append(_record(shape, mode, pl, ws, b, times, rel_err, nan))
        if b.device == "cuda":
            import torch

            torch.cuda.synchronize()
    # a practical ceiling for this batch's paged layout, by the same method (gather.py), measured once per batch
    # (a sweep times many configs on one); a reference, so its failure must not lose vattn's rows
    if b.gather_us is None:
        try:
            b.gather_us = gather.gather_us(shape, b, replays)
        except Exception as exc:
            print(f"gather ceiling on {shape.name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return records
    for r in records:
        r.update(gather_us=b.gather_us, gather_tbps=shape.kv_bytes / b.gather_us / 1e6)
    return records


def _record(shape: Shape, mode: str, pl, ws, b: Batch, times: dict, rel_err, nan) -> dict:
    fi = FLASHINFER_FP8_US.get(shape.name)
    return dict(
        harness.shape_fields(shape, "vattn", mode), **times,
        tbps=shape.kv_bytes / times["us"] / 1e6, main_tbps=shape.kv_bytes / times["main_us"] / 1e6,
        backend=_backend_name(ws, b), plan_on_gpu=b.device == "cuda", num_items=int(pl.tensors["num_items"].item()),
        slots=ws.slots,
        config=ws.config.__dict__, qk=ws.qk, programs_per_sm=ws.programs_per_sm, kernel_info=ws.kernel_info,
        replicas=b.replicas, l2_cold=b.l2_cold, rel_err=rel_err, nan=nan,
        flashinfer_fp8_us=fi, speedup_vs_flashinfer_fp8=(fi / times["us"]) if fi else None,
        flashinfer_best_us=FLASHINFER_BEST_US.get(shape.name),
        # a skewed batch's lengths, so the cost model can be checked against it (vattn/cost.py)
        seq_lens=list(shape.seq_lens) if len(set(shape.seq_lens)) > 1 else None)


def _backend_name(ws, b: Batch) -> str:
    from vattn import api

    return api.select_backend(ws, b.q, b.k).name


def sglang_baseline() -> tuple[list[str], str]:
    """Without --peers, sglang's Triton kernels are timed as the baseline whenever sglang imports."""
    why = peers.sglang_importable()
    if why:
        return [], f"sglang baseline skipped: not importable ({why})"
    return ["sglang_triton"], "sglang baseline: sglang_triton (benchmarks/kernel/peers/sglang_peer.py)"


def default_peers() -> tuple[list[str], str]:
    """Without --peers: the sglang baseline (above), and TensorRT-LLM's XQA whenever FlashInfer >= 0.7 imports."""
    names, note = sglang_baseline()
    why = peers.xqa_importable()
    if why:
        return names, f"{note}; xqa skipped: not importable ({why})"
    return names + ["xqa"], f"{note}; xqa (benchmarks/kernel/peers/xqa_peer.py)"


def _run_one(shape, planners, batches, replays, config, check, impl=None) -> list[dict]:
    try:
        recs = bench_shape(shape, planners, batches, replays=replays, config=config, check=check)
    except Exception as exc:  # one broken shape/config must not lose the rest of the run
        print(f"FAILED {shape.name} {config}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return [dict(shape=shape.name, impl=impl or "vattn", planner=p, error=f"{type(exc).__name__}: {exc}")
                for p in planners]
    if impl:
        for r in recs:
            r["impl"] = impl
    return recs


def _run_rounds(shape, planners, batches, replays, config, check, rounds: int) -> list[dict]:
    """vattn's planners on one shape, `rounds` times in turns (harness.alternating_rounds: the order reversed every
    other round, so that a board heating over the run weighs on each planner alike); with rounds > 1 each record
    carries its round."""
    if rounds == 1:
        return _run_one(shape, planners, batches, replays, config, check)
    records = []
    for i, mode in enumerate(harness.alternating_rounds(list(planners), rounds)):
        for r in _run_one(shape, [mode], batches, replays, config, check):
            records.append(dict(r, round=i // len(planners)))
    return records


def _run_peers(shape, names, batches: BatchCache, replays, skipped: dict) -> list[dict]:
    """The peers on the batch vattn just ran (same pool, page tables, Q and descales)."""
    if not names:
        return []
    try:
        return peers.bench_peers(shape, batches.get(shape), names, replays=replays, skipped=skipped,
                                 timed_graph=lambda fn, n: harness.timed_graph(fn, n, batches.device))
    except Exception as exc:  # the peers must not lose vattn's rows
        print(f"FAILED peers on {shape.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return [dict(shape=shape.name, impl="peers", planner="-", error=f"{type(exc).__name__}: {exc}")]


def _parse_peers(text: str) -> list[str]:
    try:
        return peers.parse_peers(text)
    except ValueError as exc:
        raise SystemExit(str(exc))


def _parse_planners(text: str) -> list[str]:
    planners = [p.strip() for p in text.split(",") if p.strip()]
    for p in planners:
        if p not in PLANNER_ORDER:
            raise SystemExit(f"--planners: got {p!r}; allowed: {', '.join(PLANNER_ORDER)}")
    return planners


@dataclass(frozen=True)
class RunInfo:
    """Where, when and by which command a run measured, and its read ceiling: stamped on every record."""

    device: str
    date: str
    ceiling: float
    command: str

    def stamp(self, r: dict) -> dict:
        return harness.stamp(dict(r, command=self.command), self.device, self.date, self.ceiling)

    def print_row(self, r: dict) -> None:
        print(format_table([self.stamp(r)]).splitlines()[-1], flush=True)


def _sweep(a, batches: BatchCache, info: RunInfo) -> list[dict]:
    """--sweep: every main-kernel variant on the sweep's shapes (balanced planner), before the main run."""
    pairs = [(shape, c) for shape in (select(a.sweep) if a.sweep else []) for c in sweep_configs()
             if shape.kv_dtype == "fp8" or not c.qk_fp8]
    precompile(pairs)
    records = []
    for shape, c in pairs:
        records += _run_one(shape, ["balanced"], batches, a.replays, c, not a.no_check, impl=label(c))
        info.print_row(records[-1])
    return records


def _run(a, argv=None) -> int:
    """The measurement on a CUDA device: sweep (if asked), then every shape with vattn and the peers."""
    planners, shapes, names = _parse_planners(a.planners), select(a.shapes or "main,variants"), _parse_peers(a.peers)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("python -m benchmarks.kernel.bench needs a CUDA GPU (torch.cuda.is_available() is False)")
    date, command = harness.provenance("benchmarks.kernel.bench", argv)
    info = RunInfo(torch.cuda.get_device_name(), date, harness.read_ceiling_tbps(), command)
    print(f"device {info.device}; read ceiling {info.ceiling:.2f} TB/s; {date}", flush=True)
    note = f"peers: {', '.join(names)}" if names else ""
    if not names:
        names, note = default_peers()
    print(note, flush=True)
    if names:
        peers.prewarm(shapes, names)
    batches, skipped = BatchCache("cuda"), {}
    config = parse_config(a.config)
    records = [info.stamp(r) for r in _sweep(a, batches, info)]
    if a.use_sweep_best:
        config = best_of_sweep(records) or config
        print(f"--use-sweep-best: {config}", flush=True)
    for shape in shapes:
        new = _run_rounds(shape, planners, batches, a.replays, for_shape(config, shape), not a.no_check, a.rounds)
        new = [info.stamp(r) for r in new + _run_peers(shape, names, batches, a.replays, skipped)]
        records += new
        for r in new:
            info.print_row(r)
        harness.save_records(a.out, records)  # after every shape: a run cut short keeps what it measured
    print("\n" + format_table(records))
    if a.rounds > 1:
        print("\n" + rounds_table(records))
    note += "".join(f"\npeer {why}; skipped" for why in skipped.values())
    print(f"\n{note}\nwrote {len(records)} records to {a.out}")
    return 0


def _host_overhead(a) -> int:
    """--host-overhead: host time (us) per eager vattn call on tiny batches, and its parts: how much is
    vattn's Python (the call-signature lookup) and how much the three launches as the call makes them
    (vattn.launcher's bound launches into Triton's compiled launcher); a graph replay for scale."""
    from vattn.workspace import interpreting

    device = "cpu" if a.dry_run else "cuda"
    if device == "cpu" and not interpreting():
        raise SystemExit("--host-overhead --dry-run: set TRITON_INTERPRET=1 (the kernels run in Triton's interpreter)")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--host-overhead needs a CUDA GPU (or --dry-run on a CPU, whose times mean nothing)")
    shapes = select(a.shapes) if a.shapes else (tiny_shapes() if a.dry_run else host_shapes())
    launchers = [x.strip() for x in a.launchers.split(",") if x.strip()]
    if not harness.launchers_ok(launchers):
        raise SystemExit(f"--launchers: got {a.launchers!r}; allowed: native, triton (comma-separated, each at most once)")
    records = [r for s in shapes for mode in _parse_planners(a.planners)
               for r in harness.host_overhead(s, device, a.host_calls, mode, tuple(launchers))]
    cols = [f"{p}_host_us" for p in harness.HOST_PARTS] + ["attention_unbounded_host_us", "device_us"]
    print("host us per eager call, planned with max_seq_len (attention_unbounded: without it); launch_*: "
          "the launches as the call makes them; python = call - its launches (the reduce's only where it is made)")
    print(f"{'shape':>16s} {'planner':>12s} {'launcher':>8s} "
          + " ".join(f"{c[:-3].removesuffix('_host'):>13s}" for c in cols) + f" {'python':>8s}")
    for r in records:
        launches = [r.get(f"launch_{k}_host_us") for k in ("plan", "main") + (() if r["reduce_skipped"] else ("reduce",))]
        python = f"{r['call_host_us'] - sum(launches):8.1f}" if None not in launches else f"{'-':>8s}"
        print(f"{r['shape']:>16s} {r['planner']:>12s} {r['launcher']:>8s} " + " ".join(
            f"{r[c]:13.1f}" if c in r else f"{'-':>13s}" for c in cols) + f" {python}  {r['backend']}"
              + ("  (no reduce)" if r["reduce_skipped"] else ""), flush=True)
    harness.save_records(a.out, records)
    print(f"wrote {len(records)} records to {a.out}")
    return 0


def _dry_run(a) -> int:
    """--dry-run: the same code paths on a CPU under Triton's interpreter, on tiny shapes."""
    from vattn.workspace import interpreting

    if not interpreting():
        raise SystemExit("--dry-run: set TRITON_INTERPRET=1 (the kernels run in Triton's interpreter)")
    planners = [p.strip() for p in a.planners.split(",") if p.strip()]
    names, skipped, batches = _parse_peers(a.peers), {}, BatchCache("cpu")
    config = parse_config(a.config)
    records = [harness.stamp(r, "cpu-interpreter", "dry-run", 1.0) for s in tiny_shapes()
               for r in _run_rounds(s, planners, batches, 1, config, True, a.rounds)
               + _run_peers(s, names, batches, 1, skipped)]
    harness.save_records(a.out, records)
    print(format_table(records))
    if a.rounds > 1:
        print("\n" + rounds_table(records))
    return 1 if any("error" in r and not r["error"].startswith("skipped:") for r in records) else 0


def _prebuild(a) -> int:
    """--prebuild DIR: the Hopper main kernels the shapes' VATTN_HOPPER=1 calls take, and their CUDA reduce,
    compiled into DIR on any machine with nvcc (vattn.hopper.prebuild's, by the backend's own rules: each shape's
    batch is one model's call of its longest q_len), for a GPU machine to read from VATTN_CACHE instead of compiling
    at first use."""
    from pathlib import Path

    from vattn.hopper import backend, build, reduce
    from vattn.hopper.prebuild import compile_build, compile_reduce
    from vattn.native import cuda

    cuda.CACHE = Path(a.prebuild)
    builds: dict[tuple, dict] = {}
    reduce_head_dims: set[int] = set()
    for s in select(a.shapes or "main,variants"):
        args = backend.model_build(s.kv_dtype, s.head_dim, s.num_q_heads, s.num_kv_heads, s.page_size, max(s.q_lens),
                                   switch.qk_mode())
        if args is None:
            print(f"{s.name}: not covered by the Hopper kernels (vattn runs Triton there)", flush=True)
            continue
        defines = build.main_defines(**args)
        builds.setdefault(tuple(sorted(defines.items())), defines)
        if s.head_dim % reduce.SLICE == 0:
            reduce_head_dims.add(s.head_dim)
    for defines in builds.values():
        print(compile_build(defines), flush=True)
    for head_dim in sorted(reduce_head_dims):
        print(compile_reduce(head_dim), flush=True)
    print(f"{len(builds)} main builds and {len(reduce_head_dims)} reduce builds in {cuda.CACHE}")
    return 0


def precompile(pairs) -> None:
    """Compile the main kernel of every (shape, config) side by side, one process each, into Triton's
    on-disk cache, so that the timed sweep after it does not compile one variant at a time."""
    if len(pairs) < 2:
        return
    t0 = time.perf_counter()
    workers = min(len(pairs), os.cpu_count() or 1)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        failed = [msg for msg in pool.map(_compile_one, pairs) if msg]
    for msg in failed:  # the sweep records the failure again, as that variant's error row
        print(f"precompile: {msg}", file=sys.stderr)
    print(f"precompiled {len(pairs)} variants in {time.perf_counter() - t0:.0f} s on {workers} processes", flush=True)


def _compile_one(pair) -> str | None:
    shape, config = pair
    try:
        import vattn

        vattn.Workspace(head_dim=shape.head_dim, num_q_heads=shape.num_q_heads, num_kv_heads=shape.num_kv_heads,
                        kv_dtype=harness.kv_torch_dtype(shape), q_dtype=harness.q_dtype("cuda"),
                        page_size=shape.page_size, max_q_len=max(shape.q_lens), max_batch=shape.batch, config=config)
    except Exception as exc:
        return f"{shape.name} {label(config)}: {type(exc).__name__}: {exc}"
    return None


def _print_peer_table(paths: str, runs: str) -> int:
    records = []
    for path in paths.split(","):  # e.g. the FlashInfer call's JSON and the sglang call's
        with open(path) as f:
            records += json.load(f)
    prefixes = tuple(p.strip() for p in runs.split(",") if p.strip())
    if prefixes:
        records = [r for r in records if r.get("run", "").startswith(prefixes)]
        if not records:
            raise SystemExit(f"--runs: got {runs!r}; no record's run label starts with it")
    print(peers.peer_table(records))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernel.bench", description=__doc__.split("\n")[0]
                                 + " Needs a CUDA GPU (it times captured CUDA graphs); without one only --dry-run "
                                 "runs (CPU, TRITON_INTERPRET=1, tiny shapes, no meaningful times).")
    ap.add_argument("--shapes", default=None, help="main | variants | grid | skew | host | paired | all | "
                    "comma-separated shape names (default main,variants; with --host-overhead: host)")
    ap.add_argument("--planners", default=",".join(PLANNER_ORDER),
                    help=f"comma-separated subset of {','.join(PLANNER_ORDER)}")
    ap.add_argument("--replays", type=int, default=30, help="timed graph replays per measurement (median)")
    ap.add_argument("--rounds", type=int, default=1, help="time vattn's planners this many rounds per shape, in "
                    "turns (the order reversed every other round); each record carries its round, and a table of "
                    "medians and of the rounds each planner beat the first follows (default 1)")
    ap.add_argument("--config", default=None, help=f"main-kernel config {CONFIG_FIELDS}")
    ap.add_argument("--sweep", default="", help="shapes to sweep main-kernel configs on (balanced planner) "
                    "before the main run, e.g. 16x35k")
    ap.add_argument("--use-sweep-best", action="store_true", help="run the shapes with the sweep's fastest "
                    "config whose rel_err meets KERNEL.md's tolerance (warps still follow each shape's rows)")
    ap.add_argument("--peers", default="", help="comma-separated peers timed on the same batches after vattn: "
                    f"{','.join(peers.PEERS)} (benchmarks/kernel/peers/); default: sglang_triton and xqa, "
                    "each where its library imports")
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with vattn.reference")
    ap.add_argument("--out", default="vattn-bench.json", help="JSON list of records (default vattn-bench.json)")
    ap.add_argument("--dry-run", action="store_true", help="CPU under TRITON_INTERPRET=1 on tiny shapes: "
                    "checks the bench's plumbing; its timings mean nothing")
    ap.add_argument("--host-overhead", action="store_true", help="host time per eager call (plan + attention) and "
                    "its parts (vattn's Python; the plan, main and reduce launches through vattn.launcher; a graph "
                    "replay) on tiny batches; no bandwidth")
    ap.add_argument("--host-calls", type=int, default=400, help="with --host-overhead: calls timed per part")
    ap.add_argument("--launchers", default="native,triton", help="with --host-overhead: how vattn's Triton kernels "
                    "launch once bound: native (launch.cpp's PointerLaunch), triton (Triton's own launcher); default "
                    "both, each part timed with the two taking turns")
    ap.add_argument("--prebuild", default=None, metavar="DIR", help="compile the Hopper kernels the shapes' "
                    "VATTN_HOPPER=1 calls take into DIR (any machine with nvcc; point VATTN_CACHE at it) and exit")
    ap.add_argument("--markdown", default=None, metavar="JSON", help="print a markdown table of a bench JSON's "
                    "rows (those marked default_config when any are), then --rounds' table where rows carry rounds, "
                    "and exit")
    ap.add_argument("--peer-table", default=None, metavar="JSON", help="print issue 8's vattn-vs-peers markdown "
                    "table of bench JSONs run with --peers (comma-separated paths), and exit")
    ap.add_argument("--runs", default="", help="with --peer-table: keep the records whose `run` label starts with "
                    "one of these comma-separated prefixes (a JSON may hold several runs)")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error(f"--rounds: got {a.rounds}; allowed: a positive integer")
    if a.peer_table:
        return _print_peer_table(a.peer_table, a.runs)
    if a.markdown:
        with open(a.markdown) as f:
            records = json.load(f)
        print(markdown_table(records))
        if any("round" in r for r in records):
            print("\n" + rounds_table(records))
        return 0
    if a.prebuild:
        return _prebuild(a)
    if a.host_overhead:
        return _host_overhead(a)
    if a.dry_run:
        return _dry_run(a)
    return _run(a, argv)


if __name__ == "__main__":
    sys.exit(main())
