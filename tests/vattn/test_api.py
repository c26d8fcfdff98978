"""vattn's public API: host-side checks (messages pinned), package surface, dispatch.

No kernel launches here (test_kernel.py runs them): every case raises before launch, so it
runs on a CPU workspace (allowed under TRITON_INTERPRET=1, set per test) or on the GPU.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import vattn
import vattn.kernel  # noqa: F401  decorate the kernels now, in this process's real mode

FP8 = torch.float8_e4m3fn


@pytest.fixture
def dev(monkeypatch):
    if torch.cuda.is_available():
        return "cuda"
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # lets a CPU workspace pass the device check
    return "cpu"


def ws_for(dev, **kw):
    args = dict(head_dim=128, num_q_heads=8, num_kv_heads=2, kv_dtype=FP8, q_dtype=torch.bfloat16, page_size=16,
                max_q_len=4, max_batch=4, device=dev, slots=8)
    args.update(kw)
    return vattn.Workspace(**args)


def inputs(dev, batch=2, kv_dtype=FP8):
    i32 = dict(dtype=torch.int32, device=dev)
    return dict(
        q=torch.zeros(batch * 4, 8, 128, dtype=torch.bfloat16, device=dev),
        k_cache=torch.zeros(10, 16, 2, 128, device=dev).to(kv_dtype),
        v_cache=torch.zeros(10, 16, 2, 128, device=dev).to(kv_dtype),
        block_tables=torch.zeros(batch, 5, **i32),
        seq_lens=torch.full((batch,), 40, **i32),
        cu_seqlens_q=torch.arange(0, 4 * batch + 1, 4, **i32),
        k_descale=torch.ones(1, device=dev) if kv_dtype == FP8 else None,
        v_descale=torch.ones(1, device=dev) if kv_dtype == FP8 else None,
        softmax_scale=0.1,
    )


def planned(dev, **ws_kw):
    ws = ws_for(dev, **ws_kw)
    x = inputs(dev, kv_dtype=ws.kv_dtype)
    pl = vattn.plan(x["seq_lens"], x["cu_seqlens_q"], num_kv_heads=2, page_size=16, workspace=ws)
    return x, pl


@pytest.mark.parametrize("kw,match", [
    (dict(head_dim=96), r"head_dim: got 96; supported: 64, 128, 256"),
    (dict(page_size=8), r"page_size: got 8; supported: 1, 16, 64"),
    (dict(num_q_heads=40), r"num_q_heads: got 40; supported: a multiple of num_kv_heads=2, 1\.\.16 q heads"),
    (dict(num_q_heads=9), r"num_q_heads: got 9; supported: a multiple of num_kv_heads=2"),
    (dict(max_q_len=9), r"max_q_len: got 9; supported: 1\.\.8"),
    (dict(kv_dtype=torch.float32), r"kv_dtype: got torch.float32; supported: torch.float8_e4m3fn, torch.bfloat16"),
    (dict(q_dtype=FP8), r"q_dtype: got torch.float8_e4m3fn; supported: torch.bfloat16, torch.float16"),
    (dict(slots=0), r"slots: got 0; supported: an int >= 1"),
])
def test_workspace_rejects(dev, kw, match):
    with pytest.raises(ValueError, match=match):
        ws_for(dev, **kw)


def test_plan_is_made_once_per_batch_size_and_mode(dev):
    # the eager path slices the workspace's buffers once per (batch, mode), not on every call (host time)
    x, pl = planned(dev)
    again = vattn.plan(x["seq_lens"], x["cu_seqlens_q"], num_kv_heads=2, page_size=16, workspace=pl.workspace)
    assert again is pl
    one = vattn.plan(x["seq_lens"][:1], x["cu_seqlens_q"][:2], num_kv_heads=2, page_size=16, mode="fixed",
                     workspace=pl.workspace)
    assert one is not pl and (one.batch, one.mode) == (1, "fixed")
    assert one.tensors["work_seq"].data_ptr() == pl.tensors["work_seq"].data_ptr()  # the same buffers


def test_plan_rejects(dev):
    ws = ws_for(dev)
    x = inputs(dev)
    lens, cu = x["seq_lens"], x["cu_seqlens_q"]
    cases = [
        (dict(mode="greedy"), r"mode: got 'greedy'; supported: fixed, length_aware, balanced"),
        (dict(num_kv_heads=4), r"num_kv_heads: got 4; supported: the workspace's num_kv_heads=2"),
        (dict(page_size=64), r"page_size: got 64; supported: the workspace's page_size=16"),
        (dict(num_kv_heads="2"), r"num_kv_heads: got '2'; supported: the workspace's num_kv_heads=2"),  # a str
        (dict(seq_lens=lens.long()), r"seq_lens.dtype: got torch.int64; supported: torch.int32"),
        (dict(seq_lens=lens.view(1, 2)), r"seq_lens.shape: got \(1, 2\); supported: 1-D int32"),
        (dict(cu_seqlens_q=cu[:2]), r"cu_seqlens_q.shape: got \(2,\); supported: \[3\] int32"),
        (dict(seq_lens=torch.zeros(5, dtype=torch.int32, device=dev), cu_seqlens_q=torch.zeros(
            6, dtype=torch.int32, device=dev)), r"seq_lens.shape: got \(5,\); supported: batch <= the workspace's "
         r"max_batch=4"),
        (dict(workspace="ws"), r"workspace: got str; supported: a vattn.Workspace"),
    ]
    for kw, match in cases:
        args = dict(seq_lens=lens, cu_seqlens_q=cu, num_kv_heads=2, page_size=16, mode="balanced", workspace=ws)
        args.update(kw)
        with pytest.raises(ValueError, match=match):
            vattn.plan(**args)


def test_a_cuda_workspace_without_cuda_is_named():
    if torch.cuda.is_available():
        pytest.skip("this torch sees a CUDA device")
    with pytest.raises(ValueError, match=r"^device: got 'cuda', but this torch sees no CUDA device"):
        vattn.Workspace(head_dim=128, num_q_heads=8, num_kv_heads=2, kv_dtype=FP8, page_size=16, device="cuda")


def test_plan_on_the_host_names_a_decreasing_cu_seqlens_q(dev):
    """On a CPU the plan reads the lengths on the host anyway, so a bad prefix sum is named as the caller gave it
    (a GPU plan reads no value without debug=True)."""
    if dev != "cpu":
        pytest.skip("the host path runs on a CPU")
    i32 = dict(dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q\[2\]: got 2 after 3; supported: a non-decreasing prefix sum"):
        vattn.plan(torch.tensor([9, 9], **i32), torch.tensor([0, 3, 2], **i32), num_kv_heads=2, page_size=16,
                   workspace=ws_for(dev))


def test_plan_debug_reads_values(dev):
    ws = ws_for(dev)
    i32 = dict(dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match=r"q_len of sequence 1 .*: got 5; supported: 0\.\.4 \(the workspace's "
                       r"max_q_len\)"):
        vattn.plan(torch.tensor([9, 9], **i32), torch.tensor([0, 1, 6], **i32), num_kv_heads=2, page_size=16,
                   workspace=ws, debug=True)
    with pytest.raises(ValueError, match=r"seq_lens\[0\]: got 2; supported: 0 \(empty\) or >= its q_len 3"):
        vattn.plan(torch.tensor([2, 9], **i32), torch.tensor([0, 3, 4], **i32), num_kv_heads=2, page_size=16,
                   workspace=ws, debug=True)


@pytest.mark.parametrize("change,match", [
    (lambda x, d: dict(q=x["q"].float()), r"q.dtype: got torch.float32; supported: the workspace's q_dtype"),
    (lambda x, d: dict(q=x["q"][:, :4]), r"q.shape: got \(8, 4, 128\); supported: \[T, 8, 128\]"),
    (lambda x, d: dict(q=x["q"][0]), r"q.shape: got \(8, 128\); supported: 3 dimensions"),
    (lambda x, d: dict(q=x["q"].transpose(1, 2).contiguous().transpose(1, 2)),
     r"q.stride: got \(1024, 1, 8\); supported: unit stride in the last dimension"),
    (lambda x, d: dict(k_cache=x["k_cache"].to(torch.bfloat16)),
     r"k_cache.dtype: got torch.bfloat16; supported: the workspace's kv_dtype torch.float8_e4m3fn"),
    (lambda x, d: dict(v_cache=torch.zeros(10, 64, 2, 128, device=d).to(FP8)),
     r"v_cache.shape: got \(10, 64, 2, 128\); supported: \[num_pages, 16, 2, 128\]"),
    (lambda x, d: dict(v_cache=x["v_cache"][:5]), r"v_cache.shape: got \(5, 16, 2, 128\); supported: the same "
     r"num_pages as k_cache \(10\)"),
    (lambda x, d: dict(block_tables=x["block_tables"].long()),
     r"block_tables: got torch.int64 \(2, 5\); supported: int32 \[B=2, max_pages\]"),
    (lambda x, d: dict(seq_lens=x["seq_lens"][:1]), r"seq_lens.shape: got \(1,\); supported: \[2\] int32"),
    (lambda x, d: dict(k_descale=None), r"k_descale: got None; supported: a \[1\] float32 device tensor with fp8"),
    (lambda x, d: dict(v_descale=torch.ones(2, device=d)),
     r"v_descale: got torch.float32 numel=2; supported: a \[1\] float32 device tensor"),
    (lambda x, d: dict(softmax_scale=-1.0), r"softmax_scale: got -1.0; supported: a finite Python float > 0"),
    (lambda x, d: dict(softmax_scale=float("inf")), r"softmax_scale: got inf; supported: a finite Python float"),
    (lambda x, d: dict(softmax_scale=True), r"softmax_scale: got True; supported: a finite Python float"),
    (lambda x, d: dict(out=torch.empty(8, 8, 128, device=d)),
     r"out: got torch.float32 \(8, 8, 128\) strides .*; supported: torch.bfloat16 \(8, 8, 128\)"),
    (lambda x, d: dict(plan=None), r"plan: got NoneType; supported: a vattn.Plan from vattn.plan"),
])
def test_attention_rejects(dev, change, match):
    x, pl = planned(dev)
    args = dict(x, plan=pl)
    args.update(change(x, dev))
    with pytest.raises(ValueError, match=match):
        vattn.attention(**args)


def test_attention_rejects_descales_with_bf16_kv(dev):
    x, pl = planned(dev, kv_dtype=torch.bfloat16)
    x["k_descale"] = torch.ones(1, device=dev)
    with pytest.raises(ValueError, match=r"k_descale: got a tensor; supported: None with torch.bfloat16 KV"):
        vattn.attention(**x, plan=pl)


def test_attention_debug_checks_pages_and_token_count(dev):
    x, pl = planned(dev)
    x["block_tables"][1, 2] = 10  # sequence 1 (40 tokens) uses pages 0..2: id 10 is past the pool
    with pytest.raises(ValueError, match=r"block_tables: got page ids in \[0, 10\]; supported: ids in \[0, 10\)"):
        vattn.attention(**x, plan=pl, debug=True)
    x["block_tables"][1, 2] = 0
    x["seq_lens"][0] = 81  # needs 6 pages; the table holds 5
    with pytest.raises(ValueError, match=r"seq_lens: got \[81, 40\]; supported: <= block_tables.shape\[1\] \* "
                       r"page_size = 80"):
        vattn.attention(**x, plan=pl, debug=True)


def test_package_surface_is_lazy_and_names_are_the_api():
    code = ("import sys, vattn; assert 'triton' not in sys.modules and 'torch' not in sys.modules, "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton'))[:5];"
            "from vattn.planner import plan_python; from vattn.reference import reference;"
            "from vattn.plans import plan; assert vattn.plan is plan and vattn.reference is reference;"
            "assert {'Workspace', 'plan', 'attention', 'reference'} <= set(vattn.__all__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_max_seq_len_marks_a_balanced_plan_of_single_pieces(dev):
    """A bound within the workspace's piece overhead (in 64-token tiles) means one piece a sequence; each
    plan() decides anew, and only balanced promises it."""
    from vattn.planner import KV_TILE

    ws = ws_for(dev)
    x = inputs(dev)  # two sequences of 40 tokens
    bound = ws.piece_overhead * KV_TILE

    def single(**kw):
        return vattn.plan(x["seq_lens"], x["cu_seqlens_q"], num_kv_heads=2, page_size=16, workspace=ws,
                          **kw).single_pieces

    assert single(max_seq_len=40) and single(max_seq_len=bound)
    assert not single(max_seq_len=bound + 1)  # a longer sequence could be cut
    assert not single()  # no bound: the same plan object, reset
    assert not single(max_seq_len=40, mode="length_aware")


@pytest.mark.parametrize("overhead", [2, 4, 8])
@pytest.mark.parametrize("slots", [1, 8, 132])
def test_balanced_never_cuts_a_sequence_within_its_piece_overhead(overhead, slots):
    """What single_pieces rests on: balanced's cap is at least the piece overhead, on any batch."""
    import random

    from vattn.planner import KV_TILE, plan_splits

    rng = random.Random(overhead * 1000 + slots)
    for _ in range(50):
        batch = rng.randint(1, 64)
        lens = [rng.randint(1, overhead * KV_TILE) for _ in range(batch)]
        q_lens = [rng.randint(1, 4) for _ in range(batch)]
        for heads in (1, 2, 8):
            splits = plan_splits(lens, q_lens, num_kv_heads=heads, slots=slots, mode="balanced", overhead=overhead)
            assert all(k == 1 for k, _ in splits), (lens, heads)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "512"])
