"""vattn's public API: plan once per batch, run per layer.

    ws = vattn.Workspace(head_dim=256, num_q_heads=16, num_kv_heads=1, kv_dtype=torch.float8_e4m3fn,
                         page_size=16, max_q_len=4)
    plan = vattn.plan(seq_lens, cu_seqlens_q, num_kv_heads=1, page_size=16, mode="balanced", workspace=ws)
    out = vattn.attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                          k_descale, v_descale, softmax_scale, plan=plan)

Host-side checks look only at shapes, dtypes, devices and strides (never at a GPU tensor's values), so a
call can be captured in a CUDA graph; debug=True also reads values (and syncs). Bad values go unchecked
without it (attention()'s docstring lists what they do). A CPU plan reads its lengths on the host anyway,
so there they are checked always; and a plan is refused once its workspace has planned again.

Dispatch point: attention() asks each registered backend, in order, whether it supports
the call (`register_backend`); the portable Triton path (vattn.kernel) is the last and
always applies. A faster Hopper path slots in by registering a Backend whose `supports`
looks at the workspace/tensors; if its `run` raises, attention() warns once and falls back.
The checks and the choice run once per call signature; a backend whose main launch checks the signature
itself (vattn.hopper's C++ launch) is then called without building the signature in Python (Shortcut).
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

from vattn.backends import BACKENDS, FAILED, REGISTRATIONS, Backend, planned_backend, register_backend
from vattn.contract import KV_DTYPES
from vattn.planner import DEFAULT_PLANNER, FIELDS, KV_TILE, PLANNERS, max_work_items, plan_python
from vattn.workspace import Workspace, interpreting


def _bad(arg: str, value, supported: str):
    raise ValueError(f"{arg}: got {value}; supported: {supported}")


@dataclass(frozen=True)
class Plan:
    """A batch's work list, living in its workspace's buffers (valid until the next plan()). vattn.plan
    returns the same object for the same workspace, batch size and mode: only the buffers' values change.
    The workspace remembers the plan its latest plan() returned (Workspace.live): attention() refuses any
    other, whose views now hold another batch's work items."""

    tensors: dict  # planner.FIELDS -> int32 tensors ([W] work_*, [B+1] seq_part_start, [1] num_items)
    batch: int
    num_work_items: int  # W for this batch size
    mode: str
    workspace: Workspace
    # attention()'s checked call signatures (_attention_signature) -> the call's launches, and the last
    # one used (a tuple compare is cheaper than hashing it: most calls repeat the previous signature)
    calls: dict = field(default_factory=dict, compare=False, repr=False)
    last: list = field(default_factory=lambda: [None, None, None], compare=False, repr=False)  # + its Shortcut
    single: list = field(default_factory=lambda: [False], compare=False, repr=False)  # set by each plan()
    # (query tokens, longest KV length of a sequence with queries) where plan() read the lengths on the host
    # (a CPU workspace), else None: attention() checks q and block_tables against them at no cost
    host: list = field(default_factory=lambda: [None], compare=False, repr=False)

    @property
    def single_pieces(self) -> bool:
        """The caller's max_seq_len showed that every sequence is one piece, so a backend that writes whole
        sequences itself needs no reduce: attention() then skips its launch (outside graph capture)."""
        return self.single[0]


SIGNATURES_KEPT = 64  # checked call signatures kept per workspace / plan; past it the cache restarts


def _keep(cache: dict, sig, run) -> None:
    if len(cache) >= SIGNATURES_KEPT:
        cache.clear()
    cache[sig] = run


def _check_int_vector(name: str, t, length: int | None, device) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        _bad(name, type(t).__name__, "a torch.Tensor")
    if t.dtype != torch.int32:
        _bad(f"{name}.dtype", t.dtype, "torch.int32")
    if t.dim() != 1 or (length is not None and t.shape[0] != length):
        want = f"[{length}]" if length is not None else "1-D"
        _bad(f"{name}.shape", tuple(t.shape), f"{want} int32")
    if t.device != device:
        _bad(f"{name}.device", t.device, f"the workspace's device {device}")
    if t.shape[0] > 1 and t.stride(0) != 1:
        _bad(f"{name}.stride", t.stride(), "contiguous")


def _check_device(device) -> None:
    if device.type != "cuda" and not interpreting():
        _bad("device", device, "cuda (cpu only under TRITON_INTERPRET=1)")


