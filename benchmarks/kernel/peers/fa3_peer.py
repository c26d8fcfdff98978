"""The fa3 peer: FlashAttention-3's `flash_attn_with_kvcache` (or FA4's CuTe-DSL varlen call) with a page table."""
from __future__ import annotations

from benchmarks.kernel.peers.base import Prepared, PeerUnavailable, dequant, import_peer, kv_bytes


def fa3_module():
    """The first FlashAttention-3-class API installed: FA3's `flash_attn_with_kvcache` (flash_attn_interface,
    flash_attn_3, sgl_kernel) or FA4's CuTe-DSL `flash_attn.cute.flash_attn_varlen_func` (flash-attn-4)."""
    errors = []
    for name, fn in (("flash_attn_interface", "flash_attn_with_kvcache"),
                     ("flash_attn_3.flash_attn_interface", "flash_attn_with_kvcache"),
                     ("sgl_kernel.flash_attn", "flash_attn_with_kvcache"),
                     ("flash_attn.cute", "flash_attn_varlen_func")):
        try:
            mod = import_peer(name, "fa3")
        except PeerUnavailable as exc:
            errors.append(str(exc).removeprefix("fa3: not installed (").removesuffix(")"))
            continue
        if hasattr(mod, fn):
            return mod, fn
        errors.append(f"{name}: no {fn}")
    raise PeerUnavailable("fa3: not installed (" + "; ".join(errors) + ")")


def fa3(shape, b) -> Prepared:
    """FA3's flash_attn_with_kvcache with a page table (e4m3 Q per tensor on an fp8 cache), or FA4's varlen call."""
    import torch

    mod, fn = fa3_module()
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