def test_max_seq_len_must_be_an_int_bound(dev, bad):
    ws = ws_for(dev)
    x = inputs(dev)
    for _ in range(2):  # the first call checks this signature; the second takes the checked signature's path
        with pytest.raises(ValueError, match=r"^max_seq_len: got .*; supported: an int >= 0 bounding seq_lens, "
                                             r"or None$"):
            vattn.plan(x["seq_lens"], x["cu_seqlens_q"], num_kv_heads=2, page_size=16, workspace=ws,
                       max_seq_len=bad)
        vattn.plan(x["seq_lens"], x["cu_seqlens_q"], num_kv_heads=2, page_size=16, workspace=ws)


def test_debug_checks_max_seq_len_against_the_lengths(dev):
    ws = ws_for(dev)
    x = inputs(dev)
    with pytest.raises(ValueError, match=r"^max_seq_len: got 39; supported: >= the longest seq_lens value, 40$"):
        vattn.plan(x["seq_lens"], x["cu_seqlens_q"], num_kv_heads=2, page_size=16, workspace=ws, max_seq_len=39,
                   debug=True)


def test_backend_dispatch_order(dev):
    from vattn import api

    ws = ws_for(dev)
    fast = api.Backend("fake-hopper", lambda w, q, k: w.head_dim == 256, lambda *a: None)
    api.register_backend(fast)
    try:
        assert api.select_backend(ws, None, None) is api.TRITON  # head_dim 128: not supported -> fallback
        assert api.select_backend(ws_for(dev, head_dim=256), None, None) is fast
    finally:
        api.BACKENDS.remove(fast)


