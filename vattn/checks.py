"""The argument checks of vattn.plan and vattn.attention: each raises ValueError naming the argument, the value
and what is supported.

Most look only at shapes, dtypes, devices and strides, never at a GPU tensor's values (that would sync, and a
CUDA-graph capture forbids it); those that read values say so: the callers run them with debug=True, or where
the values are on the host already (a CPU plan).
"""

from __future__ import annotations

import math

from vattn.contract import KV_DTYPES
from vattn.workspace import Plan, Workspace, interpreting


def bad(arg: str, value, supported: str):
    raise ValueError(f"{arg}: got {value}; supported: {supported}")


def int_vector(name: str, t, length: int | None, device) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        bad(name, type(t).__name__, "a torch.Tensor")
    if t.dtype != torch.int32:
        bad(f"{name}.dtype", t.dtype, "torch.int32")
    if t.dim() != 1 or (length is not None and t.shape[0] != length):
        want = f"[{length}]" if length is not None else "1-D"
        bad(f"{name}.shape", tuple(t.shape), f"{want} int32")
    if t.device != device:
        bad(f"{name}.device", t.device, f"the workspace's device {device}")
    if t.shape[0] > 1 and t.stride(0) != 1:
        bad(f"{name}.stride", t.stride(), "contiguous")


def device(device) -> None:
    if device.type != "cuda" and not interpreting():
        bad("device", device, "cuda (cpu only under TRITON_INTERPRET=1)")


def lens_values(seq_lens, cu_seqlens_q, max_q_len: int) -> None:
    """debug=True only: reads values (host sync)."""
    lens, cu = seq_lens.tolist(), cu_seqlens_q.tolist()
    q_lens(cu, max_q_len)
    for b, (a, c) in enumerate(zip(cu, cu[1:])):
        if 0 < lens[b] < c - a or lens[b] < 0:
            bad(f"seq_lens[{b}]", lens[b], f"0 (empty) or >= its q_len {c - a} (the new tokens are in the cache)")


def q_lens(cu: list, max_q_len: int) -> None:
    """cu_seqlens_q's values, read on the host (debug=True, or a CPU plan, which reads them anyway): the kernel
    writes max_q_len rows of a sequence at most and reads q from row cu[0] = 0 on."""
    if cu[0] != 0:
        bad("cu_seqlens_q[0]", cu[0], "0")
    for b, (a, c) in enumerate(zip(cu, cu[1:])):
        if not 0 <= c - a <= max_q_len:
            bad(f"q_len of sequence {b} (cu_seqlens_q[{b + 1}] - cu_seqlens_q[{b}])", c - a,
                 f"0..{max_q_len} (the workspace's max_q_len)")


def pages(block_tables, seq_lens, num_pages: int, page_size: int) -> None:
    """debug=True only: every page a sequence uses is a valid page id."""
    import torch

    need = (seq_lens.long() + page_size - 1) // page_size
    if int(need.max().item() if need.numel() else 0) > block_tables.shape[1]:
        bad("seq_lens", seq_lens.tolist(), f"<= block_tables.shape[1] * page_size = "
             f"{block_tables.shape[1] * page_size}")
    used = torch.arange(block_tables.shape[1], device=block_tables.device)[None, :] < need[:, None]
    ids = block_tables[used]
    if ids.numel() and (ids.min().item() < 0 or ids.max().item() >= num_pages):
        bad("block_tables", f"page ids in [{ids.min().item()}, {ids.max().item()}]",
             f"ids in [0, {num_pages}) for the pages each sequence uses")


_KV_DTYPES = ", ".join(f"torch.{name}" for name in KV_DTYPES)


def tensor(name: str, t, ndim: int, device) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        bad(name, type(t).__name__, "a torch.Tensor")
    if t.dim() != ndim:
        bad(f"{name}.shape", tuple(t.shape), f"{ndim} dimensions")
    if t.device != device:
        bad(f"{name}.device", t.device, f"the workspace's device {device}")
    if t.stride(-1) != 1:
        bad(f"{name}.stride", t.stride(), "unit stride in the last dimension")