def plan(seq_lens, cu_seqlens_q, *, num_kv_heads: int, page_size: int, mode: str = DEFAULT_PLANNER,
         workspace: Workspace, max_seq_len: int | None = None, debug: bool = False) -> Plan:
    """Split the batch's KV ranges into pieces (one program per piece and KV head).

    seq_lens: [B] int32, KV length incl. the new tokens; cu_seqlens_q: [B+1] int32.
    num_kv_heads, page_size: must match the workspace. mode: one of vattn.planner.PLANNERS.
    max_seq_len: optional, a bound on seq_lens that the caller knows on the host (an engine does). When every
    sequence then fits in one piece of a balanced plan, an eager attention() on a backend that writes whole
    sequences itself launches no reduce; a CUDA-graph capture always keeps it. A bound below the real
    lengths gives wrong output: debug=True checks it.
    On CUDA this is one launch of vattn.planner.plan_gpu, no host sync (graph-safe); on a CPU
    (Triton's interpreter) the pure-Python twin plans from the host values.

    The returned plan is the workspace's one live plan: it replaces every plan this workspace made before
    (their views now hold this batch's work items), and attention() refuses those with a ValueError.

    Values: on a CPU workspace the lengths are read on the host anyway, so a bad value raises ValueError
    here: cu_seqlens_q not starting at 0 or decreasing, a q_len outside 0..workspace.max_q_len (named with
    its sequence), a negative seq_lens. On CUDA no value is read (that would sync): such lengths are NOT
    checked, and a q_len above max_q_len leaves output rows unwritten; debug=True reads them (a sync) and
    raises, as it does for a seq_lens below its q_len (which only masks those rows).

    The checks run once per call signature (the lengths' shapes, strides, dtypes, devices and the
    settings); a call whose signature was checked before launches at once.
    """
    if not debug:
        try:
            run = workspace.plan_calls.get(_plan_signature(seq_lens, cu_seqlens_q, num_kv_heads, page_size, mode))
        except Exception:  # not tensors, not a workspace, unhashable settings: the checks below say which
            run = None
        if run is not None and (max_seq_len is None or (type(max_seq_len) is int and max_seq_len >= 0)):
            pl = workspace.live = run(seq_lens, cu_seqlens_q)
            pl.single[0] = _single_pieces(workspace, mode, max_seq_len)
            return pl
    ws = workspace
    if not isinstance(ws, Workspace):
        _bad("workspace", type(ws).__name__, "a vattn.Workspace")
    if mode not in PLANNERS:
        _bad("mode", repr(mode), ", ".join(PLANNERS))
    if num_kv_heads != ws.num_kv_heads:
        _bad("num_kv_heads", repr(num_kv_heads), f"the workspace's num_kv_heads={ws.num_kv_heads}")
    if page_size != ws.page_size:
        _bad("page_size", repr(page_size), f"the workspace's page_size={ws.page_size}")
    _check_device(ws.device)
    _check_int_vector("seq_lens", seq_lens, None, ws.device)
    batch = seq_lens.shape[0]
    if batch > ws.max_batch:
        _bad("seq_lens.shape", tuple(seq_lens.shape), f"batch <= the workspace's max_batch={ws.max_batch}")
    _check_int_vector("cu_seqlens_q", cu_seqlens_q, batch + 1, ws.device)
    if max_seq_len is not None and (not isinstance(max_seq_len, int) or isinstance(max_seq_len, bool)
                                    or max_seq_len < 0):
        _bad("max_seq_len", repr(max_seq_len), "an int >= 0 bounding seq_lens, or None")
    if debug:
        _check_lens_values(seq_lens, cu_seqlens_q, ws.max_q_len)
        longest = int(seq_lens.max().item()) if batch else 0
        if max_seq_len is not None and longest > max_seq_len:
            _bad("max_seq_len", max_seq_len, f">= the longest seq_lens value, {longest}")
    pl = ws.plans.get((batch, mode))
    if pl is None:  # first call with this batch size: views of the workspace's buffers, kept
        pl = ws.plans[batch, mode] = _new_plan(ws, batch, mode)
    run = _plan_run(ws, pl, seq_lens, cu_seqlens_q, mode)
    _keep(ws.plan_calls, _plan_signature(seq_lens, cu_seqlens_q, num_kv_heads, page_size, mode), run)
    pl = ws.live = run(seq_lens, cu_seqlens_q)  # (a run that raises leaves the live plan and its buffers alone)
    pl.single[0] = _single_pieces(ws, mode, max_seq_len)
    return pl