def test_a_workspace_plans_for_the_slots_of_the_backend_that_will_serve_it(dev):
    """The split must fill the serving kernel's slots: a registered backend that would serve the workspace
    names its CTAs per SM; one that would not, or that failed before, leaves Triton's occupancy in charge."""
    from vattn import api

    fast = api.Backend("fake-hopper", lambda w, q, k: True, lambda *a: None,
                       slots_per_sm=lambda w: 1 if w.head_dim == 256 else None)
    api.register_backend(fast)
    try:
        assert api.planned_backend(ws_for(dev)) is None  # head_dim 128: not this backend's
        assert api.planned_backend(ws_for(dev, head_dim=256)) == (fast, 1)
        api.FAILED.add("fake-hopper")
        assert api.planned_backend(ws_for(dev, head_dim=256)) is None
    finally:
        api.BACKENDS.remove(fast)
        api.FAILED.discard("fake-hopper")


def _workspace_served_by(backend, dev):
    """A workspace made while `backend` is registered (first in dispatch order), as the tests below plan with."""
    from vattn import api

    api.register_backend(backend)
    try:
        return ws_for(dev, head_dim=256, max_batch=16, slots=32)
    finally:
        api.BACKENDS.remove(backend)


def test_a_workspace_plans_with_the_piece_overhead_of_the_backend_that_will_serve_it(dev):
    """balanced weighs a piece by the serving kernel's fixed cost: vattn.plan on a workspace a backend with
    its own piece_overhead_tiles would serve gives planner.plan_python's plan for that overhead, which here
    differs from the Triton kernel's (one piece fewer for the long sequence)."""
    from vattn import api
    from vattn.planner import PIECE_OVERHEAD_TILES, plan_python

    lens, q_lens = [40_000] + [600] * 15, [4] * 16
    fast = api.Backend("fake-hopper", lambda w, q, k: True, lambda *a: None, slots_per_sm=lambda w: 1,
                       piece_overhead_tiles=8)
    plain, ws = ws_for(dev, head_dim=256, max_batch=16, slots=32), _workspace_served_by(fast, dev)
    assert (plain.piece_overhead, ws.piece_overhead) == (PIECE_OVERHEAD_TILES, 8)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=dev)
    cu = torch.arange(0, 4 * 17, 4, dtype=torch.int32, device=dev)
    for w, overhead in ((plain, PIECE_OVERHEAD_TILES), (ws, 8)):
        pl = vattn.plan(lens_t, cu, num_kv_heads=2, page_size=16, mode="balanced", workspace=w)
        got = {f: t.tolist() for f, t in pl.tensors.items()}
        assert got == plan_python(lens, q_lens, num_kv_heads=2, slots=32, mode="balanced",
                                  overhead=overhead).__dict__, overhead
    assert (plan_python(lens, q_lens, num_kv_heads=2, slots=32, mode="balanced", overhead=8).seq_part_start
            != plan_python(lens, q_lens, num_kv_heads=2, slots=32, mode="balanced").seq_part_start)


