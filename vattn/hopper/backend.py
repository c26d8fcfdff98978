"""The Hopper kernel behind vattn.api's Backend dispatch, opt-in with VATTN_HOPPER=1 (vattn/switch.py; read
when vattn is imported) until it is faster than the Triton path, which it is not yet (benchmarks/NOTES.md).
It takes the calls its prototype covers: an sm_90 GPU, e4m3 KV with one KV head's page contiguous, bf16 Q,
head_dim 256 and max_q_len x GQA = 64 packed rows; every other call goes to Triton. A build or launch
failure falls back to Triton with one warning (vattn.api.attention)."""

from __future__ import annotations

import functools

from vattn import switch
from vattn.api import Backend

QROWS, BLOCK_N = 64, 64  # the kernel's packed rows and its tile in tokens (whole pages)


def enabled() -> bool:
    """VATTN_HOPPER alone: whether vattn serves at all (VATTN) is the engine's gate to decide and report."""
    return switch.hopper()


@functools.lru_cache(maxsize=None)
def _is_sm90(device) -> bool:
    import torch

    return torch.cuda.get_device_capability(device) == (9, 0)


def supports(ws, q, k_cache) -> bool:
    import torch

    return (ws.device.type == "cuda" and _is_sm90(ws.device) and k_cache.dtype == torch.float8_e4m3fn
            and q.dtype == torch.bfloat16 and ws.head_dim == 256 and ws.gqa * ws.max_q_len == QROWS
            and BLOCK_N % ws.page_size == 0 and ws.page_size % 4 == 0 and k_cache.stride(1) == ws.head_dim)


@functools.lru_cache(maxsize=None)
def _kernel(head_dim: int, gqa: int, page: int):
    from vattn.hopper.build import MainSm90

    return MainSm90(head_dim=head_dim, gqa=gqa, page=page)


def run(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, softmax_scale, plan,
        out) -> None:
    from vattn import kernel as K

    ws = plan.workspace
    _kernel(ws.head_dim, ws.gqa, ws.page_size).launch(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                                                      k_descale, v_descale, softmax_scale, plan.tensors, ws.o_part,
                                                      ws.lse_part)
    K.launch_reduce(ws.o_part, ws.lse_part, plan.tensors["seq_part_start"], cu_seqlens_q, out, gqa=ws.gqa,
                    max_q_len=ws.max_q_len)


BACKEND = Backend("hopper_sm90", supports, run)