def _single_pieces(ws: Workspace, mode: str, max_seq_len: int | None) -> bool:
    """Whether a plan of lengths <= max_seq_len has one piece a sequence: balanced and balanced_tails never cut a
    sequence of up to their piece overhead in tiles (the cap is at least that; planner._split_balanced, plan_gpu's
    MIN_CAP)."""
    return (max_seq_len is not None and mode in ("balanced", "balanced_tails")
            and max_seq_len <= ws.piece_overhead * KV_TILE)


def _plan_signature(seq_lens, cu_seqlens_q, num_kv_heads, page_size, mode) -> tuple:
    """Everything plan()'s checks look at but the workspace (whose cache this keys)."""
    return (seq_lens.shape, seq_lens.stride(), seq_lens.dtype, seq_lens.device, cu_seqlens_q.shape,
            cu_seqlens_q.stride(), cu_seqlens_q.dtype, cu_seqlens_q.device, num_kv_heads, page_size, mode)


def _plan_run(ws: Workspace, pl: Plan, seq_lens, cu_seqlens_q, mode: str):
    """plan()'s work for lengths of this signature (checked): run(seq_lens, cu_seqlens_q) -> pl. It splits for
    the programs of the backend the workspace plans for (Workspace.program_kv_heads a piece)."""
    import torch

    num_kv_heads = ws.program_kv_heads

    if ws.device.type == "cuda":  # the lengths and views are checked: launch without plan_gpu's checks
        from vattn import launcher
        from vattn.planner import PLAN_LIVE, _plan_kernel, plan_launch_args

        args, kwargs = plan_launch_args(seq_lens, cu_seqlens_q, pl.tensors, num_kv_heads=num_kv_heads,
                                        slots=ws.slots, mode=mode, overhead=ws.piece_overhead,
                                        let_next_launch=ws.plan_lets_main_launch)
        launch = launcher.kernel(_plan_kernel()).bind(args, kwargs, PLAN_LIVE).launch

        def run(seq_lens, cu_seqlens_q):
            launch(1, 1, 1, seq_lens, cu_seqlens_q)
            return pl
        run.launch = lambda seq_lens, cu_seqlens_q: launch(1, 1, 1, seq_lens, cu_seqlens_q)
        return run

    def run_on_host(seq_lens, cu_seqlens_q):  # CPU (the interpreter): the host twin reads the lengths
        cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
        for i, (a, b) in enumerate(zip(cu, cu[1:])):
            if b < a:  # named here: the planner sees only the differences, as q_lens
                _bad(f"cu_seqlens_q[{i + 1}]", f"{b} after {a}", "a non-decreasing prefix sum of query lengths")
        _check_q_lens(cu, ws.max_q_len)  # on the host already: no cost (seq_lens < q_len is safe: rows masked)
        q_lens = [b - a for a, b in zip(cu, cu[1:])]
        lists = plan_python(lens, q_lens, num_kv_heads=num_kv_heads, slots=ws.slots, mode=mode,
                            overhead=ws.piece_overhead)
        for f in FIELDS:
            pl.tensors[f].copy_(torch.tensor(getattr(lists, f), dtype=torch.int32), non_blocking=False)
        pl.host[0] = (cu[-1], max((n for n, k in zip(lens, q_lens) if k), default=0))
        return pl
    run_on_host.launch = run_on_host
    return run_on_host


def _new_plan(ws: Workspace, batch: int, mode: str) -> Plan:
    width = max_work_items(batch, ws.program_kv_heads, ws.slots)
    views = {f: buf[:width] for f, buf in ws.plan_buffers.items() if f.startswith("work_")}
    views["seq_part_start"] = ws.plan_buffers["seq_part_start"][: batch + 1]
    views["num_items"] = ws.plan_buffers["num_items"]
    return Plan(tensors=views, batch=batch, num_work_items=width, mode=mode, workspace=ws)


def _check_lens_values(seq_lens, cu_seqlens_q, max_q_len: int) -> None:
    """debug=True only: reads values (host sync)."""
    lens, cu = seq_lens.tolist(), cu_seqlens_q.tolist()
    _check_q_lens(cu, max_q_len)
    for b, (a, c) in enumerate(zip(cu, cu[1:])):
        if 0 < lens[b] < c - a or lens[b] < 0:
            _bad(f"seq_lens[{b}]", lens[b], f"0 (empty) or >= its q_len {c - a} (the new tokens are in the cache)")