def test_a_backend_may_give_its_piece_overhead_per_workspace(dev):
    """piece_overhead_tiles as a function of the workspace (the Hopper backend's tiles differ by KV dtype): the
    workspace plans with what it returns for that workspace."""
    from vattn import api

    seen = []

    def overhead(w):
        seen.append(w.head_dim)
        return 5

    ws = _workspace_served_by(api.Backend("fake-hopper", lambda w, q, k: True, lambda *a: None,
                                          slots_per_sm=lambda w: 1, piece_overhead_tiles=overhead), dev)
    assert ws.piece_overhead == 5 and seen == [256]


def test_the_plan_lets_the_main_kernel_launch_early_only_for_a_backend_that_waits_for_it(dev):
    """A workspace served by a backend whose main kernel goes as the plan's programmatic dependent (Backend.pdl)
    plans with a plan kernel that lets it launch at once (vattn.plan passes plan_lets_main_launch to the plan
    kernel's LET_NEXT_LAUNCH on a GPU); one the Triton kernel serves, which does not wait for the plan, never."""
    from vattn import api
    from vattn.planner import plan_launch_args

    waits = api.Backend("fake-pdl", lambda w, q, k: True, lambda *a: None, slots_per_sm=lambda w: 1, pdl=True)
    plain, ws = ws_for(dev, head_dim=256, max_batch=16, slots=32), _workspace_served_by(waits, dev)
    assert (plain.plan_lets_main_launch, ws.plan_lets_main_launch) == (False, True)
    lens, cu = torch.zeros(4, dtype=torch.int32), torch.zeros(5, dtype=torch.int32)
    pl = vattn.plan(lens.to(dev), cu.to(dev), num_kv_heads=2, page_size=16, mode="balanced", workspace=ws)
    for flag in (False, True):
        _, constexprs = plan_launch_args(lens, cu, pl.tensors, num_kv_heads=2, slots=32, mode="balanced",
                                         let_next_launch=flag)
        assert constexprs.get("LET_NEXT_LAUNCH", False) is flag


