"""GPU tests of the vattn sglang backend: its verify / draft-extend / decode entries on tensors
laid out exactly as sglang lays them out (real MHATokenToKVPool, ReqToTokenPool, on 0.5.23 KVLocPlan,
and the base's own metadata code), matched against vattn.reference; a forced build failure served
by the base with one warning; CUDA-graph capture and replay on a new batch.

Each test runs over two bases built by the wrapper's registry factory, as on a server: `triton`
(sglang's Triton backend: needs only sglang's Python package) and `fa3` (sglang's FlashAttention-3
backend: needs sglang-kernel's FA3 ops and a Hopper GPU; skipped otherwise).

Needs CUDA and sglang 0.5.17 or 0.5.23 importable (`pip install --no-deps sglang==...` plus the
pure-Python packages its attention modules import: gpu_wheels.txt).
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_env as E  # noqa: E402

SGL_KERNEL_STUBBED = E.stub_missing_sgl_kernel()
E.require_sglang()

from vattn.contract import FP8_TOLERANCE, HALF_TOLERANCE  # noqa: E402

FP8 = torch.float8_e4m3fn


def _fa3_missing():
    if SGL_KERNEL_STUBBED:
        return "sglang-kernel is not installed (stubbed)"
    if torch.cuda.get_device_capability()[0] != 9:
        return "FA3 needs a Hopper GPU"
    try:
        from sgl_kernel.flash_attn import flash_attn_with_kvcache  # noqa: F401
    except Exception as exc:  # the large flash_ops library may be left out of a light install
        return f"sgl_kernel.flash_attn is not importable: {exc}"
    return None


BASES = [pytest.param("triton", id="triton"),
         pytest.param("fa3", id="fa3", marks=pytest.mark.skipif(_fa3_missing() is not None,
                                                               reason=str(_fa3_missing())))]
# odd lengths, a page-boundary length and a long one, in one batch (committed prefix lengths)
PREFIX = [54, 97, 1, 16, 2999]


@pytest.fixture
def published():
    E.publish(device="cuda")
    import vattn.sglang
    from vattn.sglang import backend as B

    vattn.sglang.register()
    B._ProcessState.disabled = None
    yield B
    B._ProcessState.disabled = None


def _layer(kv_dtype, q_heads, layer_id=1):
    from sglang.srt.layers.radix_attention import RadixAttention

    layer = RadixAttention(num_heads=q_heads, head_dim=256, scaling=256 ** -0.5, num_kv_heads=1, layer_id=layer_id)
    if kv_dtype == FP8:  # per-tensor scales, as an fp8 checkpoint gives them
        layer.k_scale = torch.tensor(0.05, device="cuda")
        layer.v_scale = torch.tensor(0.04, device="cuda")
        layer.k_scale_float, layer.v_scale_float = 0.05, 0.04
    return layer


def _setup(B, mode_name, kv_dtype, q_heads, page_size, base="triton", monkeypatch=None):
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    mode, q_len = {"target_verify": (ForwardMode.TARGET_VERIFY, 4), "draft_extend": (ForwardMode.DRAFT_EXTEND_V2, 4),
                   "decode": (ForwardMode.DECODE, 1)}[mode_name]
    env = E.build_env(device="cuda", kv_dtype=kv_dtype, q_heads=q_heads, page_size=page_size,
                      num_pages=-(-4096 // page_size) * 6, rows=8, context_len=4096)
    monkeypatch.setenv("VATTN_BASE", base)
    backend = ATTENTION_BACKENDS["vattn"](env.runner)
    assert isinstance(backend, B.VattnAttnBackend) and backend.vattn_base_name == base
    rows = [5, 0, 3, 7, 2]
    full = [p + q_len for p in PREFIX]
    for row, length in zip(rows, full):
        E.place(env, row, length)
    lens = PREFIX if mode_name == "target_verify" else full
    spec = E.verify_spec(q_len) if mode_name != "decode" else None
    fb = E.forward_batch(env, mode, rows, lens, q_len, spec_info=spec)
    return env, backend, fb, rows, full, q_len


def _inputs(n_tokens, layer, seed=3):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(n_tokens, layer.tp_q_head_num * 256, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(n_tokens, 1, 256, device="cuda", generator=g).to(torch.bfloat16) * 0.2
    v = torch.randn(n_tokens, 1, 256, device="cuda", generator=g).to(torch.bfloat16) * 0.2
    return q, k, v


def _oracle(env, rows, full, q_len, layer, q):
    import vattn

    p = env.page_size
    kc, vc = env.kv_pool.get_key_buffer(layer.layer_id), env.kv_pool.get_value_buffer(layer.layer_id)
    pages = kc.shape[0] // p
    width = max(len(env.pages[r]) for r in rows)
    tables = torch.tensor([env.pages[r] + [0] * (width - len(env.pages[r])) for r in rows], dtype=torch.int32,
                          device="cuda")
    cu = torch.arange(0, (len(rows) + 1) * q_len, q_len, dtype=torch.int32, device="cuda")
    fp8 = kc.dtype == FP8
    return vattn.reference(q.view(-1, layer.tp_q_head_num, 256), kc[: pages * p].view(pages, p, 1, 256),
                           vc[: pages * p].view(pages, p, 1, 256), tables,
                           torch.tensor(full, dtype=torch.int32, device="cuda"), cu,
                           layer.k_scale.reshape(1).float() if fp8 else None,
                           layer.v_scale.reshape(1).float() if fp8 else None, layer.scaling)


def _rel_err(out, ref):
    return float((out.float().view_as(ref) - ref).norm() / ref.norm().clamp_min(1e-6))


def _record_base_calls(backend):
    """Wrap the base's attention entries (instance attributes) to prove which path served."""
    calls = []
    base = backend.vattn_base
    for name in ("forward", "forward_extend", "forward_decode"):
        real = getattr(base, name)
        setattr(base, name, lambda *a, _real=real, _name=name, **kw: (calls.append(_name), _real(*a, **kw))[1])
    return calls


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("mode", ["target_verify", "draft_extend", "decode"])
@pytest.mark.parametrize("kv_dtype, tol", [(FP8, FP8_TOLERANCE), (torch.bfloat16, HALF_TOLERANCE)], ids=["fp8", "bf16"])
@pytest.mark.parametrize("q_heads, page_size", [(16, 16), (8, 16), (16, 1), (16, 64)],
                         ids=["gqa16-p16", "gqa8-p16", "gqa16-p1", "gqa16-p64"])
