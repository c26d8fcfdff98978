"""The measurement every kernel benchmark shares: batches, timing, the accuracy check, the record's shape.

- Batch: one shape's device tensors; the KV pool holds R replicas (together >= 4 x the L2), each read
  through its own randomly permuted page table, so a timed loop over the R replicas reads cold KV;
- timed_graph: capture a function once in a CUDA graph, median device time over many replays;
- check: relative Frobenius error against vattn.reference, judged by vattn.contract's tolerances;
- shape_fields / stamp: the fields every record (vattn's or a peer's) starts and ends with;
- host_overhead: host time per eager vattn call and its parts (vattn's Python, Triton's launches).

The device is an argument everywhere ("cuda", or "cpu" for a dry run under TRITON_INTERPRET=1, where
timings mean nothing and only the plumbing is checked). torch and triton load inside the functions.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

from benchmarks.kernel.shapes import Shape
from pipeline.io import write_text_atomic
from vattn.contract import tolerance

L2_BYTES = 60e6  # H200
MIN_REPLICAS = 4  # cold L2: at least this many copies of the batch's KV, and together >= 4 x L2
DRY_RUN_REPLICAS = 2  # the interpreter is slow, and a CPU has no L2 to defeat


def q_dtype(device: str):
    import torch

    # the interpreter's bf16 dots are wrong (KERNEL.md): dry runs use fp16 Q
    return torch.bfloat16 if device == "cuda" else torch.float16


def kv_torch_dtype(shape: Shape):
    import torch

    return {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16, "fp16": torch.float16}[shape.kv_dtype]


def random_cache(pages: int, p: int, hkv: int, d: int, dtype, gen, device: str, chunk: int = 1 << 27):
    """[pages, p, hkv, d] of normal values, filled in chunks (an fp32 temporary of the whole pool would not fit)."""
    import torch

    cache = torch.empty(pages, p, hkv, d, dtype=dtype, device=device)
    flat = cache.view(-1)
    for i in range(0, flat.numel(), chunk):
        n = min(chunk, flat.numel() - i)
        flat[i:i + n].copy_(torch.randn(n, device=device, generator=gen))
    return cache


class Batch:
    """Device tensors of one shape: R replicas of the KV in one pool, R permuted page tables."""

    def __init__(self, shape: Shape, device: str = "cuda", seed: int = 0):
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        p, hkv, d = shape.page_size, shape.num_kv_heads, shape.head_dim
        self.device = device
        self.kv_dtype = kv_torch_dtype(shape)
        pages = [-(-n // p) for n in shape.seq_lens]
        per_replica = max(1, sum(pages))
        self.replicas = max(MIN_REPLICAS, min(256, math.ceil(4 * L2_BYTES / max(shape.kv_bytes, 1))))
        if device == "cpu":
            self.replicas = DRY_RUN_REPLICAS
        self.l2_cold = self.replicas * shape.kv_bytes >= 4 * L2_BYTES
        pool_pages = self.replicas * per_replica
        self.k = random_cache(pool_pages, p, hkv, d, self.kv_dtype, gen, device)
        self.v = random_cache(pool_pages, p, hkv, d, self.kv_dtype, gen, device)
        perm = torch.randperm(pool_pages, device=device, generator=gen).to(torch.int32)
        self.tables = [self._table(shape, pages, perm[r * per_replica:(r + 1) * per_replica])
                       for r in range(self.replicas)]
        self.seq_lens = torch.tensor(shape.seq_lens, dtype=torch.int32, device=device)
        cu = [0]
        for n in shape.q_lens:
            cu.append(cu[-1] + n)
        self.cu = torch.tensor(cu, dtype=torch.int32, device=device)
        q = torch.randn(cu[-1], shape.num_q_heads, d, device=device, generator=gen)
        self.q = q.to(q_dtype(device))
        self.out = torch.empty_like(self.q)
        fp8 = shape.kv_dtype == "fp8"
        self.k_descale = torch.tensor([0.9], device=device) if fp8 else None
        self.v_descale = torch.tensor([1.1], device=device) if fp8 else None
        self.scale = 1.0 / math.sqrt(d)
        self.gather_us: float | None = None  # benchmarks.kernel.gather's ceiling of this batch, once measured

    def _table(self, shape: Shape, pages: list[int], ids):
        """[B, max pages] int32: sequence b's pages, taken in order from this replica's slice of the permutation."""
        import torch

        t = torch.zeros(shape.batch, max(max(pages) if pages else 1, 1), dtype=torch.int32, device=self.device)
        first = 0
        for b, n in enumerate(pages):
            t[b, :n] = ids[first:first + n]
            first += n
        return t

    def attention_args(self, replica: int) -> tuple:
        """vattn.attention's positional arguments (and vattn.reference's) on one replica."""
        return (self.q, self.k, self.v, self.tables[replica], self.seq_lens, self.cu, self.k_descale,
                self.v_descale, self.scale)

    def reference(self):
        """vattn.reference on replica 0: the fp32 oracle every implementation is checked against."""
        import vattn

        return vattn.reference(*self.attention_args(0))


class BatchCache:
    """One Batch alive at a time (pools are GBs), reused while consecutive calls ask for the same shape."""

    def __init__(self, device: str):
        self.device = device
        self._key, self._batch = None, None

    def get(self, shape: Shape) -> Batch:
        key = (shape.seq_lens, shape.q_lens, shape.head_dim, shape.num_q_heads, shape.num_kv_heads,
               shape.page_size, shape.kv_dtype)
        if key != self._key:
            self._key, self._batch = None, None  # free the old pool before allocating the new one
            if self.device == "cuda":
                import torch

                torch.cuda.empty_cache()
            self._batch, self._key = Batch(shape, self.device), key
        return self._batch


# -- timing --------------------------------------------------------------------------------------------

def capture(fn):
    """A CUDA graph of fn, after one warm-up call (compiles, first touch) on a side stream outside capture."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def timed_graph(fn, replays: int, device: str = "cuda") -> float:
    """Capture fn once, replay it; median device time of one replay in us (on a CPU: one eager call's wall
    time, for dry runs)."""
    import torch

    if device == "cpu":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    g = capture(fn)
    g.replay()
    torch.cuda.synchronize()
    return _median_event_us(g.replay, replays)


