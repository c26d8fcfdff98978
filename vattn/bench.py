"""`python -m vattn.bench`: vattn's bandwidth on KERNEL.md's shapes, by KERNEL.md's method.

- the streaming-read ceiling is measured in the same run (a Triton read of a 4 GiB buffer);
- cold L2: the KV pool holds R >= 4 replicas of the batch (together >= 4 x the L2), each read
  through its own randomly permuted page table; one captured CUDA graph runs all R calls;
- time = median over graph replays / R; plan, main and reduce are captured and timed
  separately and together (us = plan + main + reduce in one graph);
- each shape's output is checked against vattn.reference (rel Frobenius error).
Bandwidth = KV bytes (sum L x Hkv x D x 2 x bytes per element) / time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from dataclasses import replace

from vattn.bench_report import format_table, markdown_table
from vattn.bench_shapes import FLASHINFER_BEST_US, FLASHINFER_FP8_US, Shape, select

L2_BYTES = 60e6
DEVICE = "cuda"  # "cpu" under --dry-run (TRITON_INTERPRET=1, tiny shapes)
PLANNER_ORDER = ("balanced", "length_aware", "fixed")


def _q_dtype():
    import torch

    # the interpreter's bf16 dots are wrong (KERNEL.md): dry runs use fp16 Q
    return torch.bfloat16 if DEVICE == "cuda" else torch.float16


def _timed_graph(fn, replays: int) -> float:
    """Capture fn once, replay it; median device time of one replay in us."""
    import torch

    if DEVICE == "cpu":  # --dry-run: the interpreter checks the plumbing, timings mean nothing
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up (compiles, first-touch) outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def read_ceiling_tbps(gib: float = 4.0) -> float:
    """Streaming read of a fresh buffer far larger than L2 (best of a Triton read and torch.sum)."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _read(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
        base = tl.program_id(0).to(tl.int64) * BLOCK * ITERS
        acc = tl.zeros([BLOCK], tl.int32)
        for i in range(ITERS):
            offs = base + i * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + offs, mask=offs < n, other=0)
        tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))

    n = int(gib * 2**30) // 4
    x = torch.randint(0, 1 << 20, (n,), dtype=torch.int32, device="cuda")
    block, iters = 2048, 16
    grid = triton.cdiv(n, block * iters)
    out = torch.empty(grid, dtype=torch.int32, device="cuda")
    try:
        t_triton = triton.testing.do_bench(lambda: _read[(grid,)](x, out, n, BLOCK=block, ITERS=iters, num_warps=8),
                                           warmup=50, rep=300, return_mode="median")
    except Exception as exc:  # the ceiling must not stop the run: torch.sum's read remains
        print(f"read ceiling: Triton read failed ({exc!r}); using torch.sum only", file=sys.stderr)
        t_triton = float("inf")
    t_torch = triton.testing.do_bench(lambda: x.sum(), warmup=50, rep=300, return_mode="median")
    return n * 4 / (min(t_triton, t_torch) * 1e-3) / 1e12


