"""The xqa peer: TensorRT-LLM's XQA generation kernel as FlashInfer 0.7.x ships it (`flashinfer.xqa.xqa`,
JIT-built per configuration at first use), on vattn's NHD paged cache.

What FlashInfer 0.7.2 expects, read from its wheel (built from commit d84335d8: flashinfer/xqa.py,
flashinfer/jit/xqa.py, data/csrc/xqa/) and from flashinfer-ai/flashinfer at fb28d724, whose copies of those files
are identical and whose tests/attention/test_xqa_batch_decode.py builds the draft masks and seq lens:
- q: [B, 1, Hq, D] for q_len 1; [B, 1, n, Hq, D] for a uniform n > 1; packed [T, Hq, D] with q_cu_seq_lens
  [B+1] int32 (ragged, n the batch's max, which must be > 1); output: the same shape and Q's dtype;
  query head h reads KV head h // G, as vattn's;
- k_cache, v_cache: [num_pages, page_size, Hkv, D] (kv_layout "NHD"), page_size 16/32/64/128, bf16/fp16
  equal to Q's dtype, or e4m3 (then one kv_scale for K and V);
- page_table [B, max_pages] int32 (max_seq_len = max_pages x page_size), seq_lens [B, 1] uint32 counting the
  new tokens (the draft tokens are the last n positions);
- q_len > 1 needs a draft-block mask: uint16 [B, n, W] (uniform) or [T, W] (ragged), W = 2 x ceil(n / 32);
  bit j of row i (little-endian 32-bit words) lets draft token i see draft token j; the prefix is always
  visible;
- the logits scale is q_scale x kv_scale / sqrt(D), the output scale kv_scale (kv_scale only for fp8);
- workspace_buffer (uint8 scratch for split-KV partials) and semaphores (uint32, zero before first use; the
  last CTA of a split wraps its counter back to 0, so one zeroed buffer serves every call).
On sm90 with an e4m3 cache, q_len 1 and uniform q_len x G > 32 run the Hopper kernel (mha_sm90.cu), whose
matrix element is the cache's e4m3: Q is rounded to e4m3 (and P before P.V). Ragged Q and q_len x G <= 32
run the generic kernel (mha.cu), which widens the cache to Q's dtype.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from benchmarks.kernel.peers.base import Prepared, PeerUnavailable, import_peer, kv_bytes

XQA_PAGE_SIZES = (16, 32, 64, 128)
XQA_SMS = (9, 10, 12)  # compute capability majors with an XQA kernel
XQA_SCRATCH_BYTES = 256 << 20  # as FlashInfer's own XQA test allocates
XQA_SEMAPHORES = 2 << 20  # uint32 counters: the 8 MB xqa_batch_decode_with_kv_cache reserves
SWAP_AB_ROWS = 32  # q_len x G up to this: the generic kernel (FlashInfer's swap_ab_eligible)


@dataclass(frozen=True)
class XqaCall:
    """One replica's arguments of flashinfer.xqa.xqa, all views of or small tensors beside vattn's batch."""

    q: object  # [B, 1, Hq, D] (q_len 1), [B, 1, n, Hq, D] (uniform n) or [T, Hq, D] (ragged): a view of vattn's q
    out: object  # the same view of the output [T, Hq, D]
    page_table: object  # [B, max_pages] int32: vattn's block table as is
    seq_lens: object  # [B, 1] uint32: KV length incl. the new tokens
    q_seq_len: int  # 1, the uniform q_len, or the ragged maximum
    q_cu_seq_lens: object  # [B+1] int32 (ragged only) or None
    mask: object  # uint16 [B, n, W] (uniform n > 1), [T, W] (ragged) or None (q_len 1)
    q_scale: float
    kv_scale: float


def ragged(shape) -> bool:
    return len(set(shape.q_lens)) > 1


def unsupported(shape, sm_major: int | None = None, q_dtype: str = "bf16") -> str | None:
    """Why FlashInfer 0.7.2's xqa cannot run this shape (None: it can). sm_major: the device's (None: any)."""
    n, d, g = max(shape.q_lens), shape.head_dim, shape.gqa
    if sm_major is not None and sm_major not in XQA_SMS:
        return f"sm{sm_major}x: XQA runs on sm90, sm100 and sm12x only"
    if shape.page_size not in XQA_PAGE_SIZES:
        return f"page_size {shape.page_size}: XQA takes {', '.join(map(str, XQA_PAGE_SIZES))}"
    if d % 16 or not 16 <= d <= 512:
        return f"head_dim {d}: XQA takes multiples of 16 in [16, 512]"
    if d > 256 and (n > 1 or g > 16):
        return f"head_dim {d} > 256: XQA takes q_len 1 and G <= 16 only"
    if shape.num_q_heads % shape.num_kv_heads:
        return f"Hq {shape.num_q_heads} is not a multiple of Hkv {shape.num_kv_heads}"
    if shape.kv_dtype != "fp8" and shape.kv_dtype != q_dtype:
        return f"kv_dtype {shape.kv_dtype} with {q_dtype} Q: XQA takes a 16-bit cache of Q's dtype, or e4m3"
    if n == 0:
        return "no query tokens (every q_len is 0)"
    if ragged(shape) and n == 1:
        return f"ragged q_lens {sorted(set(shape.q_lens))}: XQA's ragged path needs a maximum q_len > 1"
    short = [b for b, (q, L) in enumerate(zip(shape.q_lens, shape.seq_lens)) if L < q]
    if short:
        b = short[0]
        return (f"seq_lens[{b}] = {shape.seq_lens[b]} < q_len {shape.q_lens[b]}: XQA's draft tokens are the last "
                "q_len positions of the KV")
    return None


def rounds_q_to_e4m3(shape, sm_major: int) -> bool:
    """Whether xqa picks its Hopper fp8 kernel (Q rounded to e4m3): flashinfer.xqa.xqa's dispatch rule."""
    if shape.kv_dtype != "fp8" or sm_major != 9 or shape.head_dim > 256:
        return False
    n = max(shape.q_lens)
    return not ragged(shape) and (n == 1 or n * shape.gqa > SWAP_AB_ROWS)