def test_backend_entry_matches_reference_on_sglang_layout(published, monkeypatch, base, mode, kv_dtype, tol,
                                                          q_heads, page_size):
    env, backend, fb, rows, full, q_len = _setup(published, mode, kv_dtype, q_heads, page_size, base, monkeypatch)
    base_calls = _record_base_calls(backend)
    layer = _layer(kv_dtype, q_heads)
    backend.init_forward_metadata(fb)
    q, k, v = _inputs(len(rows) * q_len, layer)
    out = backend.forward(q, k, v, layer, fb)
    torch.cuda.synchronize()
    assert published._ProcessState.disabled is None, published._ProcessState.disabled
    assert base_calls == [], f"the call fell back to the {base} base"
    assert backend.vattn_inputs is not None and backend.vattn_inputs.mode == mode
    _assert_kv_written(env, fb, layer, k)
    ref = _oracle(env, rows, full, q_len, layer, q)
    assert _rel_err(out, ref) <= tol


def _assert_kv_written(env, fb, layer, k):
    """The new tokens' K is in the pool where req_to_token says (sglang's write, which vattn reads)."""
    raw = env.kv_pool.get_key_buffer(layer.layer_id)[fb.out_cache_loc]
    scale = float(layer.k_scale) if raw.dtype == FP8 else 1.0
    stored = raw.float()
    want = k.float().view_as(stored)
    assert float((stored * scale - want).norm() / want.norm()) <= 7e-2, "the KV write did not land in the pool"