def test_the_hopper_backend_plans_for_one_cta_per_sm_only_on_the_workspaces_it_covers():
    from vattn.hopper import backend

    covered_but_cpu = ws_for("cpu", head_dim=256, num_q_heads=32, num_kv_heads=2)  # 16 x q_len 4 = 64 rows
    assert backend.slots_per_sm(covered_but_cpu) is None  # not an sm_90 GPU
    assert backend.BACKEND.bind_main is backend.bind_main and backend.BACKEND.slots_per_sm is backend.slots_per_sm


def test_a_backend_with_its_own_reduce_merges_with_it_and_without_one_with_vattns(dev, monkeypatch):
    """_backend_run binds the backend's main launch, then its bind_reduce's launch for the call's signature; where
    that gives None, vattn's reduce (api._bound_reduce) with the backend's skip_whole and pdl. Recorders stand in
    for the kernels: nothing is launched."""
    from vattn import api

    calls, vattns, own = [], [], [True]  # own[0]: whether the backend's bind_reduce gives a launch

    def bind_main(*args):
        return lambda *call: calls.append("main")

    def bind_reduce(plan, cu_seqlens_q, out):
        calls.append(("bind_reduce", plan.workspace.head_dim, tuple(out.shape)))
        return (lambda cu, o: calls.append(("reduce", cu is cu_seqlens_q, o is out))) if own[0] else None

    def vattn_reduce(plan, cu_seqlens_q, out, **kw):
        vattns.append(kw)
        return lambda cu, o: calls.append("vattn's reduce")

    monkeypatch.setattr(api, "_bound_reduce", vattn_reduce)
    fast = api.Backend("fake-hopper", lambda w, q, k: True, lambda *a: None, bind_main=bind_main,
                       slots_per_sm=lambda w: 1, writes_whole=True, pdl=True, bind_reduce=bind_reduce)
    api.register_backend(fast)
    try:
        for own[0] in (True, False):
            x, pl = planned(dev)  # a new plan: its calls are bound anew
            calls.clear()
            out = torch.zeros_like(x["q"])
            vattn.attention(**x, plan=pl, out=out)
            merged = ("reduce", True, True) if own[0] else "vattn's reduce"
            assert calls == [("bind_reduce", 128, tuple(out.shape)), "main", merged], calls
        assert vattns == [dict(skip_whole=True, pdl=True, by_program=True)]
    finally:
        api.BACKENDS.remove(fast)