def attention_args(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                     softmax_scale, plan, out) -> Workspace:
    """Shapes, dtypes, devices and strides against the plan's workspace; no value reads."""
    import torch

    if not isinstance(plan, Plan):
        bad("plan", type(plan).__name__, "a vattn.Plan from vattn.plan(...)")
    ws = plan.workspace
    if ws.live is not plan:
        stale(plan)
    device(ws.device)
    tensor("q", q, 3, ws.device)
    if q.dtype != ws.q_dtype:
        bad("q.dtype", q.dtype, f"the workspace's q_dtype {ws.q_dtype} (bf16 or fp16)")
    if tuple(q.shape[1:]) != (ws.num_q_heads, ws.head_dim):
        bad("q.shape", tuple(q.shape), f"[T, {ws.num_q_heads}, {ws.head_dim}] (the workspace's Hq, D)")
    want_kv = (ws.page_size, ws.num_kv_heads, ws.head_dim)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        tensor(name, t, 4, ws.device)
        if t.dtype != ws.kv_dtype:
            bad(f"{name}.dtype", t.dtype, f"the workspace's kv_dtype {ws.kv_dtype} (one of {_KV_DTYPES})")
        if tuple(t.shape[1:]) != want_kv:
            bad(f"{name}.shape", tuple(t.shape), f"[num_pages, {', '.join(map(str, want_kv))}] "
                 "(NHD: page_size, Hkv, D of the workspace)")
    if v_cache.shape[0] != k_cache.shape[0]:
        bad("v_cache.shape", tuple(v_cache.shape), f"the same num_pages as k_cache ({k_cache.shape[0]})")
    tensor("block_tables", block_tables, 2, ws.device)
    if block_tables.dtype != torch.int32 or block_tables.shape[0] != plan.batch:
        bad("block_tables", f"{block_tables.dtype} {tuple(block_tables.shape)}",
             f"int32 [B={plan.batch}, max_pages]")
    int_vector("seq_lens", seq_lens, plan.batch, ws.device)
    int_vector("cu_seqlens_q", cu_seqlens_q, plan.batch + 1, ws.device)
    descales(k_descale, v_descale, ws)
    if softmax_scale is not None and (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float))
                                      or not 0 < softmax_scale < math.inf):
        bad("softmax_scale", repr(softmax_scale), "a finite Python float > 0 (or None for 1/sqrt(head_dim))")
    if out is not None:
        tensor("out", out, 3, ws.device)
        if out.dtype != q.dtype or out.shape != q.shape or out.stride(1) != q.shape[2]:
            bad("out", f"{out.dtype} {tuple(out.shape)} strides {out.stride()}",
                 f"{q.dtype} {tuple(q.shape)} with contiguous heads (like q)")
    if plan.host[0] is not None:
        host_lengths(plan, q, block_tables)
    return ws


def stale(plan: Plan) -> None:
    live = plan.workspace.live
    now = f"batch {live.batch}, mode {live.mode}" if isinstance(live, Plan) else "none"
    bad("plan", f"a stale plan (batch {plan.batch}, mode {plan.mode}): its workspace has planned since ({now}), "
         "and this plan's views of the workspace's buffers now hold that batch's work items",
         "the workspace's latest plan: call vattn.plan again for this batch, or give each plan that must stay "
         "live a Workspace of its own")


def host_lengths(plan: Plan, q, block_tables) -> None:
    """q's rows and block_tables' pages against the lengths a CPU plan read on the host: O(1), no sync."""
    tokens, longest = plan.host[0]
    if q.shape[0] != tokens:
        bad("q.shape[0]", q.shape[0], f"cu_seqlens_q[-1] = {tokens}, the query tokens the plan was made for "
             "(more rows of q than that are never written; fewer are read past q's end)")
    page_size = plan.workspace.page_size
    if longest > block_tables.shape[1] * page_size:
        bad("block_tables.shape", tuple(block_tables.shape), f"at least {-(-longest // page_size)} pages a "
             f"sequence: the plan's longest sequence has {longest} tokens (page_size {page_size})")


def plan_covers(plan: Plan, seq_lens, cu_seqlens_q) -> None:
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
            bad("plan", f"{got} for sequence {b}", f"[0, {want}) for seq_lens[{b}] = {n} with q_len {q_len}: a "
                 "plan made for these seq_lens and cu_seqlens_q (call vattn.plan again after they change)")


def descales(k_descale, v_descale, ws: Workspace) -> None:
    import torch

    fp8 = ws.kv_dtype == torch.float8_e4m3fn
    for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            if fp8:
                bad(name, None, "a [1] float32 device tensor with fp8 KV")
            continue
        if not fp8:
            bad(name, "a tensor", f"None with {ws.kv_dtype} KV (descales apply to fp8 KV only)")
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != 1:
            bad(name, f"{getattr(t, 'dtype', type(t).__name__)} numel={getattr(t, 'numel', lambda: '?')()}",
                 "a [1] float32 device tensor")
        if t.device != ws.device:
            bad(f"{name}.device", t.device, f"the workspace's device {ws.device}")