class Batch:
    """Device tensors of one shape: R replicas of the KV in one pool, R permuted page tables."""

    def __init__(self, shape: Shape, seed: int = 0):
        import torch

        gen = torch.Generator(device=DEVICE).manual_seed(seed)
        p, hkv, d = shape.page_size, shape.num_kv_heads, shape.head_dim
        self.kv_dtype = self.kv_torch_dtype(shape)
        pages = [-(-n // p) for n in shape.seq_lens]
        per_replica = max(1, sum(pages))
        self.replicas = max(4, min(256, math.ceil(4 * L2_BYTES / max(shape.kv_bytes, 1))))
        if DEVICE == "cpu":  # dry run: the interpreter is slow, and there is no L2 to defeat
            self.replicas = 2
        self.l2_cold = self.replicas * shape.kv_bytes >= 4 * L2_BYTES
        pool_pages = self.replicas * per_replica
        self.k = _random_cache(pool_pages, p, hkv, d, self.kv_dtype, gen)
        self.v = _random_cache(pool_pages, p, hkv, d, self.kv_dtype, gen)
        perm = torch.randperm(pool_pages, device=DEVICE, generator=gen).to(torch.int32)
        width = max(pages) if pages else 1
        self.tables = []
        for r in range(self.replicas):
            t = torch.zeros(shape.batch, max(width, 1), dtype=torch.int32, device=DEVICE)
            ids = perm[r * per_replica:(r + 1) * per_replica]
            first = 0
            for b, n in enumerate(pages):
                t[b, :n] = ids[first:first + n]
                first += n
            self.tables.append(t)
        self.seq_lens = torch.tensor(shape.seq_lens, dtype=torch.int32, device=DEVICE)
        cu = [0]
        for n in shape.q_lens:
            cu.append(cu[-1] + n)
        self.cu = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
        q = torch.randn(cu[-1], shape.num_q_heads, d, device=DEVICE, generator=gen)
        self.q = q.to(_q_dtype())
        self.out = torch.empty_like(self.q)
        fp8 = shape.kv_dtype == "fp8"
        self.k_descale = torch.tensor([0.9], device=DEVICE) if fp8 else None
        self.v_descale = torch.tensor([1.1], device=DEVICE) if fp8 else None
        self.scale = 1.0 / math.sqrt(d)

    @staticmethod
    def kv_torch_dtype(shape: Shape):
        import torch

        return {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16, "fp16": torch.float16}[shape.kv_dtype]


def _random_cache(pages, p, hkv, d, dtype, gen, chunk=1 << 27):
    import torch

    cache = torch.empty(pages, p, hkv, d, dtype=dtype, device=DEVICE)
    flat = cache.view(-1)
    for i in range(0, flat.numel(), chunk):
        n = min(chunk, flat.numel() - i)
        flat[i:i + n].copy_(torch.randn(n, device=DEVICE, generator=gen))
    return cache


def _host_plan_us(do_plan, repeats: int = 5) -> float:
    import time

    import torch

    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        do_plan()
        sync()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def _workspace(shape: Shape, batch: Batch, config):
    import torch

    import vattn

    return vattn.Workspace(head_dim=shape.head_dim, num_q_heads=shape.num_q_heads,
                           num_kv_heads=shape.num_kv_heads, kv_dtype=batch.kv_dtype, q_dtype=_q_dtype(),
                           page_size=shape.page_size, max_q_len=max(shape.q_lens), max_batch=shape.batch,
                           config=config)


def bench_shape(shape: Shape, planners, *, replays: int, config=None, check: bool = True) -> list[dict]:
    """Time every planner on one shape; one record per planner (without device/date/ceiling)."""
    import torch

    import vattn
    from vattn import kernel as K
    from vattn.api import P

    b = _batch_cache(shape)
    ws = _workspace(shape, b, config)
    on_gpu = hasattr(P, "plan_gpu") and DEVICE == "cuda"
    ref = vattn.reference(b.q, b.k, b.v, b.tables[0], b.seq_lens, b.cu, b.k_descale, b.v_descale,
                          b.scale) if check else None
    records = []
    for mode in planners:
        def do_plan(mode=mode):
            return vattn.plan(b.seq_lens, b.cu, num_kv_heads=shape.num_kv_heads, page_size=shape.page_size,
                              mode=mode, workspace=ws)

        pl = do_plan()
        args = lambda r: (b.q, b.k, b.v, b.tables[r], b.seq_lens, b.cu, b.k_descale, b.v_descale, b.scale)

        def main_all():
            for r in range(b.replicas):
                K.launch_main(*args(r), pl.tensors, ws.o_part, ws.lse_part, gqa=ws.gqa, max_q_len=ws.max_q_len,
                              config=ws.config)

        def reduce_all():
            for _ in range(b.replicas):
                K.launch_reduce(ws.o_part, ws.lse_part, pl.tensors["seq_part_start"], b.cu, b.out, gqa=ws.gqa,
                                max_q_len=ws.max_q_len)

        def full_all():
            for r in range(b.replicas):
                if on_gpu:
                    do_plan()
                vattn.attention(*args(r), plan=pl, out=b.out)

        t_main = _timed_graph(main_all, replays) / b.replicas
        t_reduce = _timed_graph(reduce_all, replays) / b.replicas
        t_full = _timed_graph(full_all, replays) / b.replicas
        if on_gpu:
            t_plan = _timed_graph(lambda: [do_plan() for _ in range(b.replicas)], replays) / b.replicas
        else:
            t_plan = _host_plan_us(do_plan)
        rel_err, nan = None, None
        if check:
            do_plan()
            out = vattn.attention(*args(0), plan=pl)
            nan = bool(out.isnan().any().item())
            rel_err = float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))
        times = dict(us=t_full, plan_us=t_plan, main_us=t_main, reduce_us=t_reduce)
        records.append(_record(shape, mode, pl, ws, b, times, on_gpu, rel_err, nan))
        if DEVICE == "cuda":
            torch.cuda.synchronize()
    return records