def eager_us(fn, replays: int) -> float:
    """Median device time of fn run eagerly (CUDA events), for work a graph cannot capture."""
    import torch

    if not torch.cuda.is_available():
        return host_us(fn, replays)
    fn()
    return _median_event_us(fn, replays)


def _median_event_us(fn, replays: int) -> float:
    import torch

    times = []
    for _ in range(max(1, replays)):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def host_us(fn, replays: int, *, sync: bool | None = None, warmup: bool = True) -> float:
    """Median wall time of fn in us, device work included when sync (default: whenever CUDA is there), for
    work that reads the host (a planner that syncs)."""
    import torch

    sync = torch.cuda.is_available() if sync is None else sync
    if warmup:
        fn()
    times = []
    for _ in range(max(1, replays)):
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def read_ceiling_tbps(gib: float = 4.0) -> float:
    """Streaming read of a fresh buffer far larger than L2 (best of a Triton read and torch.sum), on CUDA."""
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


# -- host overhead of an eager call ---------------------------------------------------------------------

HOST_PARTS = ("call", "plan", "attention", "launch_plan", "launch_main", "launch_reduce", "graph_replay")


def enqueue_us(fns: dict, calls: int, device: str, chunk: int = 20) -> dict:
    """Median host time (us) of one call of each fns[name](), device work not awaited: each runs `chunk` times
    between synchronisations (a queue of a few dozen launches never fills), each chunk timed on the host, and
    the fns take turns chunk by chunk (ABBA), so a drift in the host's speed falls on each alike."""
    import torch

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    for fn in fns.values():
        fn()
    sync()
    names = list(fns)
    times = {name: [] for name in names}
    for i in range(max(1, calls // chunk)):
        for name in names if i % 2 == 0 else names[::-1]:
            fn = fns[name]
            sync()
            t0 = time.perf_counter()
            for _ in range(chunk):
                fn()
            times[name].append((time.perf_counter() - t0) / chunk * 1e6)
    sync()
    return {name: statistics.median(ts) for name, ts in times.items()}


LAUNCHERS = ("native", "triton")  # host_overhead's: vattn's Triton kernels through PointerLaunch, or Triton's own


def launchers_ok(launchers) -> bool:
    """Some of LAUNCHERS, each at most once."""
    return bool(launchers) and len(set(launchers)) == len(launchers) and set(launchers) <= set(LAUNCHERS)


def host_overhead(shape: Shape, device: str = "cuda", calls: int = 400, mode: str = "balanced",
                  launchers: tuple = LAUNCHERS) -> list[dict]:
    """Host time (us) per eager call of vattn.plan + vattn.attention on `shape`, and its parts: plan and
    attention alone, the plan, main and reduce launches as the call makes them (vattn.launcher's bound
    launches of Triton's kernels: the live tensors' data pointers, the cache key, the compiled kernel's launcher;
    the Hopper main kernel's C++ launch with its signature check, which attention() calls past its own; the rest
    of plan/attention is vattn's Python: the call-signature lookup, or on a new signature the checks), and
    the host time of one CUDA graph replay of the whole call. device_us: the call's GPU time in a graph,
    for scale. The plan gets the batch's longest length as max_seq_len, as an engine knows it: where every
    sequence is then one piece on a backend that writes whole sequences, the call launches no reduce
    (reduce_skipped); attention_unbounded_host_us is the same call planned without the bound.
    One record a launcher: "native", vattn's Triton kernels through launch.cpp's PointerLaunch once bound
    (vattn.launcher.NATIVE_LAUNCH), or "triton", through Triton's own launcher. Each launcher's call has a
    workspace (so bindings) of its own, and each part is timed with the launchers taking turns (enqueue_us)."""
    from vattn import launcher as vattn_launcher

    if not launchers_ok(launchers):
        raise ValueError(f"launchers: got {list(launchers)}; allowed: native, triton, each at most once")
    before = vattn_launcher.NATIVE_LAUNCH
    subjects = {}
    try:
        for x in launchers:  # a binding reads the switch when it first launches, in _HostCall's setup
            vattn_launcher.NATIVE_LAUNCH = x == "native"
            subjects[x] = _HostCall(shape, device, mode)
    finally:
        vattn_launcher.NATIVE_LAUNCH = before
    records = {x: dict(s.record, launcher=x, calls=calls) for x, s in subjects.items()}

    def timed(field, fns):
        for x, us in enqueue_us(fns, calls, device).items():
            records[x][field] = us

    for name in subjects[launchers[0]].parts:
        timed(f"{name}_host_us", {x: s.parts[name] for x, s in subjects.items()})
    for s in subjects.values():
        s.plan(None)  # the same plan object, now without the bound: the call launches the reduce
    timed("attention_unbounded_host_us", {x: s.parts["attention"] for x, s in subjects.items()})
    for s in subjects.values():
        s.plan()
    if device == "cuda":
        graphs = {x: capture(s.call) for x, s in subjects.items()}
        timed("graph_replay_host_us", {x: g.replay for x, g in graphs.items()})
        for x, g in graphs.items():
            records[x]["device_us"] = _median_event_us(g.replay, 50)
    return [records[x] for x in launchers]


class _HostCall:
    """One eager vattn call on a batch of `shape` with a workspace of its own, and its parts as zero-argument
    callables, every binding they launch through made here."""

    def __init__(self, shape: Shape, device: str, mode: str):
        import vattn
        from vattn.api import launch_parts, select_backend

        b = Batch(shape, device)
        ws = vattn.Workspace(head_dim=shape.head_dim, num_q_heads=shape.num_q_heads, num_kv_heads=shape.num_kv_heads,
                             kv_dtype=b.kv_dtype, q_dtype=b.q.dtype, page_size=shape.page_size,
                             max_q_len=max(shape.q_lens), max_batch=shape.batch)
        args = b.attention_args(0)
        longest = max(shape.seq_lens)

        def plan(max_seq_len=longest):
            return vattn.plan(b.seq_lens, b.cu, num_kv_heads=shape.num_kv_heads, page_size=shape.page_size,
                              mode=mode, workspace=ws, max_seq_len=max_seq_len)

        pl = plan()

        def call():
            vattn.attention(*args, plan=plan(), out=b.out)

        def attention():
            vattn.attention(*args, plan=pl, out=b.out)

        call()  # checks and binds this call's signature, which launch_parts reads
        self.plan, self.call = plan, call
        self.parts = dict(call=call, plan=plan, attention=attention,
                          **launch_parts(pl, *args, out=b.out))  # the serving backend's launches alone
        # every launch this call will time makes its binding now, while the caller's launcher switch holds
        # (a binding adopts a native launch, or not, at its second launch)
        for fn in [*self.parts.values(), lambda: plan(None), attention, plan] * 3:
            fn()
        backend = select_backend(ws, b.q, b.k)
        self.record = dict(shape_fields(shape, "vattn", mode), backend=backend.name,
                           reduce_skipped=pl.single_pieces and backend.writes_whole)


# -- accuracy and records ------------------------------------------------------------------------------

def check(out, ref) -> tuple[float, bool]:
    """(relative Frobenius error of out against the fp32 reference, whether out holds a NaN)."""
    nan = bool(out.isnan().any().item())
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)), nan