def _check_q_lens(cu: list, max_q_len: int) -> None:
    """cu_seqlens_q's values, read on the host (debug=True, or a CPU plan, which reads them anyway): the kernel
    writes max_q_len rows of a sequence at most and reads q from row cu[0] = 0 on."""
    if cu[0] != 0:
        _bad("cu_seqlens_q[0]", cu[0], "0")
    for b, (a, c) in enumerate(zip(cu, cu[1:])):
        if not 0 <= c - a <= max_q_len:
            _bad(f"q_len of sequence {b} (cu_seqlens_q[{b + 1}] - cu_seqlens_q[{b}])", c - a,
                 f"0..{max_q_len} (the workspace's max_q_len)")


def _bind_triton_main(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                      softmax_scale, plan: Plan):
    from vattn import kernel as K  # triton loads on first launch, not on `import vattn`
    from vattn import launcher

    ws = plan.workspace
    args, kwargs = K.main_launch_args(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale,
                                      v_descale, softmax_scale, plan.tensors, ws.o_part, ws.lse_part, gqa=ws.gqa,
                                      max_q_len=ws.max_q_len, config=ws.config)
    bound = launcher.kernel(K._attn_main_kernel).bind(args, kwargs, K.MAIN_LIVE)
    main = bound.launch
    heads, width = k_cache.shape[2], plan.tensors["work_seq"].shape[0]

    def launch(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out=None):
        if k_descale is None:  # the kernel's placeholder pointers (main_launch_args), never read
            k_descale = v_descale = seq_lens
        main(heads, width, 1, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale)

    # for Bound.checked_launch: the live tensors (MAIN_LIVE) are the call's first eight, the placeholders above
    launch.bound, launch.arg_of_live = bound, (0, 1, 2, 3, 4, 5) + ((4, 4) if k_descale is None else (6, 7))
    return launch


def _run_triton(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                softmax_scale, plan: Plan, out) -> None:
    _triton_run(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, softmax_scale,
                plan, out)(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out)


TRITON = Backend("triton", lambda ws, q, k_cache: True, _run_triton, _bind_triton_main)
BACKENDS.append(TRITON)  # the last in dispatch order: it takes every call


def select_backend(ws: Workspace, q, k_cache) -> Backend:
    for b in BACKENDS:
        if b.name not in FAILED and b.supports(ws, q, k_cache):
            return b
    return TRITON


def attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale=None, v_descale=None,
              softmax_scale: float | None = None, *, plan: Plan, out=None, debug: bool = False):
    """Paged few-query attention; returns out [T, Hq, D] (q's dtype).

    q: [T, Hq, D] bf16/fp16. k_cache, v_cache: [num_pages, page_size, Hkv, D] (NHD), fp8 e4m3,
    bf16 or fp16. block_tables: [B, max_pages] int32. seq_lens: [B] int32 (KV length incl. the
    new tokens). cu_seqlens_q: [B+1] int32. k_descale, v_descale: [1] fp32 device tensors
    (required with fp8 KV, else None). softmax_scale: default 1/sqrt(D). plan: from vattn.plan
    for these seq_lens/cu_seqlens_q, and its workspace's latest (an earlier plan of the same workspace
    raises ValueError: its buffers now hold another batch). out: optional [T, Hq, D] in q's dtype.

    Values are NOT validated unless debug=True: the checks look at shapes, dtypes, devices and strides
    only, because reading a GPU tensor's values needs a host sync (not allowed in CUDA-graph capture, and
    a cost on every layer). Bad values can crash the process or corrupt memory, or give wrong output
    silently: a page id in block_tables outside [0, num_pages) (a fault or garbage), seq_lens past
    block_tables' pages, q with other than cu_seqlens_q[-1] rows, cu_seqlens_q[0] != 0, a q_len above the
    workspace's max_q_len (rows left unwritten), or lengths other than those the plan was made for.
    debug=True reads the values (syncing) and raises ValueError for each of these. Where plan() read the
    lengths on the host (a CPU workspace) q's rows and block_tables' pages are checked against them always.

    The checks and the choice of backend run once per call signature (every tensor's shape, strides,
    dtype and device, the softmax scale, the plan); a call whose signature was checked before goes
    straight to its backend's launches.
    """
    import torch

    if not debug:
        # the last call's main launch, where it checks the signature itself (launch.cpp's Launch: the Hopper
        # kernel's, or the Triton kernel's once its binding launches natively)
        if isinstance(plan, Plan):
            if plan.workspace.live is not plan:  # an identity compare, no sync: graph-safe
                _stale(plan)
            cut = plan.last[2]
        else:
            cut = None
        if cut is not None and cut.registrations == REGISTRATIONS[0] and cut.backend not in FAILED:
            try:
                if cut.launch(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                              softmax_scale, out) == 1:
                    if not (cut.writes_whole and plan.single[0] and not _capturing()):
                        cut.reduce(cu_seqlens_q, out)
                    return out
            except Exception:
                pass  # the checked path below launches again, and handles a backend that fails
        try:
            sig = _attention_signature(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale,
                                       v_descale, softmax_scale, out)
            last = plan.last
            if sig == last[0]:
                run = last[1]
            else:
                run = plan.calls.get(sig)
                if run is not None:
                    last[0], last[1] = sig, run
        except Exception:  # not tensors, not a plan, unhashable: the checks below say which
            run = None
        if run is not None:
            if plan.host[0] is not None:  # a CPU plan knew the lengths on the host (never set on CUDA)
                _check_host_lengths(plan, q, block_tables)
            out = run(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out)
            last[2] = run.shortcut() if hasattr(run, "shortcut") else None
            return out
    ws = _check_attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale,
                          v_descale, softmax_scale, plan, out)
    sig = _attention_signature(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                               softmax_scale, out)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[2])
    if debug:
        _check_lens_values(seq_lens, cu_seqlens_q, ws.max_q_len)
        _check_pages(block_tables, seq_lens, k_cache.shape[0], ws.page_size)
        if cu_seqlens_q[-1].item() != q.shape[0]:
            _bad("cu_seqlens_q[-1]", cu_seqlens_q[-1].item(), f"q.shape[0]={q.shape[0]}")
        _check_plan_covers(plan, seq_lens, cu_seqlens_q)
    if out is None:
        out = torch.empty_like(q)
    backend = select_backend(ws, q, k_cache)
    args = (q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
            float(softmax_scale), plan, out)
    run = _triton_run(*args) if backend is TRITON else _backend_run(backend, *args)
    _keep(plan.calls, sig, run)
    plan.last[0], plan.last[1] = sig, run
    out = run(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out)
    plan.last[2] = run.shortcut() if hasattr(run, "shortcut") else None
    return out


def _backend_run(backend: Backend, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                 softmax_scale, plan: Plan, out):
    """A faster backend's run for calls of one (checked) signature, with the same arguments as _triton_run's
    run: its bound main kernel and its own bound reduce (Backend.bind_reduce) or vattn's (or its own run, without
    bind_main). If it cannot build or launch, this call and every later one go to Triton, after one warning."""
    import torch

    main = reduce = None
    fallback = []  # Triton's run for this signature, bound at the first call that needs it
    if backend.bind_main and backend.name not in FAILED:
        try:
            main = backend.bind_main(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                                     softmax_scale, plan)
        except Exception as exc:  # a kernel that cannot build: this signature goes to Triton from the start
            FAILED.add(backend.name)
            warnings.warn(f"vattn: backend {backend.name!r} failed ({exc!r}); falling back to Triton")
        if main is not None and backend.bind_reduce:
            reduce = backend.bind_reduce(plan, cu_seqlens_q, out)
        if reduce is None:
            reduce = _bound_reduce(plan, cu_seqlens_q, out, skip_whole=backend.writes_whole, pdl=backend.pdl,
                                   by_program=True)

    def run(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out):
        if out is None:
            out = torch.empty_like(q)
        args = (q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, softmax_scale,
                plan, out)
        if backend.name not in FAILED:
            try:
                if main is None:
                    backend.run(*args)
                else:
                    main(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out)
                    # no reduce when every sequence is one piece, which the main kernel wrote itself; a graph
                    # being captured keeps it, since its replays may bring longer sequences
                    if not (plan.single_pieces and backend.writes_whole and not _capturing()):
                        reduce(cu_seqlens_q, out)
                return out
            except Exception as exc:  # a fast path that cannot build or launch must not take serving down
                FAILED.add(backend.name)
                warnings.warn(f"vattn: backend {backend.name!r} failed ({exc!r}); falling back to Triton")
        if not fallback:
            fallback.append(_triton_run(*args))
        return fallback[0](q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out)

    if main is not None:  # the two launches alone, for the host-time split of benchmarks/kernel (launch_parts)
        run.launch_main, run.launch_reduce = main, reduce
    checked = getattr(main, "fast", None)  # a main launch that checks its own signature, once it has launched
    if checked is not None:
        registrations = REGISTRATIONS[0]
        run.shortcut = lambda: (Shortcut(checked[0].launch, reduce, registrations, backend.name, backend.writes_whole)
                                if checked else None)
    return run


