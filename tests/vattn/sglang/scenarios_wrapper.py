"""Wrapper scenarios over the stand-in production base (stand_in_base.py), run by drive_cpu.py:
routing per forward mode with VATTN=1 and VATTN=0, delegation of the base's hooks, flags and
state, and the path counters (eager forwards, graph captures, graph replays, padded replays).
"""
from __future__ import annotations

from types import SimpleNamespace

import sglang_env as E
import stand_in_base

Q_LEN = 4


def _layer(layer_id=0):
    from sglang.srt.layers.radix_attention import RadixAttention

    return RadixAttention(num_heads=16, head_dim=256, scaling=256 ** -0.5, num_kv_heads=1, layer_id=layer_id)


def _batches(env):
    """One ForwardBatch per case: (name, mode, rows, sglang's seq_lens, q_len, spec_info)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    chain = SimpleNamespace(kv_indptr=object())  # a multi-step draft step's own KV chain
    cases = [("target_verify", ForwardMode.TARGET_VERIFY, [20], Q_LEN, E.verify_spec(Q_LEN)),
             ("draft_extend", ForwardMode.DRAFT_EXTEND_V2, [27], Q_LEN, E.verify_spec(Q_LEN)),
             ("decode", ForwardMode.DECODE, [33], 1, None),
             ("draft_decode_step", ForwardMode.DECODE, [33], 1, chain),
             ("extend", ForwardMode.EXTEND, [30], 6, None),
             ("mixed", ForwardMode.MIXED, [30], 6, None),
             # 4 tokens per row but the verify input declares 2: not a uniform batch
             ("ragged_verify", ForwardMode.TARGET_VERIFY, [20], Q_LEN, E.verify_spec(2))]
    out = {}
    for i, (name, mode, lens, q_len, spec) in enumerate(cases):
        row = 1 + i % 7
        if row not in env.pages:
            E.place(env, row, 64)
        out[name] = (E.forward_batch(env, mode, [row], lens, q_len, spec_info=spec), q_len)
    return out


def _route(backend, calls, env, run_layer):
    """Which path served each case's layer call: 'vattn', or the base's method that ran."""
    seen = {}
    for name, (fb, q_len) in _batches(env).items():
        before_v, before_b = len(calls["vattn"]), len(backend.vattn_base.calls)
        backend.init_forward_metadata(fb)
        run_layer(env, backend, fb, _layer(), q_len)
        served = [c["call"] for c in backend.vattn_base.calls[before_b:] if c["call"].startswith("forward")]
        seen[name] = "vattn" if len(calls["vattn"]) > before_v else ",".join(served) or "none"
    return seen


def scenario_routing(result, make_backend, intercept_vattn, run_layer):
    stand_in_base.install("fa3")
    for switch in ("1", "0"):
        env, backend, calls = make_backend({"VATTN": switch}, base="fa3")
        intercept_vattn(calls)
        result[f"stand_in_vattn{switch}"] = dict(
            routes=_route(backend, calls, env, run_layer), base_cls=type(backend.vattn_base).__name__,
            base_name=backend.vattn_base_name, reason=backend.vattn_reason,
            metadata_calls=sorted({c["call"] for c in backend.vattn_base.calls if not c["call"].startswith("forward")}))


def scenario_delegation(result, make_backend):
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    env, backend, _ = make_backend({"VATTN": "1"}, base="fa3")
    base = backend.vattn_base
    backend.init_cuda_graph_state(8, 32)
    before = base.forward_metadata
    backend.forward_metadata = None  # sglang's eager runner resets it this way
    backend.prefill_attention_backend_str = "vattn"  # sglang stamps the resolved name
    result["delegation"] = dict(
        is_attention_backend=isinstance(backend, AttentionBackend),
        ragged_verify=backend.supports_ragged_verify_graph, needs_cpu_seq_lens=backend.needs_cpu_seq_lens,
        fill=backend.get_cuda_graph_seq_len_fill_value(), graph_state=list(base.graph_state),
        metadata_read=before, metadata_written=base.forward_metadata, stamp=base.prefill_attention_backend_str,
        helper=backend.base_only_helper(), workspace_batch=backend.vattn_max_batch)


def scenario_counters(result, make_backend, intercept_vattn, run_layer):
    """Eager forwards, a capture and replays, and VATTN=0, against hand-counted totals."""
    from vattn.sglang import counters

    c = counters.process_counters()
    c.reset()
    env, backend, calls = make_backend({"VATTN": "1"}, base="fa3")
    intercept_vattn(calls)
    batches = _batches(env)
    for name in ("target_verify", "target_verify", "draft_extend", "decode", "draft_decode_step", "extend"):
        fb, q_len = batches[name]
        backend.init_forward_metadata(fb)
        for layer_id in (0, 1):  # per-layer calls must not count
            run_layer(env, backend, fb, _layer(layer_id), q_len)
    fb, q_len = batches["target_verify"]
    backend.init_forward_metadata_out_graph(fb, in_capture=True)  # a capture is not a forward
    backend.init_forward_metadata_in_graph(fb)
    run_layer(env, backend, fb, _layer(), q_len)
    for _ in range(3):  # three replays: sglang runs out_graph eagerly before each
        backend.init_forward_metadata_out_graph(fb)
    off_env, off, off_calls = make_backend({"VATTN": "0"}, base="fa3")
    E.place(off_env, 1, 64)
    off_fb = E.forward_batch(off_env, fb.forward_mode, [1], [20], Q_LEN, spec_info=E.verify_spec(Q_LEN))
    off.init_forward_metadata(off_fb)
    off.init_forward_metadata_out_graph(off_fb)
    line = c.line()
    result["counters"] = dict(snapshot={k: c.snapshot()[k] for k in counters.PATHS}, line=line,
                              parsed=counters.parse_log("noise\n" + line + "\nmore noise"),
                              vattn_calls=len(calls["vattn"]) + len(off_calls["vattn"]),
                              base_graph_hooks=[[h["call"], h.get("in_capture")] for h in backend.vattn_base.calls
                                                if h["call"] in ("out_graph", "in_graph")])


def _replay_view(fb, bs: int, fill: int):
    """What sglang's decode CUDA-graph runner hands out_graph before replaying the graph of `bs`
    for the smaller batch `fb`: its own build_replay_fb_view over capture buffers padded with
    row 0 and the fill length, so `out_cache_loc` keeps only the real rows' tokens."""
    import inspect

    import torch
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner as runner

    raw = fb.batch_size
    tokens = bs * Q_LEN
    seq_lens = torch.cat([fb.seq_lens, torch.full((bs - raw,), fill, dtype=fb.seq_lens.dtype)])
    buffers = SimpleNamespace(
        input_ids=torch.zeros(tokens, dtype=torch.int64), positions=torch.zeros(tokens, dtype=torch.int64),
        req_pool_indices=torch.cat([fb.req_pool_indices, torch.zeros(bs - raw, dtype=torch.int64)]),
        seq_lens=seq_lens, seq_lens_cpu=seq_lens.cpu(), encoder_lens=None, mamba_track_indices=None)
    for name in ("max_seq_len_host", "out_cache_loc_virtual", "kv_loc_plan", "kv_loc_cols", "max_seq_len_override",
                 "lora_ids", "can_run_decode_cuda_graph"):  # 0.5.23's view reads these; absent on the stand-in
        if not hasattr(fb, name):
            setattr(fb, name, None)
    kwargs = dict(forward_batch=fb, buffers=buffers, bs=bs, raw_bs=raw, num_tokens=tokens, seq_len_fill_value=fill,
                  capture_forward_mode=fb.forward_mode, is_encoder_decoder=False, global_num_tokens_cpu=None)
    params = inspect.signature(runner.build_replay_fb_view).parameters
    return runner.build_replay_fb_view(**{k: v for k, v in kwargs.items() if k in params})