def within_tolerance(rel_err: float | None, nan: bool | None, kv_dtype: str) -> bool:
    """KERNEL.md's bar for a result to count: finite, and within the tolerance of its cache's dtype."""
    return rel_err is not None and not nan and rel_err <= tolerance(kv_dtype)


def shape_fields(shape: Shape, impl: str, planner: str) -> dict:
    """The fields every record starts with: which shape, which implementation, which planner."""
    return dict(shape=shape.name, batch=shape.batch, total_kv_tokens=shape.total_kv_tokens, head_dim=shape.head_dim,
                gqa=shape.gqa, num_kv_heads=shape.num_kv_heads, q_len=shape.q_label, page_size=shape.page_size,
                kv_dtype=shape.kv_dtype, impl=impl, planner=planner)


def provenance(module: str, argv=None) -> tuple[str, str]:
    """When (UTC) and by which command a run's records were taken: a committed JSON outlives the machine."""
    date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return date, f"python -m {module} " + " ".join(sys.argv[1:] if argv is None else argv)


def save_records(path: str, records: list[dict]) -> None:
    """Writes records to path as a JSON list, whole or not at all (pipeline.io's atomic write): the probes save
    after every record or shape, so a run killed mid-write keeps the last complete list."""
    write_text_atomic(Path(path), json.dumps(records, indent=1))


