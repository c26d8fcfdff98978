"""The sdpa peer: torch SDPA on a gathered copy, a floor reference and the only peer that runs on a CPU."""
from __future__ import annotations

from benchmarks.kernel.harness import L2_BYTES
from benchmarks.kernel.peers.base import Prepared, dequant, kv_bytes, slots


def sdpa(shape, b) -> Prepared:
    """torch SDPA per sequence on a gathered, dequantised copy of the cache (gathered before timing)."""
    import torch
    import torch.nn.functional as F

    dtype = b.q.dtype if b.q.device.type == "cuda" else torch.float32  # CPU SDPA: fp32
    q = b.q.to(dtype)
    copies = []  # one gathered copy per replica that cold L2 needs (a copy >= 4 x L2 needs only one)
    for r, t in enumerate(b.tables[:copies_needed(shape, b, torch.tensor([], dtype=dtype).element_size())]):
        idx, indptr = slots(shape, t)
        k = dequant(b.k.view(-1, shape.num_kv_heads, shape.head_dim)[idx.long()], b.k_descale, dtype)
        v = dequant(b.v.view(-1, shape.num_kv_heads, shape.head_dim)[idx.long()], b.v_descale, dtype)
        copies.append((k, v, indptr.tolist()))
    cu = b.cu.tolist()
    masks = []
    for n, L in zip(shape.q_lens, shape.seq_lens):  # token j sees KV 0 .. L-n+j (bottom-right causal)
        j = torch.arange(n, device=b.q.device).view(n, 1)
        masks.append(torch.arange(L, device=b.q.device).view(1, L) <= L - n + j)
    out = torch.zeros_like(b.q)

    def run(r):
        k, v, ip = copies[r % len(copies)]
        for s, (n, L) in enumerate(zip(shape.q_lens, shape.seq_lens)):
            if n == 0 or L == 0:
                continue
            qs = q[cu[s]:cu[s + 1]].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
            ks = k[ip[s]:ip[s + 1]].transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
            vs = v[ip[s]:ip[s + 1]].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=masks[s], scale=b.scale, enable_gqa=True)
            out[cu[s]:cu[s + 1]] = o[0].transpose(0, 1).to(out.dtype)

    elem = torch.tensor([], dtype=dtype).element_size()
    return Prepared(run, out, {2: "bf16", 4: "fp32"}.get(elem, str(dtype)), kv_bytes(shape, elem),
                    info=dict(api="torch SDPA on a gathered dequantised copy", gathered_copies=len(copies)))


def copies_needed(shape, b, elem_bytes: int) -> int:
    one = max(1, kv_bytes(shape, elem_bytes))
    return max(1, min(len(b.tables), -(-int(4 * L2_BYTES) // one)))

