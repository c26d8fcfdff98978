"""A measurement: vattn's reduce on the Hopper path's bf16 partials as a CUDA kernel of few, wide CTAs
(reduce_sm90.cu: a warp a slice of a row whose lane groups take different pieces, several warps a CTA) instead of
the Triton reduce's one-warp programs. hopper_proto's `--cuda-reduce WARPS:UNROLL:SLICE,...` checks it against the
reference and times it alone and in the chain (plan + main + reduce), launched as the Triton reduce is, as the main
kernel's programmatic dependent.

On an H200 (benchmarks/NOTES.md P91) it took 0.2-1.8 us off the chain on 16x35k and head_dim 128 and lost up to
2.9 us on batches of few sequences of many pieces (4x35k): the reduce's share of a call is its place in the chain
more than its program count. Not the backend's.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

SOURCE = Path(__file__).with_name("reduce_sm90.cu")


def compile_cubin(head_dim: int, warps: int, unroll: int, slice_: int, trigger: int = 0, after_wait: int = 0) -> Path:
    from vattn.hopper.build import compile_source

    head = "".join(f"#define {k} {v}\n" for k, v in (("HEAD_DIM", head_dim), ("WARPS", warps), ("UNROLL", unroll),
                                                        ("SLICE", slice_), ("TRIGGER", trigger),
                                                        ("AFTER_WAIT", after_wait)))
    return compile_source(head + SOURCE.read_text(), "vattn_reduce_sm90")


@functools.lru_cache(maxsize=None)
class ReduceSm90:
    """The loaded reduce for one head_dim, warps a CTA, loads in flight a lane and slice of a row a warp; trigger:
    it lets the next kernel launch at its start; after_wait: it reads seq_part_start only after its wait for the
    main kernel (which writes it when built with IN_KERNEL_PLAN). Call it as launch_reduce (bf16 partials,
    skip_whole)."""

    def __init__(self, head_dim: int, warps: int = 8, unroll: int = 8, slice_: int = 64, trigger: int = 0,
                 after_wait: int = 0):
        import torch

        from vattn.hopper.build import _driver, load_function
        from vattn.hopper.launch import _DRIVER_LAUNCH

        torch.zeros(1, device="cuda")  # the primary context current on this thread
        self.head_dim, self.warps, self.slice = head_dim, warps, min(slice_, head_dim)
        self.after_wait = bool(after_wait)
        self._image, self.module, self.fn = load_function(
            compile_cubin(head_dim, warps, unroll, self.slice, trigger, after_wait), "vattn_reduce_sm90")
        self._launch = _DRIVER_LAUNCH(ctypes.cast(_driver().lib.cuLaunchKernelEx, ctypes.c_void_p).value)

    def __call__(self, o_part, lse_part, seq_part_start, cu_seqlens_q, out, *, gqa: int, max_q_len: int,
                 pdl: bool = True) -> None:
        import torch

        from vattn.hopper.launch import _PROGRAMMATIC_STREAM_SERIALIZATION, _LaunchAttribute, _LaunchConfig

        if o_part.dtype != torch.bfloat16 or out.shape[2] != self.head_dim:
            raise ValueError(f"ReduceSm90: bf16 partials of head_dim {self.head_dim}; got {o_part.dtype}, "
                             f"{out.shape[2]}")
        batch, heads = cu_seqlens_q.shape[0] - 1, out.shape[1]
        slices = heads * (self.head_dim // self.slice)  # a warp a slice of a row
        i64, i32 = ctypes.c_int64, ctypes.c_int32
        args = [i64(o_part.data_ptr()), *map(i64, o_part.stride()[:3]), i64(lse_part.data_ptr()),
                *map(i64, lse_part.stride()[:2]), i64(seq_part_start.data_ptr()), i64(cu_seqlens_q.data_ptr()),
                i64(out.data_ptr()), i64(out.stride(0)), i64(out.stride(1)), i32(heads), i32(gqa), i32(int(pdl))]
        params = (ctypes.c_void_p * len(args))(*map(ctypes.addressof, args))
        attr = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
        grid = (-(-slices // self.warps), max_q_len, batch)
        config = _LaunchConfig(grid=(ctypes.c_uint * 3)(*grid), block=(ctypes.c_uint * 3)(self.warps * 32, 1, 1),
                               smem=0, stream=torch.cuda.current_stream().cuda_stream, attrs=ctypes.pointer(attr),
                               num_attrs=1 if pdl else 0)
        rc = self._launch(ctypes.byref(config), self.fn, params, None)
        if rc != 0:
            raise RuntimeError(f"cuLaunchKernelEx (vattn_reduce_sm90) failed: CUresult {rc}")
