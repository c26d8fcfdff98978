"""The few places where sglang 0.5.17 and 0.5.23 differ for this plugin, each named once.

Both versions share the attention-backend protocol (init_forward_metadata, the out_graph /
in_graph pair, init_cuda_graph_state, forward -> forward_extend / forward_decode) and the
runtime context (get_spec, get_parallel). They differ in:
- the KV write target: 0.5.23 marks ids physical (`KVWriteLoc.for_batch`, refused otherwise by a
  unified pool); 0.5.17's pools take the bare `out_cache_loc`;
- the unified (translated) KV-id pool: `runner.kv_index_translator.is_translating` in 0.5.23,
  a translating allocator (`translate_kv_loc`) in 0.5.17;
- EAGLE's draft backend factory: 0.5.23's map entries return (stamp, backend) and
  `_create_backend` takes `stamps_children`; 0.5.17's return the backend;
- sglang's default-backend rule (see vattn.sglang.base.default_base).
Importing this module imports sglang.
"""
from __future__ import annotations

from importlib.metadata import version

SGLANG_VERSION = version("sglang")
SUPPORTED = ("0.5.17", "0.5.23")


def write_loc(forward_batch):
    """Where this batch's new K/V go, in the form the installed pool's set_kv_buffer takes."""
    from sglang.srt.mem_cache import memory_pool

    for_batch = getattr(getattr(memory_pool, "KVWriteLoc", None), "for_batch", None)
    if for_batch is not None:  # 0.5.23
        return for_batch(forward_batch)
    return forward_batch.out_cache_loc  # 0.5.17: a bare loc (its pools unwrap either)


def translated_kv_ids(runner) -> bool:
    """True when req_to_token holds virtual ids that a unified pool translates (vattn reads
    req_to_token as physical page ids, so such a server stays on the base)."""
    translator = getattr(runner, "kv_index_translator", None)
    if translator is not None:
        return bool(getattr(translator, "is_translating", False))
    allocator = getattr(runner, "token_to_kv_pool_allocator", None)
    return any(getattr(allocator, name, None) is not None
               for name in ("translate_kv_loc", "translate_kv_loc_dense"))


def parallel() -> dict:
    """Attention TP size/rank and decode-context-parallel size of this process."""
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    out = {}
    for name, fallback in (("attn_tp_size", 1), ("attn_tp_rank", 0), ("attn_dcp_size", 1)):
        try:
            out[name] = int(getattr(p, name))
        except Exception:  # 0.5.17 reads some lazily from torch.distributed, absent in tests
            out[name] = fallback
    return out


def spec() -> dict:
    """EAGLE topk and draft-token window (0 without speculative decoding)."""
    from sglang.srt.runtime_context import get_spec

    s = get_spec()
    return {"topk": int(getattr(s, "speculative_eagle_topk", 0) or 0),
            "draft_tokens": int(getattr(s, "speculative_num_draft_tokens", 0) or 0)}


def verify_q_len(runner) -> int:
    """Draft tokens per request in target verify: the runner's own figure where it has one."""
    per_req = getattr(runner, "decode_num_tokens_per_req", None)
    if callable(per_req):
        n = int(per_req() or 0)
        return n if n > 1 else 0  # 1 means plain decode (no verify)
    return spec()["draft_tokens"]


def wrap_draft_entry(made, wrap):
    """Apply `wrap` to the backend a draft-factory map entry made, in either version's shape."""
    if isinstance(made, tuple):  # 0.5.23: (stamp, backend)
        stamp, backend = made
        return stamp, (wrap(backend) if backend is not None else None)
    return wrap(made) if made is not None else None