def stamp(r: dict, device: str, date: str, ceiling: float) -> dict:
    """The fields every record ends with: where and when it was measured, and that run's read ceiling."""
    r.update(device=device, date=date, read_ceiling_tbps=ceiling)
    return r


def alternating_rounds(names: list, rounds: int) -> list:
    """The order in which `rounds` rounds time the variants: forward, backward, forward, ... so that a drift over
    the run weighs on every variant alike."""
    return [name for r in range(rounds) for name in (names if r % 2 == 0 else names[::-1])]


def time_in_rounds(timers: dict, rounds: int) -> dict:
    """name -> every round's time of timers[name]() (a callable returning us), in alternating_rounds' order."""
    times = {name: [] for name in timers}
    for name in alternating_rounds(list(timers), rounds):
        times[name].append(timers[name]())
    return times


def rounds_faster(times: dict) -> dict:
    """name -> (rounds in which it ran faster than the first variant, rounds), for each variant after the first.
    A round times every variant within moments of the others, so this pairing holds where a GPU drifts by more
    than the builds differ over a call (10-16% on some machines, benchmarks/NOTES.md P58-P60)."""
    base, *others = times
    return {name: (sum(t < b for t, b in zip(times[name], times[base])), len(times[base])) for name in others}


def parse_named_defines(text: str, flag: str, *, allow_none: bool = False) -> dict[str, dict[str, int]]:
    """'NAME[:KEY=INT,...];...' -> {name: {key: int}}: the measurement builds (-D constants) or launch shapes a
    probe's `flag` names, in order; a name without pairs is the build's own."""
    named = {}
    for item in filter(None, (s.strip() for s in text.split(";"))):
        name, _, rest = (part.strip() for part in item.partition(":"))
        pairs = {}
        for pair in filter(None, (p.strip() for p in rest.split(","))):
            key, eq, value = (part.strip() for part in pair.partition("="))
            if not eq or not key or not value.lstrip("-").isdigit():
                raise ValueError(f"{flag}: {pair!r} in {item!r}; allowed: KEY=INT pairs after 'NAME:'")
            pairs[key] = int(value)
        if not name or name in named:
            raise ValueError(f"{flag}: name {name!r} empty or repeated; allowed: one distinct name an item")
        named[name] = pairs
    if not named and not allow_none:
        raise ValueError(f"{flag}: none given; allowed: 'NAME[:KEY=INT,...];...', e.g. 'default;q1:K8_QPARTS=1'")
    return named