def scenario_padded_replay(result, make_backend, intercept_vattn, run_layer):
    """Graphs captured for 2 and 4 rows; replays of 2 (exact) and 3 (padded to 4) verify rows."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from vattn.sglang import counters

    c = counters.process_counters()
    c.reset()
    env, backend, calls = make_backend({"VATTN": "1"}, base="fa3")
    intercept_vattn(calls)
    for row in (1, 2, 3, 4):
        E.place(env, row, 64)

    def verify(rows):
        return E.forward_batch(env, ForwardMode.TARGET_VERIFY, rows, [20] * len(rows), Q_LEN,
                               spec_info=E.verify_spec(Q_LEN))

    for bs in (4, 2):  # sglang captures the largest first
        fb = verify(list(range(1, bs + 1)))
        backend.init_forward_metadata_out_graph(fb, in_capture=True)
        backend.init_forward_metadata_in_graph(fb)
        run_layer(env, backend, fb, _layer(), bs * Q_LEN)
    recorded = len(calls["vattn"])
    fill = backend.get_cuda_graph_seq_len_fill_value()
    backend.init_forward_metadata_out_graph(_replay_view(verify([1, 2]), 2, fill))
    padded = _replay_view(verify([1, 2, 3]), 4, fill)
    backend.init_forward_metadata_out_graph(padded)
    result["padded_replay"] = dict(
        snapshot={k: c.snapshot()[k]["target_verify"] for k in counters.PATHS}, captured_vattn_calls=recorded,
        view=dict(batch_size=padded.batch_size, num_padding=padded.num_padding,
                  rows=int(padded.req_pool_indices.shape[0]), tokens=int(padded.out_cache_loc.shape[0])))


def run(result, make_backend, intercept_vattn, run_layer):
    scenario_routing(result, make_backend, intercept_vattn, run_layer)
    scenario_delegation(result, make_backend)
    scenario_counters(result, make_backend, intercept_vattn, run_layer)
    scenario_padded_replay(result, make_backend, intercept_vattn, run_layer)
