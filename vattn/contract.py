"""What vattn supports and how close to the fp32 reference it must be (KERNEL.md), stated once.

The workspace refuses anything outside these shapes, the sglang gate routes such calls to the
base backend, the emulator's config and the benchmarks select within them, and every accuracy
check (tests, bench, peers) compares against the same tolerances. Pure Python: no torch import.
"""
from __future__ import annotations

HEAD_DIMS = (64, 128, 256)
PAGE_SIZES = (1, 16, 64)  # compile-time: one kernel variant per page size
MAX_GQA = 16  # query heads per KV head, 1..MAX_GQA: the packed tile holds q_len x G rows
MAX_Q_LEN = 8  # query tokens per sequence, 0..MAX_Q_LEN (0 = absent from this call)
KV_DTYPES = ("float8_e4m3fn", "bfloat16", "float16")  # torch dtype names of the paged cache
Q_DTYPES = ("bfloat16", "float16")

# Relative Frobenius error ||out - ref|| / ||ref|| against vattn.reference (fp32), by KV operand type.
FP8_TOLERANCE = 2e-2
HALF_TOLERANCE = 5e-3  # bf16 or fp16 operands
_FP8_NAMES = ("fp8", "fp8_e4m3", "float8_e4m3fn", "torch.float8_e4m3fn")


def tolerance(kv_dtype) -> float:
    """The tolerance for a cache of `kv_dtype`: a short name ("fp8", "bf16", "fp16"), a torch dtype
    name or a torch dtype; anything that is not e4m3 counts as a 16-bit cache."""
    return FP8_TOLERANCE if str(kv_dtype) in _FP8_NAMES else HALF_TOLERANCE