# -- a plan's lengths and its workspace (no launch: every case raises before one) ------------------------------

STALE = (r"^plan: got a stale plan \(batch 2, mode balanced\): its workspace has planned since \(batch 3, mode "
         r"balanced\), and this plan's views of the workspace's buffers now hold that batch's work items; supported: "
         r"the workspace's latest plan: call vattn.plan again for this batch, or give each plan that must stay live a "
         r"Workspace of its own$")


def test_a_plan_made_before_its_workspaces_latest_is_refused(dev):
    """Two batch sizes, one workspace: the first plan's views now hold the second batch's work items (a kernel
    reading them ran past the first batch's tensors: exit 139). Refused on every path, by an identity compare."""
    x, first = planned(dev)
    three = inputs(dev, batch=3)
    second = vattn.plan(three["seq_lens"], three["cu_seqlens_q"], num_kv_heads=2, page_size=16,
                        workspace=first.workspace)
    assert second is not first and first.workspace.live is second
    for debug in (False, True, False):
        with pytest.raises(ValueError, match=STALE):
            vattn.attention(**x, plan=first, debug=debug)
    again = vattn.plan(x["seq_lens"], x["cu_seqlens_q"], num_kv_heads=2, page_size=16, workspace=first.workspace)
    assert again is first and first.workspace.live is first  # planned anew: live again, the other one stale


