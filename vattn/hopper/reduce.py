"""The Hopper path's reduce (reduce_sm90.cu): the bf16 partials of a call's split sequences merged by CTAs of
WARPS warps, a warp SLICE values of one output row, its lane groups taking different pieces.

On an H200, against vattn's Triton reduce (run BE: the bench's calls, the reduce off and on alternating on one
machine, two rounds; BENCHMARKS.md): 16x35k 0.3-1.0 us faster, head_dim 128 0.5-1.4, 16x35k-q8 4.8-5.0, 16x119k
2.5-3.0; q1 +1.3 and -0.1, long among short 0.4-0.8 slower. Below 16 sequences x programs it lost (4x35k +0.9-1.3 us
a layer, benchmarks/NOTES.md P91), where vattn's Triton reduce is not a programmatic dependent either
(kernel.PDL_MIN_SEQUENCES): the backend takes this one only from there (`serves`). 64-value slices lost 8-18 us
behind 16x70k's main kernel (P105).

Built with nvcc at first use (vattn.native.cuda.compile_source, cached beside the main kernel's cubins; or ahead
of time by vattn.hopper.prebuild) and launched with its parameters bound once per call signature, by
vattn/native/launch.cpp's PointerLaunch: a call sets two addresses, without the Python and ctypes work of the
launch as first written (3.9-7.4 us of host time against the Triton reduce's 4.9-7.0 on one H200 host, run BF host
in benchmarks/h200-host-overhead.json; benchmarks/NOTES.md, "Issue 18: long among short, host overhead").
"""

from __future__ import annotations

import functools
from pathlib import Path

SOURCE = Path(__file__).with_name("reduce_sm90.cu")
WARPS, UNROLL, SLICE = 8, 8, 128  # warps a CTA, loads in flight a lane, values of a row a warp (P91, P105)


def compile_cubin(head_dim: int, warps: int = WARPS, unroll: int = UNROLL, slice_: int = SLICE, trigger: int = 0,
                  after_wait: int = 0) -> Path:
    """The cached cubin of one launch shape (trigger, after_wait: reduce_sm90.cu's measurement switches)."""
    from vattn.native.cuda import compile_source

    head = "".join(f"#define {k} {v}\n" for k, v in (("HEAD_DIM", head_dim), ("WARPS", warps), ("UNROLL", unroll),
                                                        ("SLICE", slice_), ("TRIGGER", trigger),
                                                        ("AFTER_WAIT", after_wait)))
    return compile_source(head + SOURCE.read_text(), "vattn_reduce_sm90")


def serves(o_part, out, batch: int) -> bool:
    """Whether this reduce takes a call's merge: bf16 partials and output whose rows the slices cover in 16-byte
    loads and stores (out's address, which a call may change, is checked at each launch), and at least
    kernel.PDL_MIN_SEQUENCES sequences x programs (below, vattn's Triton reduce)."""
    import torch

    from vattn.kernel import PDL_MIN_SEQUENCES

    return (o_part.dtype == out.dtype == torch.bfloat16 and out.shape[2] % SLICE == 0 and o_part.stride(3) == 1
            and out.stride(2) == 1 and out.stride(0) % 8 == 0 and out.stride(1) % 8 == 0
            and batch * o_part.shape[1] >= PDL_MIN_SEQUENCES)


@functools.lru_cache(maxsize=None)
class ReduceSm90:
    """The loaded reduce of one head_dim and launch shape. Call it as kernel.launch_reduce (bf16 partials,
    skip_whole), or bind it once for calls of one signature. trigger: it lets the next kernel launch at its start;
    after_wait: it reads seq_part_start only after its wait for the main kernel (which writes it when built with
    IN_KERNEL_PLAN). Both are measurement switches (benchmarks/NOTES.md P100-P104). long_path: a sequence of more
    than two rounds of a warp's loads in pieces (32 at the default shape) is merged by about one CTA an SM, launched
    before the batch's, all its warps on one row slice at a time, instead of by its rows' own warps: the long request
    among short ones, whose pieces fill most of the SMs (P107); 0 leaves every sequence to its own warps (a
    measurement switch)."""

    def __init__(self, head_dim: int, warps: int = WARPS, unroll: int = UNROLL, slice_: int = SLICE,
                 trigger: int = 0, after_wait: int = 0, long_path: int = 1):
        import torch

        from vattn.native.cuda import launch_kernel_ex_address, load_function

        torch.zeros(1, device="cuda")  # the primary context current on this thread
        self.head_dim, self.warps, self.slice = head_dim, warps, min(slice_, head_dim)
        self.after_wait = bool(after_wait)
        self.long_path = bool(long_path)
        pieces_a_round = 32 // (self.slice // 8) * unroll  # a warp's loads in flight, a piece's slice each
        self.long_from = 2 * pieces_a_round if long_path else 2**31 - 1  # without: no sequence is long
        self._image, self.module, self.fn = load_function(
            compile_cubin(head_dim, warps, unroll, self.slice, trigger, after_wait), "vattn_reduce_sm90")
        self._launch_fn = launch_kernel_ex_address()

    def bind(self, o_part, lse_part, seq_part_start, cu_seqlens_q, out, *, gqa: int, max_q_len: int,
             pdl: bool = True):
        """launch(cu_seqlens_q, out) for calls whose other arguments are these and whose cu_seqlens_q and out
        have these shapes and strides (vattn.api binds one per call signature); pdl: as a programmatic dependent
        of the main kernel. out must be 16-byte aligned (its rows are stored 16 bytes at a time): launch raises
        ValueError otherwise."""
        import torch

        from vattn.native import cuda
        from vattn.native.launch import current_stream_fn, pointer_launch_type

        if o_part.dtype != torch.bfloat16 or out.dtype != torch.bfloat16 or out.shape[2] != self.head_dim:
            raise ValueError(f"ReduceSm90: bf16 partials and output of head_dim {self.head_dim}; got {o_part.dtype}, "
                             f"{out.dtype}, head_dim {out.shape[2]}")
        batch, heads = cu_seqlens_q.shape[0] - 1, out.shape[1]
        slices = heads * (self.head_dim // self.slice)  # a warp a slice of a row
        row_ctas = -(-slices // self.warps) * max_q_len  # the CTAs of one sequence; before the batch's, the long ones'
        sms = torch.cuda.get_device_properties(out.device).multi_processor_count
        long_z = -(-sms // row_ctas) if self.long_path else 0
        u64 = lambda *values: [("u64", v) for v in values]
        params = [*u64(o_part.data_ptr(), *o_part.stride()[:3], lse_part.data_ptr(), *lse_part.stride()[:2],
                       seq_part_start.data_ptr()), ("ptr", 0), ("ptr", 1, 16), *u64(out.stride(0), out.stride(1)),
                  *[("i32", v) for v in (heads, gqa, int(pdl), batch, self.long_from)]]
        launch = pointer_launch_type(cuda.CACHE)(
            "vattn_reduce_sm90(cu_seqlens_q, out)", self._launch_fn, current_stream_fn(out.device.index), self.fn.value,
            (-(-slices // self.warps), max_q_len, batch + long_z), self.warps * 32, 0, params, pdl,
            (o_part, lse_part, seq_part_start))
        return launch.launch

    def __call__(self, o_part, lse_part, seq_part_start, cu_seqlens_q, out, *, gqa: int, max_q_len: int,
                 pdl: bool = True) -> None:
        self.bind(o_part, lse_part, seq_part_start, cu_seqlens_q, out, gqa=gqa, max_q_len=max_q_len,
                  pdl=pdl)(cu_seqlens_q, out)