def rounds_cli(argv, *, module: str, doc: str, default_shapes: str, default_rounds: int, default_out: str,
               header: str, measure, sustained: bool = False) -> int:
    """The command line of a probe that times variants round by round in turns (layer_gap, tail_plans): --shapes,
    --rounds, --replays, --out and --dry-run; measure(shapes, device, rounds, replays) yields records, each stamped
    with the command, the device, the date and the read ceiling, and --out rewritten as a JSON list after each, so
    a run cut short keeps what it measured. sustained: the probe also takes --sustained SECONDS and --rest SECONDS,
    passed on as measure(..., sustained=(seconds, rest))."""
    import argparse

    from benchmarks.kernel.shapes import select, tiny_shapes

    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    ap.add_argument("--shapes", default=default_shapes, help=f"comma-separated shape names (default {default_shapes})")
    ap.add_argument("--rounds", type=int, default=default_rounds,
                    help=f"rounds of the variants in turns, the order reversed every other round (default {default_rounds})")
    ap.add_argument("--replays", type=int, default=20, help="timed graph replays per variant and round (median)")
    ap.add_argument("--out", default=default_out, help=f"JSON list of records (default {default_out})")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU under TRITON_INTERPRET=1 on a tiny shape: checks the plumbing; its times mean nothing")
    if sustained:
        ap.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS",
                        help="time each variant under SECONDS of back-to-back replays (the median of the second half, "
                             "as benchmarks.kernel.sustained does) instead of a short burst (default 0: the burst)")
        ap.add_argument("--rest", type=float, default=3.0, metavar="SECONDS",
                        help="with --sustained: idle seconds before each variant's load (default 3)")
    a = ap.parse_args(argv)
    for field, value in (("--rounds", a.rounds), ("--replays", a.replays)):
        if value < 1:
            ap.error(f"{field}: got {value}; allowed: a positive integer")
    extra = {}
    if sustained:
        for field, value in (("--sustained", a.sustained), ("--rest", a.rest)):
            if value < 0:
                ap.error(f"{field}: got {value}; allowed: seconds >= 0")
        if a.sustained and a.dry_run:
            ap.error("--sustained: needs a CUDA GPU (NVML's clock and energy), not --dry-run")
        extra["sustained"] = (a.sustained, a.rest)
    if a.dry_run:
        from vattn.workspace import interpreting

        if not interpreting():
            ap.error("--dry-run: set TRITON_INTERPRET=1 (the kernels run in Triton's interpreter)")
        device, shapes, where, ceiling = "cpu", tiny_shapes()[:1], "cpu-interpreter", 1.0
    else:
        import torch

        if not torch.cuda.is_available():
            ap.error("needs a CUDA GPU (or --dry-run on a CPU, whose times mean nothing)")
        try:
            shapes = select(a.shapes)
        except ValueError as exc:
            ap.error(str(exc))
        device, where, ceiling = "cuda", torch.cuda.get_device_name(), read_ceiling_tbps()
    print(header, flush=True)
    date, command = provenance(module, argv)
    records = []
    for r in measure(shapes, device, a.rounds, a.replays, **extra):
        records.append(stamp(dict(r, command=command), where, date, ceiling))
        save_records(a.out, records)
    print(f"wrote {len(records)} records to {a.out}")
    return 0
