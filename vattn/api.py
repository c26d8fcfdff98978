"""vattn's public API: plan once per batch, run per layer. This module owns attention() and its dispatch;
vattn.plans makes the plan and vattn.checks holds the argument checks of both.

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
from typing import NamedTuple

from vattn import checks
from vattn.backends import BACKENDS, FAILED, REGISTRATIONS, Backend, planned_backend, register_backend
from vattn.plans import keep_checked, plan_signature
from vattn.workspace import Plan, Workspace


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
                checks.stale(plan)
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
                checks.host_lengths(plan, q, block_tables)
            out = run(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out)
            last[2] = run.shortcut() if hasattr(run, "shortcut") else None
            return out
    ws = checks.attention_args(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale,
                          v_descale, softmax_scale, plan, out)
    sig = _attention_signature(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                               softmax_scale, out)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[2])
    if debug:
        checks.lens_values(seq_lens, cu_seqlens_q, ws.max_q_len)
        checks.pages(block_tables, seq_lens, k_cache.shape[0], ws.page_size)
        if cu_seqlens_q[-1].item() != q.shape[0]:
            checks.bad("cu_seqlens_q[-1]", cu_seqlens_q[-1].item(), f"q.shape[0]={q.shape[0]}")
        checks.plan_covers(plan, seq_lens, cu_seqlens_q)
    if out is None:
        out = torch.empty_like(q)
    backend = select_backend(ws, q, k_cache)
    args = (q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
            float(softmax_scale), plan, out)
    run = _triton_run(*args) if backend is TRITON else _backend_run(backend, *args)
    keep_checked(plan.calls, sig, run)
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
    """Everything checks.attention_args looks at but the plan (whose cache this keys). A [1] descale's
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
    prun = ws.plan_calls[plan_signature(seq_lens, cu_seqlens_q, ws.num_kv_heads, ws.page_size, plan.mode)]
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


