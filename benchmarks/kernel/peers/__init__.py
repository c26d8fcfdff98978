"""Peer kernels for `python -m benchmarks.kernel.bench --peers ...`: the same batches, the same method, the
same records as vattn's rows.

Each peer is an adapter over a library's public API, imported only when installed (no code of theirs here):
- flashinfer / flashinfer_fa3 (flashinfer_peer.py): FlashInfer 0.7.x `BatchPrefillWithPagedKVCacheWrapper`
  (causal, q_len per request; backend fa2 / fa3) on vattn's NHD paged cache with the same k/v descales; q_len 1
  everywhere uses `BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)`;
- flashinfer_bf16: the same on a dequantised bf16 copy of the cache (twice the bytes; KERNEL.md: faster in time);
- xqa (xqa_peer.py): TensorRT-LLM's XQA generation kernel as FlashInfer 0.7.x ships it (`flashinfer.xqa.xqa`,
  q_len > 1 as speculative decoding with a causal draft mask, ragged via q_cu_seq_lens) on the same cache,
  page tables and scales; its Hopper fp8 kernel rounds Q to e4m3 (marked lossy);
- fa3 (fa3_peer.py): FlashAttention-3's `flash_attn_with_kvcache` with a page table (fp8 Q quantised per tensor
  for fp8 KV), from a FA3 build or sglang-kernel; fa4: FlashAttention-4's CuTe-DSL `flash_attn_varlen_func` (on
  sm90 on a dequantised bf16 copy: it has no fp8 there);
- sglang_triton (sglang_peer.py): sglang's Triton kernels (0.5.23, 0.5.17) on its token pool (page 1, the cache
  viewed as slots), as its Triton backend runs them on an H200: `decode_attention_fwd` for q_len 1, else
  `extend_attention_fwd` (prefix from the pool, new tokens as extend K/V); sglang_triton_splitkv: its
  `verify_splitkv_fwd`, which sglang dispatches on gfx95 only (same arguments);
- sdpa (sdpa_peer.py): torch SDPA per sequence on a gathered, dequantised copy (the gather is outside the timed
  region): a floor reference, the only peer that also runs on a CPU.
registry.py names them, run.py checks and times them, warmup.py builds FlashInfer's JIT modules (XQA's
included) ahead, table.py prints the comparison.
"""
from __future__ import annotations

from benchmarks.kernel.peers.base import PeerUnavailable, Prepared
from benchmarks.kernel.peers.warmup import prewarm
from benchmarks.kernel.peers.registry import FACTORIES, PEERS, parse_peers
from benchmarks.kernel.peers.run import LOSSY_FP8_LIMIT, bench_peers
from benchmarks.kernel.peers.sglang_peer import sglang_importable
from benchmarks.kernel.peers.table import peer_table
from benchmarks.kernel.peers.xqa_peer import xqa_importable

__all__ = ["FACTORIES", "LOSSY_FP8_LIMIT", "PEERS", "PeerUnavailable", "Prepared", "bench_peers", "parse_peers",
           "peer_table", "prewarm", "sglang_importable", "xqa_importable"]