def _record(shape: Shape, mode: str, pl, ws, b: Batch, times: dict, on_gpu: bool, rel_err, nan) -> dict:
    fi = FLASHINFER_FP8_US.get(shape.name)
    return dict(
        shape=shape.name, batch=shape.batch, total_kv_tokens=shape.total_kv_tokens, head_dim=shape.head_dim,
        gqa=shape.gqa, num_kv_heads=shape.num_kv_heads, q_len=shape.q_label, page_size=shape.page_size,
        kv_dtype=shape.kv_dtype, impl="vattn", planner=mode, **times,
        tbps=shape.kv_bytes / times["us"] / 1e6, main_tbps=shape.kv_bytes / times["main_us"] / 1e6,
        plan_on_gpu=on_gpu, num_items=int(pl.tensors["num_items"].item()), slots=ws.slots,
        config=ws.config.__dict__, programs_per_sm=ws.programs_per_sm, kernel_info=ws.kernel_info,
        replicas=b.replicas, l2_cold=b.l2_cold, rel_err=rel_err, nan=nan,
        flashinfer_fp8_us=fi, speedup_vs_flashinfer_fp8=(fi / times["us"]) if fi else None,
        flashinfer_best_us=FLASHINFER_BEST_US.get(shape.name),
        # a skewed batch's lengths, so the cost model can be checked against it (vattn/cost.py)
        seq_lens=list(shape.seq_lens) if len(set(shape.seq_lens)) > 1 else None)


_BATCHES: dict = {}


def _batch_cache(shape: Shape) -> Batch:
    """One Batch alive at a time (pools are GBs); reused across a sweep of one shape."""
    key = (shape.seq_lens, shape.q_lens, shape.head_dim, shape.num_q_heads, shape.num_kv_heads,
           shape.page_size, shape.kv_dtype)
    if key not in _BATCHES:
        _BATCHES.clear()
        import torch

        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        _BATCHES[key] = Batch(shape)
    return _BATCHES[key]


def sweep_configs():
    """Main-kernel variants tried by --sweep (fp8 matrix paths only matter with fp8 KV), as (block_n, warps,
    stages, qk_fp8, prefetch_pages, kmajor, hoist_rows, split_tail, lazy_rescale). BENCHMARKS.md's version log
    has the variants measured and dropped (fp8 P.V, bf16 partials, 8 warps, block_n 32/128, PDL, interleaved
    tiles)."""
    grid = [(64, 4, 2, 2, 1, 0, 0, 0, 0), (64, 4, 2, 2, 1, 0, 1, 0, 0), (64, 4, 2, 2, 1, 0, 1, 1, 0),
            (64, 4, 2, 2, 1, 0, 1, 0, 1), (64, 4, 2, 2, 1, 0, 1, 1, 1), (64, 4, 2, 2, 1, 1, 0, 0, 0),
            (64, 4, 2, 2, 1, 1, 1, 1, 1), (64, 4, 3, 0, 0, 0, 0, 0, 0), (64, 4, 3, 0, 0, 0, 1, 0, 0),
            (64, 4, 3, 0, 0, 0, 1, 1, 1)]
    return [_config(*fields) for fields in grid]