def test_a_cpu_plan_names_q_lens_outside_the_workspace_and_a_prefix_sum_not_from_zero(dev):
    """A CPU plan reads the lengths on the host anyway: a q_len over max_q_len (whose rows the kernel never
    writes) and a cu_seqlens_q[0] != 0 (NaN) raise without debug=True, on the checked and the cached path."""
    if dev != "cpu":
        pytest.skip("the host path runs on a CPU; a GPU plan reads no value without debug=True")
    ws = ws_for(dev)
    i32 = dict(dtype=torch.int32, device=dev)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^q_len of sequence 0 \(cu_seqlens_q\[1\] - cu_seqlens_q\[0\]\): got 6; "
                                             r"supported: 0\.\.4 \(the workspace's max_q_len\)$"):
            vattn.plan(torch.tensor([40, 17], **i32), torch.tensor([0, 6, 8], **i32), num_kv_heads=2, page_size=16,
                       workspace=ws)
        with pytest.raises(ValueError, match=r"^cu_seqlens_q\[0\]: got 1; supported: 0$"):
            vattn.plan(torch.tensor([40, 17], **i32), torch.tensor([1, 3, 5], **i32), num_kv_heads=2, page_size=16,
                       workspace=ws)
    assert ws.live is None  # nothing was planned


def test_attention_checks_q_rows_and_table_pages_against_a_cpu_plans_lengths(dev):
    """Where plan() read the lengths on the host, q's rows (fewer than cu_seqlens_q[-1]: reads past q's end) and
    block_tables' pages (fewer than the longest sequence's: reads past the table) are checked on each call."""
    if dev != "cpu":
        pytest.skip("a GPU plan reads no value: these go to debug=True")
    x, pl = planned(dev)  # two sequences of 40 tokens and 4 queries each, 5 pages of 16 a sequence
    with pytest.raises(ValueError, match=r"^q.shape\[0\]: got 7; supported: cu_seqlens_q\[-1\] = 8, the query tokens "
                                         r"the plan was made for"):
        vattn.attention(**dict(x, q=x["q"][:7]), plan=pl)
    with pytest.raises(ValueError, match=r"^block_tables.shape: got \(2, 2\); supported: at least 3 pages a sequence: "
                                         r"the plan's longest sequence has 40 tokens \(page_size 16\)$"):
        vattn.attention(**dict(x, block_tables=x["block_tables"][:, :2]), plan=pl)


def test_debug_names_a_plan_made_for_other_lengths(dev):
    """A plan reused after the lengths grew reads too little KV (err 0.23, no error): debug=True compares the plan's
    pieces with the call's seq_lens and q_lens."""
    x, pl = planned(dev)  # pieces cover [0, 40) of each sequence
    i32 = dict(dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match=r"^plan: got KV positions \[0, 40\) for sequence 0; supported: \[0, 41\) "
                                         r"for seq_lens\[0\] = 41 with q_len 4: a plan made for these seq_lens and "
                                         r"cu_seqlens_q \(call vattn.plan again after they change\)$"):
        vattn.attention(**dict(x, seq_lens=torch.tensor([41, 40], **i32)), plan=pl, debug=True)
    with pytest.raises(ValueError, match=r"^plan: got KV positions \[0, 40\) for sequence 1; supported: \[0, 0\) "
                                         r"for seq_lens\[1\] = 0 with q_len 4"):
        vattn.attention(**dict(x, seq_lens=torch.tensor([40, 0], **i32)), plan=pl, debug=True)


def test_the_docstrings_say_which_values_go_unchecked():
    """On a GPU no value is read without debug=True (a sync): the API says so, and what bad values do."""
    doc = " ".join(vattn.attention.__doc__.split())
    assert "Values are NOT validated unless debug=True" in doc and "crash the process or corrupt memory" in doc
    plan_doc = " ".join(vattn.plan.__doc__.split())
    assert "On CUDA no value is read (that would sync): such lengths are NOT checked" in plan_doc
    assert "a q_len above max_q_len leaves output rows unwritten; debug=True" in plan_doc