@pytest.mark.parametrize("base", BASES)
def test_build_failure_warns_once_and_base_serves(published, monkeypatch, caplog, base):
    import vattn

    def broken(*args, **kwargs):
        raise RuntimeError("forced vattn build failure")

    monkeypatch.setattr(vattn, "Workspace", broken)
    env, backend, fb, rows, full, q_len = _setup(published, "target_verify", torch.bfloat16, 16, 16, base,
                                                 monkeypatch)
    base_calls = _record_base_calls(backend)
    layer = _layer(torch.bfloat16, 16)
    with caplog.at_level(logging.WARNING, logger="vattn.sglang.backend"):
        for _ in range(3):
            backend.init_forward_metadata(fb)
            q, k, v = _inputs(len(rows) * q_len, layer)
            out = backend.forward(q, k, v, layer, fb)
    torch.cuda.synchronize()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "vattn" in r.getMessage()]
    assert len(warnings) == 1 and "forced vattn build failure" in warnings[0].getMessage()
    assert published._ProcessState.disabled is not None and backend.vattn_inputs is None
    assert base_calls.count("forward") == 3
    ref = _oracle(env, rows, full, q_len, layer, q)  # the base served, correctly
    assert _rel_err(out, ref) <= FP8_TOLERANCE


@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("mode", ["target_verify", "draft_extend", "decode"])
def test_cuda_graph_capture_then_replay_on_a_new_batch(published, monkeypatch, base, mode):
    """sglang's graph protocol: init_cuda_graph_state; out_graph(in_capture=True); capture
    {in_graph; forward}; then a new batch in the same static tensors, out_graph(), replay.
    The replay is counted (out_graph runs eagerly before it); the capture is not."""
    from vattn.sglang import counters

    env, backend, fb, rows, full, q_len = _setup(published, mode, FP8, 16, 16, base, monkeypatch)
    counts = counters.process_counters()
    counts.reset()
    layer = _layer(FP8, 16)
    n = len(rows)
    backend.init_cuda_graph_state(8, 8 * q_len)
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    q, k, v = _inputs(n * q_len, layer)

    def step():
        backend.init_forward_metadata_in_graph(fb)
        return backend.forward(q, k, v, layer, fb)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: compiles vattn and sglang's kernels outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    assert published._ProcessState.disabled is None, published._ProcessState.disabled
    assert backend.vattn_inputs is not None and backend.vattn_inputs.mode == mode

    # a new batch: other rows, other lengths, other pages, written into the same static tensors
    new_rows, new_prefix = [6, 4, 1, 0, 3], [700, 5, 2048, 33, 130]
    new_full = [p + q_len for p in new_prefix]
    env.pages.clear()
    for row, length in zip(new_rows, new_full):
        E.place(env, row, length, seed=11)
    new_lens = new_prefix if mode == "target_verify" else new_full
    r2t = env.req_to_token_pool.req_to_token
    fb.req_pool_indices.copy_(torch.tensor(new_rows, device="cuda"))
    fb.seq_lens.copy_(torch.tensor(new_lens, device="cuda"))
    fb.seq_lens_cpu.copy_(torch.tensor(new_lens))  # sglang refreshes the host mirror before a replay too
    fb.seq_lens_sum = sum(new_full)
    fb.positions.copy_(torch.cat([torch.arange(f - q_len, f) for f in new_full]))
    fb.out_cache_loc.copy_(torch.cat([r2t[r, f - q_len: f].long() for r, f in zip(new_rows, new_full)]))
    q2, k2, v2 = _inputs(n * q_len, layer, seed=9)
    q.copy_(q2), k.copy_(k2), v.copy_(v2)
    backend.init_forward_metadata_out_graph(fb)
    graph.replay()
    torch.cuda.synchronize()
    ref = _oracle(env, new_rows, new_full, q_len, layer, q)
    assert _rel_err(out, ref) <= FP8_TOLERANCE
    assert counts.snapshot()["vattn"][mode] == 1 and sum(counts.snapshot()["base"].values()) == 0