def _config(block_n, warps, stages, qk_fp8, prefetch, kmajor=0, hoist_rows=0, split_tail=0, lazy_rescale=0):
    from vattn.kernel import MainConfig

    return MainConfig(block_n=block_n, num_warps=warps, num_stages=stages, qk_fp8=qk_fp8,
                      prefetch_pages=bool(prefetch), kmajor=bool(kmajor), hoist_rows=bool(hoist_rows),
                      split_tail=bool(split_tail), lazy_rescale=bool(lazy_rescale))


def sglang_baseline() -> tuple[list[str], str]:
    """Without --peers, sglang's Triton kernels are timed as the baseline whenever sglang imports."""
    from vattn.peers import sglang_importable

    why = sglang_importable()
    if why:
        return [], f"sglang baseline skipped: not importable ({why})"
    return ["sglang_triton"], "sglang baseline: sglang_triton (vattn/peers.py)"


def _run_one(shape, planners, replays, config, check, label=None) -> list[dict]:
    try:
        recs = bench_shape(shape, planners, replays=replays, config=config, check=check)
    except Exception as exc:  # one broken shape/config must not lose the rest of the run
        print(f"FAILED {shape.name} {config}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return [dict(shape=shape.name, impl=label or "vattn", planner=p, error=f"{type(exc).__name__}: {exc}")
                for p in planners]
    if label:
        for r in recs:
            r["impl"] = label
    return recs


def _label(c) -> str:
    return (f"vattn[bn{c.block_n},w{c.num_warps},s{c.num_stages}"
            f"{['', ',qk8', ',qk8x2'][int(c.qk_fp8)]}{',pf' if c.prefetch_pages else ''}"
            f"{',kmaj' if c.kmajor else ''}{',hoist' if c.hoist_rows else ''}{',split' if c.split_tail else ''}"
            f"{',lazy' if c.lazy_rescale else ''}]")


