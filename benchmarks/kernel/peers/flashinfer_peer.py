"""FlashInfer 0.7.x peers (flashinfer, flashinfer_bf16, flashinfer_fa3) on vattn's NHD paged cache."""
from __future__ import annotations

from benchmarks.kernel.peers.base import Prepared, PeerUnavailable, dequant, import_peer, kv_bytes, pages

FLASHINFER_WORKSPACE_BYTES = 256 << 20


def flashinfer(shape, b, backend: str, bf16: bool, name: str) -> Prepared:
    """FlashInfer's paged prefill wrapper (backend fa2 / fa3; decode wrapper with tensor cores for q_len 1) on
    vattn's NHD cache, or on a dequantised bf16 copy of it (bf16), planned once per replica before timing."""
    fi = import_peer("flashinfer", name)
    import torch

    if b.q.device.type != "cuda":
        raise PeerUnavailable(f"{name}: needs a CUDA device")
    k, v, ks, vs = b.k, b.v, b.k_descale, b.v_descale
    if bf16:  # the dequantised copy is made once, like a bf16 cache an engine would hold
        k, v, ks, vs = dequant(k, ks, torch.bfloat16), dequant(v, vs, torch.bfloat16), None, None
    kscale = None if ks is None else float(ks)
    vscale = None if vs is None else float(vs)
    ws = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=b.q.device)
    decode = all(n == 1 for n in shape.q_lens)
    if decode and backend != "fa2":
        raise PeerUnavailable(f"{name}: q_len 1 runs FlashInfer's decode wrapper, which has no {backend} backend")
    q, q_scale = b.q, None
    if backend == "fa3" and k.dtype == torch.float8_e4m3fn:
        # its sm90 kernel has no bf16 x e4m3 matrix op (nvcc: "No eligible GMMA operator"): an fp8 cache
        # needs e4m3 Q too, quantised per tensor once here, as an engine quantises Q before the call
        q_scale = float(b.q.abs().amax().float().clamp_min(1e-12)) / 448.0
        q = (b.q.float() / q_scale).to(torch.float8_e4m3fn)
    qo = b.cu.to(torch.int32)
    lists = [pages(shape, t) for t in b.tables]
    wrappers = []
    for _ in b.tables:
        if decode:
            wrappers.append(fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True))
        else:
            wrappers.append(fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend))

    def plan(r):
        indptr, indices, last = lists[r]
        common = dict(q_data_type=q.dtype, kv_data_type=k.dtype, sm_scale=b.scale)
        if q.dtype != b.q.dtype:
            common["o_data_type"] = b.q.dtype
        if decode:
            wrappers[r].plan(indptr, indices, last, shape.num_q_heads, shape.num_kv_heads, shape.head_dim,
                             shape.page_size, **common)
        else:
            wrappers[r].plan(qo, indptr, indices, last, shape.num_q_heads, shape.num_kv_heads, shape.head_dim,
                             shape.page_size, causal=True, **common)

    out = torch.empty_like(b.q)

    def run(r):
        wrappers[r].run(q, (k, v), q_scale=q_scale, k_scale=kscale, v_scale=vscale, out=out)

    for r in range(len(b.tables)):
        plan(r)
    wrapper = "BatchDecodeWithPagedKVCacheWrapper(tensor cores)" if decode else \
        f"BatchPrefillWithPagedKVCacheWrapper({backend})"
    info = dict(api=f"flashinfer {getattr(fi, '__version__', '?')} {wrapper}")
    if q_scale is not None:
        info["lossy"] = "e4m3 Q, one scale per tensor (its sm90 kernel takes Q and KV of one dtype)"
    return Prepared(run, out, "bf16" if bf16 else shape.kv_dtype, kv_bytes(shape, k.element_size()), plan, info)
