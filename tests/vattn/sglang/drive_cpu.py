"""Routing scenarios of the real VattnAttnBackend on CPU, printed as one JSON object.

Two bases: sglang's real Triton backend (its attention kernels recorded at their module
boundary), and a recording stand-in for FA3/FlashInfer installed in sglang's registry under
"fa3" (stand_in_base.py; scenarios_wrapper.py). Both are built by the wrapper's registry factory,
as on a server.

Run by test_contract.py in a subprocess because Triton decides at decoration time whether its
kernels are interpreted: TRITON_INTERPRET=1 must be set before sglang's kernels import, and
must not leak into the rest of the test session. sglang's own metadata kernels run in the
interpreter; the two attention kernels are intercepted at their module boundaries (vattn's
needs a GPU; the Triton backend's is recorded), and the intercepted vattn call is answered by
vattn.reference so the output is checked against the oracle on sglang's real layout.
"""
from __future__ import annotations

import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import sglang_env as E  # noqa: E402

Q_LEN = 4


def make_backend(env_vars: dict | None = None, *, base: str = "triton", **env_kw):
    """The registry's `vattn` entry over `base`; env_vars (VATTN, ...) apply while it is built."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    old = {k: os.environ.get(k) for k in ["VATTN_BASE", *(env_vars or {})]}
    os.environ.update({"VATTN_BASE": base, **(env_vars or {})})
    try:
        env = E.build_env(device="cpu", **env_kw)
        backend = ATTENTION_BACKENDS["vattn"](env.runner)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    calls = {"vattn": [], "base_extend": 0, "base_decode": 0}
    if base != "triton":
        return env, backend, calls

    def base_extend(q, k, v, o, *a, **kw):
        calls["base_extend"] += 1
        o.zero_()

    def base_decode(q, k_buf, v_buf, o, *a, **kw):
        calls["base_decode"] += 1
        o.zero_()

    triton = backend.vattn_base
    triton.extend_attention_fwd = base_extend  # the Triton base's kernel boundary (set per instance)
    triton.decode_attention_fwd = base_decode
    return env, backend, calls


def intercept_vattn(calls, fail: bool = False):
    import vattn

    def fake_attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale=None,
                       v_descale=None, softmax_scale=None, *, plan, out=None, debug=False):
        calls["vattn"].append(dict(block_tables=block_tables.tolist(), seq_lens=seq_lens.tolist(),
                                    cu=cu_seqlens_q.tolist(), kv_shape=list(k_cache.shape),
                                    plan_batch=plan.batch, plan_id=id(plan)))
        if fail:
            raise RuntimeError("simulated build failure")
        ref = vattn.reference(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                              softmax_scale)
        out.copy_(ref.to(out.dtype))
        return out

    vattn.attention = fake_attention


def run_layer(env, backend, fb, layer, tokens: int, seed: int = 1, sinks: bool = False):
    import torch

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, layer.tp_q_head_num * layer.qk_head_dim, generator=g).to(torch.bfloat16)
    k = torch.randn(tokens, layer.tp_k_head_num, layer.qk_head_dim, generator=g).to(torch.bfloat16)
    v = torch.randn(tokens, layer.tp_k_head_num, layer.qk_head_dim, generator=g).to(torch.bfloat16)
    extra = {"sinks": torch.zeros(layer.tp_q_head_num)} if sinks else {}
    out = backend.forward(q, k, v, layer, fb, **extra)
    return q, k, v, out


def oracle(env, fb, layer, q, full_lens, q_len):
    """vattn.reference over the pool as sglang wrote it, with block tables built independently."""
    import torch
    import vattn

    p = env.page_size
    kc = env.kv_pool.get_key_buffer(layer.layer_id)
    vc = env.kv_pool.get_value_buffer(layer.layer_id)
    pages = kc.shape[0] // p
    width = max(len(env.pages[r]) for r in fb.req_pool_indices.tolist())
    tables = torch.tensor([env.pages[r] + [0] * (width - len(env.pages[r])) for r in fb.req_pool_indices.tolist()],
                          dtype=torch.int32)
    cu = torch.arange(0, (len(full_lens) + 1) * q_len, q_len, dtype=torch.int32)
    return vattn.reference(q.view(-1, layer.tp_q_head_num, layer.qk_head_dim),
                           kc[: pages * p].view(pages, p, *kc.shape[1:]), vc[: pages * p].view(pages, p, *vc.shape[1:]),
                           tables, torch.tensor(full_lens, dtype=torch.int32), cu, None, None, layer.scaling)


def scenario_verify(result):
    import torch
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    env, backend, calls = make_backend()
    intercept_vattn(calls)
    prefix = [19, 40]
    rows = [3, 1]
    for r, s in zip(rows, prefix):
        E.place(env, r, s + Q_LEN)
    fb = E.forward_batch(env, ForwardMode.TARGET_VERIFY, rows, prefix, Q_LEN, spec_info=E.verify_spec(Q_LEN))
    backend.init_forward_metadata(fb)
    layer = RadixAttention(num_heads=16, head_dim=256, scaling=256 ** -0.5, num_kv_heads=1, layer_id=1)
    q, k, v, out = run_layer(env, backend, fb, layer, len(rows) * Q_LEN)
    ref = oracle(env, fb, layer, q, [s + Q_LEN for s in prefix], Q_LEN)
    written = env.kv_pool.get_key_buffer(1)[fb.out_cache_loc]
    result["verify"] = dict(
        calls=calls["vattn"], base_extend=calls["base_extend"],
        expected_tables=[env.pages[r] for r in rows],
        max_err=float((out.float().view_as(ref) - ref).abs().max()),
        ref_scale=float(ref.abs().max()), kv_written=bool(torch.equal(written, k)))
    run_layer(env, backend, fb, layer, len(rows) * Q_LEN, seed=2)  # a second layer: same plan, no rebuild
    result["verify"]["plan_ids"] = [c.pop("plan_id") for c in calls["vattn"]]


def scenario_modes(result):
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    layer = RadixAttention(num_heads=16, head_dim=256, scaling=256 ** -0.5, num_kv_heads=1, layer_id=0)
    cases = {
        "extend": (ForwardMode.EXTEND, [30], 6, None),
        "draft_extend": (ForwardMode.DRAFT_EXTEND_V2, [27], Q_LEN, E.verify_spec(Q_LEN)),
        "decode": (ForwardMode.DECODE, [33], 1, None),
    }
    for name, (mode, lens, q_len, spec) in cases.items():
        env, backend, calls = make_backend()
        intercept_vattn(calls)
        E.place(env, 2, lens[0] + (q_len if mode.is_target_verify() else 0))
        fb = E.forward_batch(env, mode, [2], lens, q_len, spec_info=spec)
        backend.init_forward_metadata(fb)
        run_layer(env, backend, fb, layer, q_len)
        result[name] = dict(vattn=len(calls["vattn"]), base_extend=calls["base_extend"],
                            base_decode=calls["base_decode"],
                            seq_lens=[c["seq_lens"] for c in calls["vattn"]], cu=[c["cu"] for c in calls["vattn"]])


def scenario_refusals(result):
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    layers = {
        "softcap": RadixAttention(num_heads=16, head_dim=256, scaling=0.06, num_kv_heads=1, layer_id=0, logit_cap=30.0),
        "sinks": RadixAttention(num_heads=16, head_dim=256, scaling=0.06, num_kv_heads=1, layer_id=0),
    }
    for name, layer in layers.items():
        env, backend, calls = make_backend()
        intercept_vattn(calls)
        E.place(env, 1, 20 + Q_LEN)
        fb = E.forward_batch(env, ForwardMode.TARGET_VERIFY, [1], [20], Q_LEN, spec_info=E.verify_spec(Q_LEN))
        backend.init_forward_metadata(fb)
        run_layer(env, backend, fb, layer, Q_LEN, sinks=name == "sinks")
        result[name] = dict(vattn=len(calls["vattn"]), base_extend=calls["base_extend"])
    # a batch whose metadata was never initialised must not reuse the previous batch's block tables
    env, backend, calls = make_backend()
    intercept_vattn(calls)
    E.place(env, 1, 20 + Q_LEN)
    fb = E.forward_batch(env, ForwardMode.TARGET_VERIFY, [1], [20], Q_LEN, spec_info=E.verify_spec(Q_LEN))
    backend.init_forward_metadata(fb)
    other = E.forward_batch(env, ForwardMode.TARGET_VERIFY, [1], [20], Q_LEN, spec_info=E.verify_spec(Q_LEN))
    run_layer(env, backend, other, RadixAttention(num_heads=16, head_dim=256, scaling=0.06, num_kv_heads=1,
                                                  layer_id=0), Q_LEN)
    result["stale_batch"] = dict(vattn=len(calls["vattn"]), base_extend=calls["base_extend"])
    env, backend, calls = make_backend({"VATTN": "0"})
    intercept_vattn(calls)
    E.place(env, 1, 20 + Q_LEN)
    fb = E.forward_batch(env, ForwardMode.TARGET_VERIFY, [1], [20], Q_LEN, spec_info=E.verify_spec(Q_LEN))
    backend.init_forward_metadata(fb)
    run_layer(env, backend, fb, RadixAttention(num_heads=16, head_dim=256, scaling=0.06, num_kv_heads=1, layer_id=0),
              Q_LEN)
    result["vattn_off"] = dict(vattn=len(calls["vattn"]), base_extend=calls["base_extend"],
                               reason=backend.vattn_reason)
    result["triton_base"] = dict(cls=type(backend.vattn_base).__name__, name=backend.vattn_base_name)


def scenario_failure(result):
    """Last: it switches vattn off for the rest of this process."""
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    records = []
    handler = logging.Handler()
    handler.emit = lambda rec: records.append(rec.getMessage()) if rec.levelno >= logging.WARNING else None
    logging.getLogger("vattn.sglang.backend").addHandler(handler)
    logging.getLogger("vattn.sglang.backend").setLevel(logging.INFO)
    env, backend, calls = make_backend()
    intercept_vattn(calls, fail=True)
    layer = RadixAttention(num_heads=16, head_dim=256, scaling=0.06, num_kv_heads=1, layer_id=0)
    E.place(env, 1, 20 + Q_LEN)
    for _ in range(3):
        fb = E.forward_batch(env, ForwardMode.TARGET_VERIFY, [1], [20], Q_LEN, spec_info=E.verify_spec(Q_LEN))
        backend.init_forward_metadata(fb)
        _, _, _, out = run_layer(env, backend, fb, layer, Q_LEN)
    result["failure"] = dict(vattn_attempts=len(calls["vattn"]), base_extend=calls["base_extend"],
                             warnings=[m for m in records if "vattn" in m], out_shape=list(out.shape))


def main():
    E.import_sglang()
    E.publish()
    import vattn.sglang

    vattn.sglang.register()
    import scenarios_wrapper as W

    result = {"sglang": E.sglang_version()}
    W.run(result, make_backend, intercept_vattn, run_layer)
    scenario_verify(result)
    scenario_modes(result)
    scenario_refusals(result)
    scenario_failure(result)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
