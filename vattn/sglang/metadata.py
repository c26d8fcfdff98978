"""Per-forward vattn inputs from sglang's own tensors: built on the GPU once, read by every layer.

sglang keeps one row of KV slot ids per request (`req_to_token[row, position] -> slot`) and the
KV pool as `[slots, Hkv, D]`. With page size P its paged allocator keeps every page whole and
aligned (`slot % P == position % P`), so the pool is `[slots / P, P, Hkv, D]` at no cost and a
request's block table is `req_to_token[row, ::P] // P`. Every function here is shape-static
torch on device tensors (no host reads), so it can be recorded into a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ForwardInputs:
    """vattn's view of one forward: the same for every layer until the next forward."""

    mode: str                 # "target_verify" | "draft_extend" | "decode"
    q_len: int                # query tokens per sequence (uniform in these modes)
    batch: int
    seq_lens: Any             # [B] int32, KV length incl. the new tokens
    cu_seqlens_q: Any         # [B+1] int32
    block_tables: Any         # [B, ceil(width / P)] int32
    plan: Any                 # vattn.Plan over seq_lens / cu_seqlens_q


def block_tables(req_to_token, req_pool_indices, page_size: int):
    """req_to_token [R, W] int32 slots, req_pool_indices [B] -> [B, ceil(W / P)] int32 page ids."""
    import torch

    firsts = req_to_token[:, ::page_size]  # a view: the slot of each page's first position
    rows = firsts.index_select(0, req_pool_indices.to(torch.long))
    return torch.div(rows, page_size, rounding_mode="floor").to(torch.int32)


def kv_lens(mode: str, seq_lens, q_len: int):
    """sglang's seq_lens -> vattn's KV length incl. the new tokens, [B] int32.

    target_verify: sglang passes the committed prefix; the q_len draft tokens sit right after it
    (their slots are req_to_token[row, seq_len : seq_len + q_len]), so L = seq_len + q_len.
    draft_extend and decode: sglang already passes the post-write length. Padded CUDA-graph rows
    carry a fill length (1) that can be shorter than q_len; lifting them to q_len keeps every row
    inside vattn's contract (their output is discarded by sglang).
    """
    import torch

    lens = seq_lens.to(torch.int32)
    if mode == "target_verify":
        lens = lens + q_len
    return torch.clamp(lens, min=q_len)


def cu_seqlens(batch: int, q_len: int, device):
    """Uniform q_len per sequence -> [B+1] int32 offsets of each sequence's rows in q."""
    import torch

    return torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=device)


def paged_view(buffer, page_size: int):
    """sglang's per-layer pool [slots, Hkv, D] -> [slots // P, P, Hkv, D] (a view, no copy)."""
    whole = (buffer.shape[0] // page_size) * page_size
    return buffer[:whole].view(whole // page_size, page_size, *buffer.shape[1:])


def build(mode: str, q_len: int, req_to_token, req_pool_indices, seq_lens, *, page_size: int,
          num_kv_heads: int, plan_mode: str, workspace) -> ForwardInputs:
    """Everything a layer needs, planned once: block tables, lengths, offsets and the vattn plan."""
    import vattn

    batch = int(req_pool_indices.shape[0])
    lens = kv_lens(mode, seq_lens[:batch], q_len).contiguous()
    cu = cu_seqlens(batch, q_len, lens.device)
    tables = block_tables(req_to_token, req_pool_indices, page_size)
    plan = vattn.plan(lens, cu, num_kv_heads=num_kv_heads, page_size=page_size, mode=plan_mode,
                      workspace=workspace)
    return ForwardInputs(mode, q_len, batch, lens, cu, tables, plan)