def _parse_config(text: str | None):
    if not text:
        return None
    try:
        values = [int(x) for x in text.split(",")]
        if not 5 <= len(values) <= 9:
            raise ValueError
        return _config(*values)
    except ValueError:
        raise SystemExit(f"--config: got {text!r}; expected block_n,num_warps,num_stages,qk_fp8,prefetch_pages"
                         "[,kmajor[,hoist_rows[,split_tail[,lazy_rescale]]]] (integers), e.g. 64,4,2,2,1,1,1,1,1")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vattn.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="main,variants",
                    help="main | variants | grid | all | comma-separated shape names (default main,variants)")
    ap.add_argument("--planners", default=",".join(PLANNER_ORDER), help="comma-separated subset of "
                    "balanced,length_aware,fixed")
    ap.add_argument("--replays", type=int, default=30, help="timed graph replays per measurement (median)")
    ap.add_argument("--config", default=None, help="main-kernel config block_n,warps,stages,qk_fp8,prefetch_pages"
                    "[,kmajor[,hoist_rows[,split_tail[,lazy_rescale]]]]")
    ap.add_argument("--sweep", default="", help="shapes to sweep main-kernel configs on (balanced planner) "
                    "before the main run, e.g. 16x35k")
    ap.add_argument("--use-sweep-best", action="store_true", help="run the shapes with the sweep's fastest "
                    "config whose rel_err meets KERNEL.md's tolerance (warps still follow each shape's rows)")
    ap.add_argument("--peers", default="", help="comma-separated peers timed on the same batches after vattn: "
                    "flashinfer,flashinfer_bf16,flashinfer_fa3,fa3,sglang_triton,sdpa (vattn/peers.py)")
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with vattn.reference")
    ap.add_argument("--out", default="vattn-bench.json", help="JSON list of records (default vattn-bench.json)")
    ap.add_argument("--dry-run", action="store_true", help="CPU under TRITON_INTERPRET=1 on tiny shapes: "
                    "checks the bench's plumbing; its timings mean nothing")
    ap.add_argument("--markdown", default=None, metavar="JSON", help="print a markdown table of a bench JSON's "
                    "rows (those marked default_config when any are) and exit")
    ap.add_argument("--peer-table", default=None, metavar="JSON", help="print issue 8's vattn-vs-peers markdown "
                    "table of bench JSONs run with --peers (comma-separated paths), and exit")
    ap.add_argument("--runs", default="", help="with --peer-table: keep the records whose `run` label starts with "
                    "one of these comma-separated prefixes (a JSON may hold several runs)")
    a = ap.parse_args(argv)
    if a.peer_table:
        from vattn.peers import peer_table

        records = []
        for path in a.peer_table.split(","):  # e.g. the FlashInfer call's JSON and the sglang call's
            with open(path) as f:
                records += json.load(f)
        prefixes = tuple(p.strip() for p in a.runs.split(",") if p.strip())
        if prefixes:
            records = [r for r in records if r.get("run", "").startswith(prefixes)]
            if not records:
                raise SystemExit(f"--runs: got {a.runs!r}; no record's run label starts with it")
        print(peer_table(records))
        return 0
    if a.markdown:
        with open(a.markdown) as f:
            print(markdown_table(json.load(f)))
        return 0
    if a.dry_run:
        return _dry_run(a)
    planners = [p.strip() for p in a.planners.split(",") if p.strip()]
    for p in planners:
        if p not in PLANNER_ORDER:
            raise SystemExit(f"--planners: got {p!r}; allowed: {', '.join(PLANNER_ORDER)}")
    shapes = select(a.shapes)
    peers = _parse_peers(a.peers)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("vattn.bench needs a CUDA GPU (torch.cuda.is_available() is False)")
    device = torch.cuda.get_device_name()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    ceiling = read_ceiling_tbps()
    print(f"device {device}; read ceiling {ceiling:.2f} TB/s; {date}", flush=True)
    if peers:
        note = f"peers: {', '.join(peers)}"
    else:
        peers, note = sglang_baseline()
    print(note, flush=True)
    records, skipped = [], {}
    if peers:
        from vattn.peers import prewarm

        prewarm(shapes, peers)
    config = _parse_config(a.config)
    sweep = [(shape, c) for shape in (select(a.sweep) if a.sweep else []) for c in sweep_configs()
             if shape.kv_dtype == "fp8" or not c.qk_fp8]
    precompile(sweep)
    for shape, c in sweep:
        records += _run_one(shape, ["balanced"], a.replays, c, not a.no_check, label=_label(c))
        print(format_table([_stamp(records[-1], device, date, ceiling)]).splitlines()[-1], flush=True)
    if a.use_sweep_best:
        config = _best_of_sweep(records) or config
        print(f"--use-sweep-best: {config}", flush=True)
    for shape in shapes:
        records += _run_one(shape, planners, a.replays, _for_shape(config, shape), not a.no_check)
        new = _run_peers(shape, peers, a.replays, skipped)
        records += new
        for r in records[-len(planners) - len(new):]:
            print(format_table([_stamp(r, device, date, ceiling)]).splitlines()[-1], flush=True)
        with open(a.out, "w") as f:  # after every shape: a run cut short keeps what it measured
            json.dump([_stamp(r, device, date, ceiling) for r in records], f, indent=1)
    records = [_stamp(r, device, date, ceiling) for r in records]
    with open(a.out, "w") as f:
        json.dump(records, f, indent=1)
    print("\n" + format_table(records))
    note += "".join(f"\npeer {why}; skipped" for why in skipped.values())
    print(f"\n{note}\nwrote {len(records)} records to {a.out}")
    return 0