class Shortcut(NamedTuple):
    """attention()'s way past its Python signature: the last call's main launch, which checks the call's tensors
    and scale against its own signature in C++ (1: launched; anything else: take the checked path), then the
    reduce as the backend's run would launch it. Valid while the backends' registrations stay as they were and
    the backend has not failed."""

    launch: object
    reduce: object
    registrations: int
    backend: str
    writes_whole: bool


def _capturing() -> bool:
    return _capture_probe()()


@functools.lru_cache(maxsize=None)
def _capture_probe():
    """Whether the current stream is capturing, as a function; CUDA's availability is asked once (its check
    took 2.3 us of an eager call's host time on an H200 host, the capture query 0.6)."""
    import torch

    return torch.cuda.is_current_stream_capturing if torch.cuda.is_available() else bool


def _attention_signature(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                         softmax_scale, out) -> tuple:
    """Everything _check_attention looks at but the plan (whose cache this keys). A [1] descale's
    stride is never read; out=None stands for torch.empty_like(q), a function of q's signature."""
    return (q.shape, q.stride(), q.dtype, q.device,
            k_cache.shape, k_cache.stride(), k_cache.dtype, k_cache.device,
            v_cache.shape, v_cache.stride(), v_cache.dtype, v_cache.device,
            block_tables.shape, block_tables.stride(), block_tables.dtype, block_tables.device,
            seq_lens.shape, seq_lens.stride(), seq_lens.dtype, seq_lens.device,
            cu_seqlens_q.shape, cu_seqlens_q.stride(), cu_seqlens_q.dtype, cu_seqlens_q.device,
            None if k_descale is None else (k_descale.shape, k_descale.dtype, k_descale.device),
            None if v_descale is None else (v_descale.shape, v_descale.dtype, v_descale.device),
            softmax_scale,
            None if out is None else (out.shape, out.stride(), out.dtype, out.device), REGISTRATIONS[0])


def _triton_run(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, softmax_scale,
                plan: Plan, out):
    """The Triton backend's launches for calls of this (checked) signature, bound once:
    run(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out) -> out."""
    import torch

    main = _bind_triton_main(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                             softmax_scale, plan)
    reduce = _bound_reduce(plan, cu_seqlens_q, out)
    empty_like = torch.empty_like
    checked = []  # the main kernel as a launch.cpp Launch, once its binding launches natively (Shortcut)

    def run(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out):
        if out is None:
            out = empty_like(q)  # (a call without out never takes the Shortcut, whose signature has one)
        elif not checked:
            launch = main.bound.checked_launch((q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale,
                                                v_descale, out), softmax_scale, main.arg_of_live)
            if launch is not None:
                checked.append(launch)
        main(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale)
        reduce(cu_seqlens_q, out)
        return out

    run.launch_main, run.launch_reduce = main, reduce  # as _backend_run's
    registrations = REGISTRATIONS[0]
    run.shortcut = lambda: (Shortcut(checked[0], reduce, registrations, TRITON.name, False)
                            if checked and main.bound.native[0] else None)
    return run


def _bound_reduce(plan: Plan, cu_seqlens_q, out, *, skip_whole: bool = False, pdl: bool = False,
                  by_program: bool = False):
    """vattn's reduce for calls of one signature, bound once: reduce(cu_seqlens_q, out) (a no-op when there is
    nothing to write); skip_whole and pdl as kernel.launch_reduce's; by_program: of partials as the planned
    backend's programs wrote them (Workspace.partials), else the Triton kernel's."""
    from vattn import kernel as K
    from vattn import launcher

    o_part, lse_part, gqa = plan.workspace.partials(by_program)
    red = K.reduce_launch_args(o_part, lse_part, plan.tensors["seq_part_start"], cu_seqlens_q, out,
                               gqa=gqa, max_q_len=plan.workspace.max_q_len, skip_whole=skip_whole, pdl=pdl)
    if red is None:
        return lambda cu_seqlens_q, out: None
    (r0, r1, r2), args, kwargs = red
    launch = launcher.kernel(K._reduce_kernel).bind(args, kwargs, K.REDUCE_LIVE).launch
    return lambda cu_seqlens_q, out: launch(r0, r1, r2, cu_seqlens_q, out)


