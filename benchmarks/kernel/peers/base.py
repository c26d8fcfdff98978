"""What every peer adapter shares: the Prepared handle, the not-available signal, the optional import, and
the page and slot lists that rebuild vattn's paged batch in each library's own layout."""
from __future__ import annotations

import importlib


class PeerUnavailable(Exception):
    """The peer cannot run here (not installed) or not on this shape; the message says which."""


class Prepared:
    """A peer ready to launch: run(r) computes replica r into `out` (no host sync, graph-capturable);
    plan(r), where given, redoes the per-batch planning of replica r (for the plan-inside variant)."""

    def __init__(self, run, out, kv_dtype: str, kv_bytes: int, plan=None, info: dict | None = None):
        self.run, self.out, self.kv_dtype, self.kv_bytes, self.plan = run, out, kv_dtype, kv_bytes, plan
        self.info = info or {}


def pages(shape, table):
    """Per-sequence page ids of one replica's table -> (indptr [B+1], indices [sum pages], last_page_len [B])."""
    import torch

    p, dev = shape.page_size, table.device
    counts = [-(-n // p) for n in shape.seq_lens]
    indices = torch.cat([table[b, :c] for b, c in enumerate(counts)] or [table[:0, 0]]).to(torch.int32)
    indptr = torch.tensor([0] + [sum(counts[:b + 1]) for b in range(len(counts))], dtype=torch.int32, device=dev)
    last = torch.tensor([n - (c - 1) * p if c else 0 for n, c in zip(shape.seq_lens, counts)],
                        dtype=torch.int32, device=dev)
    return indptr, indices, last


def slots(shape, table, new_tokens=None):
    """Token-pool slot ids (page * P + offset) of each sequence's positions, concatenated, and their indptr:
    sglang's kv_indices / kv_indptr on the page-P pool viewed as [slots, Hkv, D]. new_tokens: per sequence,
    the last positions to leave out (the prefix only, as sglang's extend kernels take it)."""
    import torch

    p, dev = shape.page_size, table.device
    parts, indptr = [], [0]
    for b, n in enumerate(shape.seq_lens):
        pos = torch.arange(0, n - (new_tokens[b] if new_tokens else 0), device=dev)
        parts.append((table[b, pos // p].long() * p + pos % p).to(torch.int32))
        indptr.append(indptr[-1] + parts[-1].numel())
    return torch.cat(parts), torch.tensor(indptr, dtype=torch.int32, device=dev)


def dequant(cache, descale, dtype):
    """An fp8 cache times its descale, or a 16-bit one as is, in `dtype` (a copy)."""
    return cache.to(dtype) if descale is None else (cache.float() * float(descale)).to(dtype)


def kv_bytes(shape, elem_bytes: int) -> int:
    """The bytes a cache of `elem_bytes` per element holds for the shape: what a peer reading it moves."""
    return shape.total_kv_tokens * shape.num_kv_heads * shape.head_dim * 2 * elem_bytes


def import_peer(module: str, peer: str):
    """The peer's library, or PeerUnavailable saying it is not installed."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken install (missing CUDA libs): either way not usable
        raise PeerUnavailable(f"{peer}: not installed ({module}: {type(exc).__name__}: {exc})") from exc