def _dry_run(a) -> int:
    global DEVICE
    from vattn.bench_shapes import tiny_shapes
    from vattn.workspace import interpreting

    if not interpreting():
        raise SystemExit("--dry-run: set TRITON_INTERPRET=1 (the kernels run in Triton's interpreter)")
    DEVICE = "cpu"
    planners = [p.strip() for p in a.planners.split(",") if p.strip()]
    peers, skipped = _parse_peers(a.peers), {}
    records = [_stamp(r, "cpu-interpreter", "dry-run", 1.0) for s in tiny_shapes()
               for r in _run_one(s, planners, 1, _parse_config(a.config), True) + _run_peers(s, peers, 1, skipped)]
    with open(a.out, "w") as f:
        json.dump(records, f, indent=1)
    print(format_table(records))
    return 1 if any("error" in r and not r["error"].startswith("skipped:") for r in records) else 0


def precompile(pairs) -> None:
    """Compile the main kernel of every (shape, config) side by side, one process each, into Triton's
    on-disk cache, so that the timed sweep after it does not compile one variant at a time."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

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
                        kv_dtype=Batch.kv_torch_dtype(shape), q_dtype=_q_dtype(), page_size=shape.page_size,
                        max_q_len=max(shape.q_lens), max_batch=shape.batch, config=config)
    except Exception as exc:
        return f"{shape.name} {_label(config)}: {type(exc).__name__}: {exc}"
    return None


def _parse_peers(text: str) -> list[str]:
    from vattn.peers import parse_peers

    try:
        return parse_peers(text)
    except ValueError as exc:
        raise SystemExit(str(exc))


def _run_peers(shape, peers, replays, skipped: dict) -> list[dict]:
    """The peers of vattn/peers.py on the batch vattn just ran (same pool, page tables, Q and descales)."""
    if not peers:
        return []
    from vattn.peers import bench_peers

    try:
        return bench_peers(shape, _batch_cache(shape), peers, replays=replays, timed_graph=_timed_graph,
                           skipped=skipped)
    except Exception as exc:  # the peers must not lose vattn's rows
        print(f"FAILED peers on {shape.name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return [dict(shape=shape.name, impl="peers", planner="-", error=f"{type(exc).__name__}: {exc}")]


def _best_of_sweep(records: list[dict]):
    """Fastest swept config within tolerance (2e-2 fp8 KV, 5e-3 otherwise); None if none qualifies."""
    from vattn.kernel import MainConfig

    ok = [r for r in records if "error" not in r and r.get("rel_err") is not None
          and r["rel_err"] <= (2e-2 if r["kv_dtype"] == "fp8" else 5e-3) and not r.get("nan")]
    return MainConfig(**min(ok, key=lambda r: r["us"])["config"]) if ok else None


def _for_shape(config, shape: Shape):
    """A template config adapted to a shape: warps by its acc size, fp8 QK only with fp8 KV."""
    if config is None:
        return None
    from vattn.kernel import default_config

    rows = max(shape.q_lens) * shape.gqa
    warps = default_config(shape.head_dim, rows, shape.kv_dtype == "fp8").num_warps
    return replace(config, num_warps=warps, qk_fp8=config.qk_fp8 if shape.kv_dtype == "fp8" else 0)


def _stamp(r: dict, device: str, date: str, ceiling: float) -> dict:
    r.update(device=device, date=date, read_ceiling_tbps=ceiling)
    return r


if __name__ == "__main__":
    sys.exit(main())
