"""The peers by name: what `--peers` accepts and the adapter that prepares each on a batch."""
from __future__ import annotations

from benchmarks.kernel.peers.fa3_peer import flash_attention
from benchmarks.kernel.peers.flashinfer_peer import flashinfer
from benchmarks.kernel.peers.sdpa_peer import sdpa
from benchmarks.kernel.peers.sglang_peer import sglang
from benchmarks.kernel.peers.xqa_peer import xqa

# name -> (shape, batch) -> Prepared
FACTORIES = {
    "flashinfer": lambda s, b: flashinfer(s, b, "fa2", False, "flashinfer"),
    "flashinfer_bf16": lambda s, b: flashinfer(s, b, "fa2", True, "flashinfer_bf16"),
    "flashinfer_fa3": lambda s, b: flashinfer(s, b, "fa3", False, "flashinfer_fa3"),
    "xqa": xqa,
    "fa3": lambda s, b: flash_attention(s, b, "fa3"),
    "fa4": lambda s, b: flash_attention(s, b, "fa4"),
    "sglang_triton": lambda s, b: sglang(s, b, split_kv=False),
    "sglang_triton_splitkv": lambda s, b: sglang(s, b, split_kv=True),
    "sdpa": sdpa,
}
PEERS = tuple(FACTORIES)


def parse_peers(text: str) -> list[str]:
    """`--peers`' comma-separated names, checked against PEERS."""
    names = [p.strip() for p in (text or "").split(",") if p.strip()]
    for p in names:
        if p not in PEERS:
            raise ValueError(f"--peers: got {p!r}; allowed: {', '.join(PEERS)}")
    return names
