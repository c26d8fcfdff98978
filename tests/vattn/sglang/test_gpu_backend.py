"""GPU tests of the vattn sglang backend: its verify / draft-extend / decode entries on tensors
laid out exactly as sglang lays them out (real MHATokenToKVPool, ReqToTokenPool, KVLocPlan and
the Triton backend's own metadata kernels), matched against vattn.reference; and a forced
build failure served by the Triton base with one warning.

Needs CUDA and sglang 0.5.23 importable (`pip install --no-deps sglang==0.5.23` plus the few
pure-Python packages its attention modules import; see the final report / .ci/run).
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
try:
    E.import_sglang()
except ImportError as exc:
    pytest.skip(f"sglang 0.5.23 is not importable: {exc}", allow_module_level=True)

from vattn.contract import FP8_TOLERANCE, HALF_TOLERANCE  # noqa: E402

FP8 = torch.float8_e4m3fn
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


def _setup(B, mode_name, kv_dtype, q_heads, page_size):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    mode, q_len = {"target_verify": (ForwardMode.TARGET_VERIFY, 4), "draft_extend": (ForwardMode.DRAFT_EXTEND_V2, 4),
                   "decode": (ForwardMode.DECODE, 1)}[mode_name]
    env = E.build_env(device="cuda", kv_dtype=kv_dtype, q_heads=q_heads, page_size=page_size,
                      num_pages=-(-4096 // page_size) * 6, rows=8, context_len=4096)
    backend = B.VattnAttnBackend(env.runner)
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


@pytest.mark.parametrize("mode", ["target_verify", "draft_extend", "decode"])
@pytest.mark.parametrize("kv_dtype, tol", [(FP8, FP8_TOLERANCE), (torch.bfloat16, HALF_TOLERANCE)], ids=["fp8", "bf16"])
@pytest.mark.parametrize("q_heads, page_size", [(16, 16), (8, 16), (16, 1), (16, 64)],
                         ids=["gqa16-p16", "gqa8-p16", "gqa16-p1", "gqa16-p64"])
def test_backend_entry_matches_reference_on_sglang_layout(published, mode, kv_dtype, tol, q_heads, page_size):
    env, backend, fb, rows, full, q_len = _setup(published, mode, kv_dtype, q_heads, page_size)
    base_calls = []
    for name in ("extend_attention_fwd", "decode_attention_fwd"):  # prove the base did not serve
        real = getattr(backend, name)
        setattr(backend, name, lambda *a, _real=real, **kw: (base_calls.append(1), _real(*a, **kw))[1])
    layer = _layer(kv_dtype, q_heads)
    backend.init_forward_metadata(fb)
    q, k, v = _inputs(len(rows) * q_len, layer)
    out = backend.forward(q, k, v, layer, fb)
    torch.cuda.synchronize()
    assert published._ProcessState.disabled is None, published._ProcessState.disabled
    assert base_calls == [], "the call fell back to the Triton base"
    assert backend._inputs is not None and backend._inputs.mode == mode
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


def test_build_failure_warns_once_and_base_serves(published, monkeypatch, caplog):
    import vattn

    def broken(*args, **kwargs):
        raise RuntimeError("forced vattn build failure")

    monkeypatch.setattr(vattn, "Workspace", broken)
    env, backend, fb, rows, full, q_len = _setup(published, "target_verify", torch.bfloat16, 16, 16)
    layer = _layer(torch.bfloat16, 16)
    with caplog.at_level(logging.WARNING, logger="vattn.sglang.backend"):
        for _ in range(3):
            backend.init_forward_metadata(fb)
            q, k, v = _inputs(len(rows) * q_len, layer)
            out = backend.forward(q, k, v, layer, fb)
    torch.cuda.synchronize()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and "vattn" in r.getMessage()]
    assert len(warnings) == 1 and "forced vattn build failure" in warnings[0].getMessage()
    assert published._ProcessState.disabled is not None and backend._inputs is None
    ref = _oracle(env, rows, full, q_len, layer, q)  # the Triton base served, correctly
    assert _rel_err(out, ref) <= 2e-2


@pytest.mark.parametrize("mode", ["target_verify", "draft_extend", "decode"])
def test_cuda_graph_capture_then_replay_on_a_new_batch(published, mode):
    """sglang's graph protocol: init_cuda_graph_state; out_graph(in_capture=True); capture
    {in_graph; forward}; then a new batch in the same static tensors, out_graph(), replay."""
    env, backend, fb, rows, full, q_len = _setup(published, mode, FP8, 16, 16)
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
    assert backend._inputs is not None and backend._inputs.mode == mode

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
    fb.out_cache_loc.copy_(torch.cat([r2t[r, f - q_len: f].long() for r, f in zip(new_rows, new_full)]))
    q2, k2, v2 = _inputs(n * q_len, layer, seed=9)
    q.copy_(q2), k.copy_(k2), v.copy_(v2)
    backend.init_forward_metadata_out_graph(fb)
    graph.replay()
    torch.cuda.synchronize()
    ref = _oracle(env, new_rows, new_full, q_len, layer, q)
    assert _rel_err(out, ref) <= FP8_TOLERANCE