def launch_parts(plan: Plan, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale=None,
                 v_descale=None, softmax_scale=None, *, out) -> dict:
    """The three launches of a vattn.plan + vattn.attention call with these arguments, as zero-argument
    callables (launch_plan, launch_main, launch_reduce), exactly as the call makes them: the bound launches of
    the backend that serves the call (vattn.launcher's for Triton's kernels; the main launch of a Shortcut as
    attention() calls it, signature check included). Both calls must have run once
    with these arguments (that checks and binds them); {} for a backend without bind_main."""
    ws = plan.workspace
    prun = ws.plan_calls[_plan_signature(seq_lens, cu_seqlens_q, ws.num_kv_heads, ws.page_size, plan.mode)]
    run = plan.calls[_attention_signature(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale,
                                          v_descale, softmax_scale, out)]
    if not hasattr(run, "launch_main"):
        return {}
    cut = run.shortcut() if hasattr(run, "shortcut") else None
    main = (lambda: cut.launch(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                               softmax_scale, out)) if cut is not None else (
        lambda: run.launch_main(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out))
    return dict(launch_plan=lambda: prun.launch(seq_lens, cu_seqlens_q), launch_main=main,
                launch_reduce=lambda: run.launch_reduce(cu_seqlens_q, out))


def _check_pages(block_tables, seq_lens, num_pages: int, page_size: int) -> None:
    """debug=True only: every page a sequence uses is a valid page id."""
    import torch

    need = (seq_lens.long() + page_size - 1) // page_size
    if int(need.max().item() if need.numel() else 0) > block_tables.shape[1]:
        _bad("seq_lens", seq_lens.tolist(), f"<= block_tables.shape[1] * page_size = "
             f"{block_tables.shape[1] * page_size}")
    used = torch.arange(block_tables.shape[1], device=block_tables.device)[None, :] < need[:, None]
    ids = block_tables[used]
    if ids.numel() and (ids.min().item() < 0 or ids.max().item() >= num_pages):
        _bad("block_tables", f"page ids in [{ids.min().item()}, {ids.max().item()}]",
             f"ids in [0, {num_pages}) for the pages each sequence uses")


_KV_DTYPES = ", ".join(f"torch.{name}" for name in KV_DTYPES)


def _check_tensor(name: str, t, ndim: int, device) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        _bad(name, type(t).__name__, "a torch.Tensor")
    if t.dim() != ndim:
        _bad(f"{name}.shape", tuple(t.shape), f"{ndim} dimensions")
    if t.device != device:
        _bad(f"{name}.device", t.device, f"the workspace's device {device}")
    if t.stride(-1) != 1:
        _bad(f"{name}.stride", t.stride(), "unit stride in the last dimension")


def _check_attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                     softmax_scale, plan, out) -> Workspace:
    """Shapes, dtypes, devices and strides against the plan's workspace; no value reads."""
    import torch

    if not isinstance(plan, Plan):
        _bad("plan", type(plan).__name__, "a vattn.Plan from vattn.plan(...)")
    ws = plan.workspace
    if ws.live is not plan:
        _stale(plan)
    _check_device(ws.device)
    _check_tensor("q", q, 3, ws.device)
    if q.dtype != ws.q_dtype:
        _bad("q.dtype", q.dtype, f"the workspace's q_dtype {ws.q_dtype} (bf16 or fp16)")
    if tuple(q.shape[1:]) != (ws.num_q_heads, ws.head_dim):
        _bad("q.shape", tuple(q.shape), f"[T, {ws.num_q_heads}, {ws.head_dim}] (the workspace's Hq, D)")
    want_kv = (ws.page_size, ws.num_kv_heads, ws.head_dim)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, t, 4, ws.device)
        if t.dtype != ws.kv_dtype:
            _bad(f"{name}.dtype", t.dtype, f"the workspace's kv_dtype {ws.kv_dtype} (one of {_KV_DTYPES})")
        if tuple(t.shape[1:]) != want_kv:
            _bad(f"{name}.shape", tuple(t.shape), f"[num_pages, {', '.join(map(str, want_kv))}] "
                 "(NHD: page_size, Hkv, D of the workspace)")
    if v_cache.shape[0] != k_cache.shape[0]:
        _bad("v_cache.shape", tuple(v_cache.shape), f"the same num_pages as k_cache ({k_cache.shape[0]})")
    _check_tensor("block_tables", block_tables, 2, ws.device)
    if block_tables.dtype != torch.int32 or block_tables.shape[0] != plan.batch:
        _bad("block_tables", f"{block_tables.dtype} {tuple(block_tables.shape)}",
             f"int32 [B={plan.batch}, max_pages]")
    _check_int_vector("seq_lens", seq_lens, plan.batch, ws.device)
    _check_int_vector("cu_seqlens_q", cu_seqlens_q, plan.batch + 1, ws.device)
    _check_descales(k_descale, v_descale, ws)
    if softmax_scale is not None and (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float))
                                      or not 0 < softmax_scale < math.inf):
        _bad("softmax_scale", repr(softmax_scale), "a finite Python float > 0 (or None for 1/sqrt(head_dim))")
    if out is not None:
        _check_tensor("out", out, 3, ws.device)
        if out.dtype != q.dtype or out.shape != q.shape or out.stride(1) != q.shape[2]:
            _bad("out", f"{out.dtype} {tuple(out.shape)} strides {out.stride()}",
                 f"{q.dtype} {tuple(q.shape)} with contiguous heads (like q)")
    if plan.host[0] is not None:
        _check_host_lengths(plan, q, block_tables)
    return ws


