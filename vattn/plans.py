"""vattn.plan: a batch's split into pieces, made in its workspace's buffers (the Plan), once per batch and
reused by every layer. On CUDA one launch of the plan kernel, graph-safe; on a CPU the planner's Python twin.
"""

from __future__ import annotations

from vattn import checks
from vattn.planner import BALANCED, DEFAULT_PLANNER, FIELDS, KV_TILE, PLANNERS, max_work_items, plan_python
from vattn.workspace import Plan, Workspace

SIGNATURES_KEPT = 64  # checked call signatures kept per workspace / plan; past it the cache restarts


def keep_checked(cache: dict, sig, run) -> None:
    """Keep a checked call signature's run (plan()'s in the workspace, attention()'s in the plan)."""
    if len(cache) >= SIGNATURES_KEPT:
        cache.clear()
    cache[sig] = run


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
            run = workspace.plan_calls.get(plan_signature(seq_lens, cu_seqlens_q, num_kv_heads, page_size, mode))
        except Exception:  # not tensors, not a workspace, unhashable settings: the checks below say which
            run = None
        if run is not None and (max_seq_len is None or (type(max_seq_len) is int and max_seq_len >= 0)):
            pl = workspace.live = run(seq_lens, cu_seqlens_q)
            pl.single[0] = _single_pieces(workspace, mode, max_seq_len)
            return pl
    ws = workspace
    if not isinstance(ws, Workspace):
        checks.bad("workspace", type(ws).__name__, "a vattn.Workspace")
    if mode not in PLANNERS:
        checks.bad("mode", repr(mode), ", ".join(PLANNERS))
    if num_kv_heads != ws.num_kv_heads:
        checks.bad("num_kv_heads", repr(num_kv_heads), f"the workspace's num_kv_heads={ws.num_kv_heads}")
    if page_size != ws.page_size:
        checks.bad("page_size", repr(page_size), f"the workspace's page_size={ws.page_size}")
    checks.device(ws.device)
    checks.int_vector("seq_lens", seq_lens, None, ws.device)
    batch = seq_lens.shape[0]
    if batch > ws.max_batch:
        checks.bad("seq_lens.shape", tuple(seq_lens.shape), f"batch <= the workspace's max_batch={ws.max_batch}")
    checks.int_vector("cu_seqlens_q", cu_seqlens_q, batch + 1, ws.device)
    if max_seq_len is not None and (not isinstance(max_seq_len, int) or isinstance(max_seq_len, bool)
                                    or max_seq_len < 0):
        checks.bad("max_seq_len", repr(max_seq_len), "an int >= 0 bounding seq_lens, or None")
    if debug:
        checks.lens_values(seq_lens, cu_seqlens_q, ws.max_q_len)
        longest = int(seq_lens.max().item()) if batch else 0
        if max_seq_len is not None and longest > max_seq_len:
            checks.bad("max_seq_len", max_seq_len, f">= the longest seq_lens value, {longest}")
    pl = ws.plans.get((batch, mode))
    if pl is None:  # first call with this batch size: views of the workspace's buffers, kept
        pl = ws.plans[batch, mode] = _new_plan(ws, batch, mode)
    run = _plan_run(ws, pl, seq_lens, cu_seqlens_q, mode)
    keep_checked(ws.plan_calls, plan_signature(seq_lens, cu_seqlens_q, num_kv_heads, page_size, mode), run)
    pl = ws.live = run(seq_lens, cu_seqlens_q)  # (a run that raises leaves the live plan and its buffers alone)
    pl.single[0] = _single_pieces(ws, mode, max_seq_len)
    return pl


def _single_pieces(ws: Workspace, mode: str, max_seq_len: int | None) -> bool:
    """Whether a plan of lengths <= max_seq_len has one piece a sequence: the balanced planners never cut a
    sequence of up to their piece overhead in tiles (the cap is at least that; planner._split_balanced, plan_gpu's
    MIN_CAP)."""
    return (max_seq_len is not None and mode in BALANCED
            and max_seq_len <= ws.piece_overhead * KV_TILE)


def plan_signature(seq_lens, cu_seqlens_q, num_kv_heads, page_size, mode) -> tuple:
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
                checks.bad(f"cu_seqlens_q[{i + 1}]", f"{b} after {a}", "a non-decreasing prefix sum of query lengths")
        checks.q_lens(cu, ws.max_q_len)  # on the host already: no cost (seq_lens < q_len is safe: rows masked)
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
