"""sglang's Triton attention kernels as peers (sglang_triton, sglang_triton_splitkv), on its token pool: 0.5.23's
and 0.5.17's have the same modules and calls."""
from __future__ import annotations

import importlib

from benchmarks.kernel.peers.base import Prepared, PeerUnavailable, dequant, import_peer, slots

# decode (q_len 1), the extend kernel sglang's Triton backend runs target-verify with on NVIDIA, and the split-KV
# verify kernel it runs only on gfx95 (TritonAttnBackend.use_verify_splitkv needs is_gfx95_supported())
SGLANG_KERNELS = ("sglang.kernels.ops.attention.decode_attention", "sglang.kernels.ops.attention.extend_attention",
                  "sglang.kernels.ops.attention.verify_splitkv")


def sglang_importable() -> str | None:
    """None when sglang's Triton attention kernels import here, else why not (one line)."""
    for module in SGLANG_KERNELS:
        try:
            importlib.import_module(module)
        except Exception as exc:  # ImportError, or a broken install: either way no baseline
            return f"{module}: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


def sglang(shape, b, split_kv: bool) -> Prepared:
    """sglang_triton: what sglang's Triton backend runs on an H200 (decode_attention_fwd for q_len 1, else
    extend_attention_fwd: new tokens as extend K/V, the prefix from the pool); sglang_triton_splitkv: its
    split-KV verify kernel, which sglang dispatches on gfx95 only, run here for comparison."""
    import torch

    name = "sglang_triton_splitkv" if split_kv else "sglang_triton"
    if b.q.device.type != "cuda":
        raise PeerUnavailable(f"{name}: needs a CUDA device (Triton kernels)")
    hkv, d = shape.num_kv_heads, shape.head_dim
    k_pool, v_pool = b.k.view(-1, hkv, d), b.v.view(-1, hkv, d)  # page-P NHD pool = token pool, free
    if k_pool.numel() >= 2**31:  # seen on bs20-agentic: an illegal address that takes the CUDA context down
        raise PeerUnavailable(f"{name}: its kernels index the token pool with int32 offsets; this bench's "
                              f"pool ({len(b.tables)} replicas) has {k_pool.numel()} elements >= 2^31")
    info = {}
    if shape.kv_dtype == "fp8":
        info["lossy"] = "Q and P cast to the cache's e4m3 (its kernels' design)"
    ks = 1.0 if b.k_descale is None else float(b.k_descale)
    vs = 1.0 if b.v_descale is None else float(b.v_descale)
    out = torch.empty_like(b.q)
    if all(n == 1 for n in shape.q_lens):
        if split_kv:
            raise PeerUnavailable(f"{name}: q_len 1 is decode, which sglang runs with decode_attention_fwd "
                                  "(sglang_triton)")
        dec = import_peer(SGLANG_KERNELS[0], name)
        splits = 16  # every sequence split 16 ways (sglang's backend picks <= its max per sequence)
        lists = [slots(shape, t) for t in b.tables]
        logits = torch.empty(shape.batch, shape.num_q_heads, splits, d, dtype=torch.float32, device=b.q.device)
        lse = torch.empty(shape.batch, shape.num_q_heads, splits, dtype=torch.float32, device=b.q.device)
        nsplit = torch.full((shape.batch,), splits, dtype=torch.int32, device=b.q.device)

        def run(r):
            idx, indptr = lists[r]
            dec.decode_attention_fwd(b.q, k_pool, v_pool, out, indptr, idx, logits, lse, nsplit, splits, b.scale,
                                     ks, vs)

        return Prepared(run, out, shape.kv_dtype, shape.kv_bytes, info=dict(info, api="sglang decode_attention_fwd"))
    if split_kv and len(set(shape.q_lens)) != 1:
        raise PeerUnavailable(f"{name}: verify_splitkv_fwd takes one q_len per batch")
    module = import_peer(SGLANG_KERNELS[2 if split_kv else 1], name)
    kernel = module.verify_splitkv_fwd if split_kv else module.extend_attention_fwd
    # the new tokens' K/V enter as extend tensors (dequantised, as the engine holds them before the cache write)
    news = list(shape.q_lens)
    ext = []
    for t in b.tables:
        idx, _ = slots(shape, t)
        keep = torch.cat([torch.arange(e - n, e, device=b.q.device) for e, n in zip(seq_ends(shape), news)])
        ext.append((dequant(k_pool[idx[keep].long()], b.k_descale, b.q.dtype),
                    dequant(v_pool[idx[keep].long()], b.v_descale, b.q.dtype), slots(shape, t, new_tokens=news)))

    def run(r):
        ke, ve, (idx, indptr) = ext[r]
        # the same positional arguments for both (verify_splitkv_fwd mirrors extend_attention_fwd's)
        ran = kernel(b.q, ke, ve, out, k_pool, v_pool, b.cu, indptr, idx, None, True, None, max(news), ks, vs,
                     sm_scale=b.scale)
        if ran is False:
            raise PeerUnavailable(f"{name}: verify_splitkv_fwd declined this shape (can_handle False)")

    api = "sglang verify_splitkv_fwd" if split_kv else "sglang extend_attention_fwd"
    return Prepared(run, out, shape.kv_dtype, shape.kv_bytes, info=dict(info, api=api))


def seq_ends(shape):
    """End offset of each sequence in the concatenated full-length slot list."""
    ends, acc = [], 0
    for n in shape.seq_lens:
        acc += n
        ends.append(acc)
    return ends