def module_key(shape) -> tuple:
    """What selects a distinct JIT module (Q is bf16 on the GPU, output Q's dtype, no sliding window): ragged Q
    shares the uniform module of its maximum q_len unless q_len x G <= 32 (then SWAP_AB is compiled out)."""
    n = max(shape.q_lens)
    return (shape.kv_dtype, shape.page_size, shape.head_dim, shape.gqa, n,
            ragged(shape) and n * shape.gqa <= SWAP_AB_ROWS)


def draft_mask(q_lens, width_of: int, device=None):
    """Causal draft-block mask, uint16: one row per query token of each sequence (rows of all sequences
    concatenated), bit j of row i set for j <= i; each row holds ceil(width_of / 32) little-endian 32-bit words.
    vattn's causal rule (token i sees KV up to L - n + i) is exactly this on the last n positions."""
    import torch

    words = -(-width_of // 32)
    rows = []
    for n in q_lens:
        i = torch.arange(n, device=device).view(n, 1)
        j = torch.arange(32 * words, device=device).view(1, -1)
        rows.append(j <= i)
    bits = torch.cat(rows) if rows else torch.zeros(0, 32 * words, dtype=torch.bool, device=device)
    weights = (1 << torch.arange(16, device=device, dtype=torch.int32)).view(1, 1, 16)
    halves = (bits.view(-1, 2 * words, 16).to(torch.int32) * weights).sum(-1)  # [rows, W], each < 2^16
    return halves.to(torch.uint16)


def xqa_call(shape, q, out, table, seq_lens, cu, softmax_scale: float, k_descale: float | None,
             v_descale: float | None) -> XqaCall:
    """vattn's batch as xqa's arguments (no copy of q, out, the cache or the table).

    q, out: [T, Hq, D]; table: [B, max_pages] int32; seq_lens: [B] int32; cu: [B+1] int32 (cu_seqlens_q);
    descales: floats, or None for a 16-bit cache. XQA takes one kv_scale for K and V: K's own factor moves
    into q_scale, which (like kv_scale) scales the logits only, never Q itself."""
    import torch

    why = unsupported(shape, q_dtype=_dtype_name(q.dtype))
    if why:
        raise ValueError(f"shape {shape.name}: {why}")
    b, hq, d = shape.batch, shape.num_q_heads, shape.head_dim
    n = max(shape.q_lens)
    kd = 1.0 if k_descale is None else float(k_descale)
    vd = 1.0 if v_descale is None else float(v_descale)
    q_scale = float(softmax_scale) * math.sqrt(d) * kd / vd
    lens = seq_lens.to(torch.int32).contiguous().view(torch.uint32).reshape(b, 1)  # same bits: lengths >= 0
    if ragged(shape):
        mask = draft_mask(shape.q_lens, n, q.device)  # [T, W]
        return XqaCall(q, out, table, lens, n, cu.to(torch.int32).contiguous(), mask, q_scale, vd)
    shaped = (lambda x: x.view(b, 1, hq, d)) if n == 1 else (lambda x: x.view(b, 1, n, hq, d))
    mask = None if n == 1 else draft_mask(shape.q_lens, n, q.device).view(b, n, -1)
    return XqaCall(shaped(q), shaped(out), table, lens, n, None, mask, q_scale, vd)


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.").replace("bfloat16", "bf16").replace("float16", "fp16")


def flashinfer_version(fi) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", str(getattr(fi, "__version__", "")))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def xqa_module():
    """flashinfer.xqa's module (the package rebinds the attribute `flashinfer.xqa` to the function), or
    PeerUnavailable saying what is missing."""
    fi = import_peer("flashinfer", "xqa")
    if flashinfer_version(fi) < (0, 7):
        raise PeerUnavailable(f"xqa: not installed (flashinfer {getattr(fi, '__version__', '?')}; needs >= 0.7)")
    mod = import_peer("flashinfer.xqa", "xqa")
    if not hasattr(mod, "xqa"):
        raise PeerUnavailable("xqa: not installed (flashinfer.xqa has no xqa)")
    return fi, mod


def xqa_importable() -> str | None:
    """None when FlashInfer >= 0.7 with its xqa imports here, else why not (one line)."""
    try:
        xqa_module()
    except PeerUnavailable as exc:
        return str(exc).splitlines()[0]
    return None


def xqa(shape, b) -> Prepared:
    """flashinfer.xqa.xqa on vattn's NHD cache and page tables, arguments built once per replica."""
    fi, mod = xqa_module()
    import torch

    if b.q.device.type != "cuda":
        raise PeerUnavailable("xqa: needs a CUDA device")
    major = torch.cuda.get_device_capability(b.q.device)[0]
    why = unsupported(shape, major, _dtype_name(b.q.dtype))
    if why:
        raise PeerUnavailable(f"xqa: unsupported: {why}")
    out = torch.empty_like(b.q)
    kd = None if b.k_descale is None else float(b.k_descale)  # host syncs, here, once
    vd = None if b.v_descale is None else float(b.v_descale)
    first = xqa_call(shape, b.q, out, b.tables[0], b.seq_lens, b.cu, b.scale, kd, vd)
    calls = [replace(first, page_table=t) for t in b.tables]
    scratch = torch.empty(XQA_SCRATCH_BYTES, dtype=torch.uint8, device=b.q.device)
    semaphores = torch.zeros(XQA_SEMAPHORES, dtype=torch.uint32, device=b.q.device)
    sms = torch.cuda.get_device_properties(b.q.device).multi_processor_count
    pdl = major >= 9  # xqa's own default (device_support_pdl), stated rather than looked up per call

    def run(r):
        c = calls[r]
        mod.xqa(c.q, b.k, b.v, c.page_table, c.seq_lens, c.out, scratch, semaphores, shape.num_kv_heads,
                shape.page_size, q_scale=c.q_scale, kv_scale=c.kv_scale, kv_layout="NHD", sm_count=sms,
                enable_pdl=pdl, q_seq_len=c.q_seq_len, mask=c.mask, q_cu_seq_lens=c.q_cu_seq_lens)

    hopper = rounds_q_to_e4m3(shape, major)
    kernel = "Hopper fp8 kernel (mha_sm90)" if hopper else "generic kernel (mha.cu)"
    info = dict(api=f"flashinfer {getattr(fi, '__version__', '?')} xqa, {kernel}", pdl=pdl)
    if hopper:
        info["lossy"] = "e4m3 Q and P (its Hopper fp8 kernel's matrix element is the cache's e4m3)"
    return Prepared(run, out, shape.kv_dtype, kv_bytes(shape, b.k.element_size()), info=info)
