"""Which attention calls vattn serves inside sglang, decided from host facts only.

Two levels: `model_reason` once per backend (the model and server configuration), and
`layer_reason` per layer and mode (what the layer object says). Each returns None when vattn
may serve the call, else a short reason; the backend sends every refused call to its base
backend untouched. Pure Python, no sglang or torch import, so the rules are testable anywhere.
Whether vattn is switched on at all (VATTN, VATTN_PLAN) is vattn/switch.py's to say.
"""
from __future__ import annotations

from dataclasses import dataclass

from vattn.contract import HEAD_DIMS, MAX_GQA, MAX_Q_LEN, PAGE_SIZES, Q_DTYPES
from vattn.contract import KV_DTYPES as KERNEL_KV_DTYPES

# torch dtype names the backend serves: the kernel's, less fp16 caches (fp8 e5m2, fp16-only and int4 stay on the base)
KV_DTYPES = tuple(d for d in KERNEL_KV_DTYPES if d != "float16")
MODES = ("target_verify", "draft_extend", "decode")


@dataclass(frozen=True)
class ModelFacts:
    """What the backend knows at construction (one TP rank's view)."""

    head_dim: int
    v_head_dim: int
    num_q_heads: int          # per TP rank
    num_kv_heads: int         # per TP rank
    page_size: int
    kv_dtype: str             # torch dtype name, e.g. "float8_e4m3fn"
    q_dtype: str
    sliding_window: bool      # sliding-window or chunked attention anywhere (sglang sets the runner's
                              # sliding_window_size from attention_chunk_size too)
    use_mla: bool
    dcp_size: int             # decode context parallel: KV sharded across ranks
    translated_kv_ids: bool   # unified memory pool: req_to_token holds virtual ids
    speculative_topk: int     # 0 without speculative decoding
    verify_q_len: int         # draft tokens per request in target verify (0 without spec)


def model_reason(m: ModelFacts) -> str | None:
    """None if the model and server configuration suit vattn, else why not."""
    checks = (
        (m.use_mla, "MLA attention"),
        (m.head_dim not in HEAD_DIMS, f"head_dim {m.head_dim} (supported: {HEAD_DIMS})"),
        (m.v_head_dim != m.head_dim, f"v_head_dim {m.v_head_dim} != head_dim {m.head_dim}"),
        (m.page_size not in PAGE_SIZES, f"page_size {m.page_size} (supported: {PAGE_SIZES})"),
        (m.kv_dtype not in KV_DTYPES, f"KV dtype {m.kv_dtype} (supported: {KV_DTYPES})"),
        (m.q_dtype not in Q_DTYPES, f"model dtype {m.q_dtype} (supported: {Q_DTYPES})"),
        (m.num_kv_heads < 1 or m.num_q_heads % m.num_kv_heads != 0,
         f"{m.num_q_heads} q heads over {m.num_kv_heads} KV heads"),
        (m.num_kv_heads >= 1 and not 1 <= m.num_q_heads // m.num_kv_heads <= MAX_GQA,
         f"GQA group {m.num_q_heads // max(m.num_kv_heads, 1)} (supported: 1..{MAX_GQA})"),
        (m.sliding_window, "sliding-window or chunked attention"),
        (m.dcp_size > 1, f"decode context parallel size {m.dcp_size}"),
        (m.translated_kv_ids, "translated KV ids (unified memory pool)"),
        (m.speculative_topk > 1, f"speculative topk {m.speculative_topk} (tree verify; supported: 1)"),
        (m.verify_q_len > MAX_Q_LEN, f"{m.verify_q_len} draft tokens (supported: <= {MAX_Q_LEN})"),
    )
    for failed, reason in checks:
        if failed:
            return reason
    return None


@dataclass(frozen=True)
class LayerFacts:
    """What one layer call says about itself (RadixAttention fields and forward kwargs)."""

    head_dim: int
    v_head_dim: int
    logit_cap: float
    sliding_window_size: int  # -1 or None: none
    is_cross_attention: bool
    decoder_causal: bool      # attn_type is DECODER (not bidirectional / encoder-only)
    has_sinks: bool
    has_score_mod: bool       # score_mod or aux_tensors given
    xai_temperature_len: int  # -1: off


def layer_reason(layer: LayerFacts, mode: str, q_len: int) -> str | None:
    """None if vattn may serve this layer in `mode` with `q_len` query tokens per sequence."""
    if mode not in MODES:
        return f"mode {mode!r} (served modes: {MODES})"
    checks = (
        (layer.head_dim not in HEAD_DIMS or layer.v_head_dim != layer.head_dim,
         f"layer head_dim {layer.head_dim}/{layer.v_head_dim}"),
        (bool(layer.logit_cap) and layer.logit_cap > 0, f"logit softcap {layer.logit_cap}"),
        (layer.sliding_window_size is not None and layer.sliding_window_size > -1,
         f"sliding window {layer.sliding_window_size}"),
        (layer.is_cross_attention, "cross attention"),
        (not layer.decoder_causal, "non-causal attention type"),
        (layer.has_sinks, "attention sinks"),
        (layer.has_score_mod, "score_mod"),
        (layer.xai_temperature_len is not None and layer.xai_temperature_len > 0, "xai temperature"),
        (not 1 <= q_len <= MAX_Q_LEN, f"q_len {q_len} (supported: 1..{MAX_Q_LEN})"),
    )
    for failed, reason in checks:
        if failed:
            return reason
    return None
