"""The fa3 and fa4 peers: FlashAttention-3's `flash_attn_with_kvcache` and FA4's CuTe-DSL varlen call, each with a
page table."""
from __future__ import annotations

from benchmarks.kernel.peers.base import Prepared, PeerUnavailable, dequant, import_peer, kv_bytes

# where each peer's API may live, tried in this order. FA3 comes as a build of the hopper/ tree
# (flash_attn_interface, flash_attn_3) or inside sglang-kernel, sglang's production backend on an H200
# (sgl_kernel). Records of runs before 2026-12-02 name FA4 `fa3` (it was the first of one list).
APIS = {
    "fa3": (("flash_attn_interface", "flash_attn_with_kvcache"),
            ("flash_attn_3.flash_attn_interface", "flash_attn_with_kvcache"),
            ("sgl_kernel.flash_attn", "flash_attn_with_kvcache")),
    "fa4": (("flash_attn.cute", "flash_attn_varlen_func"),),
}


def fa_module(peer: str):
    """(module, function name) of the first of the peer's APIs that is installed."""
    errors = []
    for name, fn in APIS[peer]:
        try:
            mod = import_peer(name, peer)
        except PeerUnavailable as exc:
            errors.append(str(exc).removeprefix(f"{peer}: not installed (").removesuffix(")"))
            continue
        if hasattr(mod, fn):
            return mod, fn
        errors.append(f"{name}: no {fn}")
    raise PeerUnavailable(f"{peer}: not installed (" + "; ".join(errors) + ")")


def flash_attention(shape, b, peer: str) -> Prepared:
    """peer fa3: FA3's flash_attn_with_kvcache with a page table (e4m3 Q per tensor on an fp8 cache); fa4: FA4's
    varlen call."""
    import torch

    mod, fn = fa_module(peer)
    q, k, v, extra, kv_dtype = b.q, b.k, b.v, {}, shape.kv_dtype
    if fn == "flash_attn_varlen_func":
        # FA4 on sm90 asserts fp8 is SM100-only: it reads a dequantised bf16 copy, made once like flashinfer_bf16
        if kv_dtype == "fp8" and torch.cuda.get_device_capability(b.q.device)[0] < 10:
            k, v, kv_dtype = dequant(k, b.k_descale, torch.bfloat16), dequant(v, b.v_descale, torch.bfloat16), "bf16"

        def call(r):
            return mod.flash_attn_varlen_func(
                q, k, v, cu_seqlens_q=b.cu, max_seqlen_q=max(shape.q_lens), seqused_k=b.seq_lens,
                page_table=b.tables[r], softmax_scale=b.scale, causal=True)[0]
    else:
        if kv_dtype == "fp8":  # FA3's fp8 path wants Q in e4m3 too: per-tensor scale, as engines quantise it
            q_scale = (b.q.float().abs().amax() / 448.0).clamp_min(1e-12)
            q = (b.q.float() / q_scale).to(torch.float8_e4m3fn)
            per = lambda s: s.float().reshape(1, 1).expand(shape.batch, shape.num_kv_heads).contiguous()
            extra = dict(q_descale=per(q_scale), k_descale=per(b.k_descale), v_descale=per(b.v_descale))

        def call(r):
            return mod.flash_attn_with_kvcache(
                q, k, v, cache_seqlens=b.seq_lens, page_table=b.tables[r], cu_seqlens_q=b.cu,
                max_seqlen_q=max(shape.q_lens), causal=True, softmax_scale=b.scale, **extra)

    call(0)  # first call compiles (FA4: CuTe DSL JIT) outside the timed region
    out = torch.empty_like(b.q)

    def run_into(r):
        out.copy_(call(r).reshape(out.shape))

    # FA3's fp8 path rounds Q to e4m3 (one scale per tensor): timed, and marked lossy, as XQA's fp8 kernel
    return Prepared(run_into, out, kv_dtype, kv_bytes(shape, k.element_size()),
                    info=dict(api=f"{mod.__name__}.{fn}", lossy=bool(extra)))