def _stale(plan: Plan) -> None:
    live = plan.workspace.live
    now = f"batch {live.batch}, mode {live.mode}" if isinstance(live, Plan) else "none"
    _bad("plan", f"a stale plan (batch {plan.batch}, mode {plan.mode}): its workspace has planned since ({now}), "
         "and this plan's views of the workspace's buffers now hold that batch's work items",
         "the workspace's latest plan: call vattn.plan again for this batch, or give each plan that must stay "
         "live a Workspace of its own")


def _check_host_lengths(plan: Plan, q, block_tables) -> None:
    """q's rows and block_tables' pages against the lengths a CPU plan read on the host: O(1), no sync."""
    tokens, longest = plan.host[0]
    if q.shape[0] != tokens:
        _bad("q.shape[0]", q.shape[0], f"cu_seqlens_q[-1] = {tokens}, the query tokens the plan was made for "
             "(more rows of q than that are never written; fewer are read past q's end)")
    page_size = plan.workspace.page_size
    if longest > block_tables.shape[1] * page_size:
        _bad("block_tables.shape", tuple(block_tables.shape), f"at least {-(-longest // page_size)} pages a "
             f"sequence: the plan's longest sequence has {longest} tokens (page_size {page_size})")


def _check_plan_covers(plan: Plan, seq_lens, cu_seqlens_q) -> None:
    """debug=True only (host reads): the plan's pieces of each sequence with queries cover its KV positions
    [0, seq_lens[b]) in order, and a sequence without queries (or KV) has none: the plan was made for these
    lengths (a plan made before they changed leaves KV positions unread, or reads past the end)."""
    t = {f: plan.tensors[f].tolist() for f in ("work_seq", "work_start", "work_end", "seq_part_start")}
    lens, cu = seq_lens.tolist(), cu_seqlens_q.tolist()
    first = t["seq_part_start"]
    for b, n in enumerate(lens):
        q_len = cu[b + 1] - cu[b]
        want, end = (n if q_len else 0), 0
        for r in range(first[b], first[b + 1]):
            if t["work_seq"][r] != b or t["work_start"][r] != end:
                end = None  # not a contiguous run of this sequence's pieces from position 0
                break
            end = t["work_end"][r]
        if end != want:
            got = "pieces that are not one run from KV position 0" if end is None else f"KV positions [0, {end})"
            _bad("plan", f"{got} for sequence {b}", f"[0, {want}) for seq_lens[{b}] = {n} with q_len {q_len}: a "
                 "plan made for these seq_lens and cu_seqlens_q (call vattn.plan again after they change)")


def _check_descales(k_descale, v_descale, ws: Workspace) -> None:
    import torch

    fp8 = ws.kv_dtype == torch.float8_e4m3fn
    for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            if fp8:
                _bad(name, None, "a [1] float32 device tensor with fp8 KV")
            continue
        if not fp8:
            _bad(name, "a tensor", f"None with {ws.kv_dtype} KV (descales apply to fp8 KV only)")
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != 1:
            _bad(name, f"{getattr(t, 'dtype', type(t).__name__)} numel={getattr(t, 'numel', lambda: '?')()}",
                 "a [1] float32 device tensor")
        if t.device != ws.device:
            _bad(f"{name}.device", t.device, f"the workspace's device {ws.device}")
