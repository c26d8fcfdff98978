"""The fp32 torch oracle for vattn.attention: written to be read, not to be fast.

Per sequence b: gather its L pages from the paged cache, dequantise (x * descale), and attend query
token j (of n) to KV positions 0 .. L-n+j (causal over the last n positions, which hold the new
tokens), with the G = Hq / Hkv query heads of a group sharing one KV head.
"""
from __future__ import annotations


def _check(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q) -> None:
    if q.dim() != 3:
        raise ValueError(f"q: got shape {tuple(q.shape)}; expected [T, Hq, D]")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache/v_cache: got shapes {tuple(k_cache.shape)} and {tuple(v_cache.shape)}; "
                         "expected equal [num_pages, page_size, Hkv, D] (NHD)")
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if q.shape[2] != head_dim or q.shape[1] % num_kv_heads:
        raise ValueError(f"q: got shape {tuple(q.shape)}; expected [T, Hq, {head_dim}] with Hq a multiple of "
                         f"Hkv={num_kv_heads}")
    batch = seq_lens.shape[0]
    if seq_lens.dim() != 1 or cu_seqlens_q.shape != (batch + 1,):
        raise ValueError(f"cu_seqlens_q: got shape {tuple(cu_seqlens_q.shape)} for seq_lens of shape "
                         f"{tuple(seq_lens.shape)}; expected [B+1] and [B]")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch:
        raise ValueError(f"block_tables: got shape {tuple(block_tables.shape)}; expected [B={batch}, max_pages]")
    if int(cu_seqlens_q[-1]) != q.shape[0]:
        raise ValueError(f"cu_seqlens_q[-1]: got {int(cu_seqlens_q[-1])}; expected T={q.shape[0]} (rows of q)")


def _gather(cache, pages, seq_len: int, descale: float):
    """[num_pages, P, Hkv, D] -> this sequence's [L, Hkv, D] in fp32, dequantised."""
    page_size = cache.shape[1]
    used = pages[: -(-seq_len // page_size)].long().to(cache.device)
    return cache[used].float().reshape(-1, *cache.shape[2:])[:seq_len] * descale


def _attend(q, k, v, softmax_scale: float):
    """q [n, Hq, D], k/v [L, Hkv, D] (fp32) -> [n, Hq, D]; causal over the last n positions."""
    import torch

    n, num_q_heads, _ = q.shape
    seq_len, num_kv_heads, _ = k.shape
    group = num_q_heads // num_kv_heads
    k = k.repeat_interleave(group, dim=1)  # query head h reads KV head h // G
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q, k) * softmax_scale
    last = seq_len - n + torch.arange(n, device=q.device).view(n, 1)  # last visible KV position of token j
    visible = torch.arange(seq_len, device=q.device).view(1, seq_len) <= last  # [n, L]
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.where(visible.any(dim=-1).view(1, n, 1), probs, 0.0)  # a fully masked token reads nothing
    return torch.einsum("hnl,lhd->nhd", probs, v)


def reference(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale=None, v_descale=None,
              softmax_scale: float | None = None, *, plan=None, out=None, debug: bool = False):
    """Paged few-query attention in fp32, called as vattn.attention is: reference(**attention_kwargs).

    q: [T, Hq, D]; k_cache, v_cache: [num_pages, page_size, Hkv, D] (NHD; fp8 e4m3, bf16, fp16 or fp32);
    block_tables: [B, max_pages] int; seq_lens: [B] (KV length incl. the new tokens); cu_seqlens_q: [B+1];
    k_descale, v_descale: per-tensor scales (one-element tensors, floats, or None for 1.0); softmax_scale:
    default 1/sqrt(D), as attention()'s. plan and debug: accepted and ignored (the oracle plans nothing and
    always checks). out: optional [T, Hq, D]; the result is copied into it (in its dtype) and it is returned.
    Returns out, else a new [T, Hq, D] fp32 tensor on q's device; tokens of a sequence with L = 0 are zeros.
    """
    import math

    import torch

    _check(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[2])
    if out is not None and tuple(out.shape) != tuple(q.shape):
        raise ValueError(f"out: got shape {tuple(out.shape)}; expected q's {tuple(q.shape)}")
    k_scale = 1.0 if k_descale is None else float(k_descale)
    v_scale = 1.0 if v_descale is None else float(v_descale)
    result = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    seq_lens, cu = seq_lens.cpu().tolist(), cu_seqlens_q.cpu().tolist()
    tables = block_tables.cpu()
    for b, seq_len in enumerate(seq_lens):
        first, last = cu[b], cu[b + 1]
        if last == first or seq_len == 0:
            continue
        if -(-seq_len // k_cache.shape[1]) > tables.shape[1]:
            raise ValueError(f"seq_lens[{b}]: got {seq_len}; needs more pages than block_tables holds "
                             f"({tables.shape[1]} x page_size {k_cache.shape[1]})")
        k = _gather(k_cache, tables[b], seq_len, k_scale).to(q.device)
        v = _gather(v_cache, tables[b], seq_len, v_scale).to(q.device)
        result[first:last] = _attend(q[first:last].float(), k, v, softmax_scale)
    if out is None:
        return result
    out.copy_(result)
    return out
