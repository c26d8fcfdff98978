"""Compile vattn's Hopper main kernels and their reduce ahead of time, on any machine with nvcc and no GPU, for one
model's shapes: the builds its calls would otherwise compile at first use. Point VATTN_CACHE at the folder on the
GPU machine (an engine's image without nvcc would else fall back to Triton, and each tensor-parallel worker would
compile the same build at its first call).

    python -m vattn.hopper.prebuild --kv-dtype fp8 --head-dim 256 --num-q-heads 32 --num-kv-heads 2 --tp 2 \\
        --page-size 16 --max-q-len 1,4,8 --cache ./vattn-cubins

Heads are the model's; --tp shares them out as sglang does (each GPU a tp-th of the query heads, and of the KV
heads, or one KV head where there are fewer than tp). One line a max_q_len: the build, its cubin, and ptxas's
registers and spills; a shape the kernels do not cover is named as going to Triton; then the reduce's cubin. The
launch extension (vattn/native/launch.cpp) is still built at first use, by the GPU machine's C++ compiler against
its torch; without one, launches go through ctypes."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from vattn import switch
from vattn.hopper import backend, build, reduce
from vattn.native import cuda

MAX_Q_LENS = range(1, 9)  # as vattn.Workspace's max_q_len


def _q_lens(text: str) -> list[int]:
    try:
        lens = sorted({int(x) for x in text.split(",")})
    except ValueError:
        lens = []
    if not lens or any(n not in MAX_Q_LENS for n in lens):
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: comma-separated integers from 1 to 8")
    return lens


def ptxas_summary(cubin: Path, kernel: str) -> str:
    """ptxas's registers and spill stores of the cubin's entry function `kernel` (the one the build launches)."""
    report = cuda.ptxas_report(cubin).read_text()
    part = report.split(f"Compiling entry function '{kernel}'", 1)[-1].split("Compiling entry function", 1)[0]
    regs, spills = re.search(r"Used (\d+) registers", part), re.search(r"(\d+) bytes spill stores", part)
    if not regs or not spills:
        return f"no ptxas figures for {kernel}"
    return f"{kernel}: {regs.group(1)} registers, {spills.group(1)} bytes of spill stores"


def compile_reduce(head_dim: int) -> str:
    """Compile the CUDA reduce of one head_dim into the cubin cache (vattn.native.cuda.CACHE); its line: the cubin,
    ptxas's registers and spills."""
    cubin = reduce.compile_cubin(head_dim)
    return f"reduce: {cubin} ({ptxas_summary(cubin, 'vattn_reduce_sm90')})"


def compile_build(defines: dict) -> str:
    """Compile one build into the cubin cache (vattn.native.cuda.CACHE); its line: the cubin, its defines, ptxas's
    registers and spills."""
    cubin = build.compile_cubin(defines)
    flags = ", ".join(f"{k}={v}" for k, v in sorted(defines.items()))
    return f"{cubin} ({flags}; {ptxas_summary(cubin, build.kernel_name(defines))})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv-dtype", required=True, choices=("fp8", "bf16"), help="the KV cache's dtype (fp8: e4m3)")
    ap.add_argument("--head-dim", required=True, type=int)
    ap.add_argument("--num-q-heads", required=True, type=int, help="the model's query heads")
    ap.add_argument("--num-kv-heads", required=True, type=int, help="the model's KV heads")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs the heads are shared over (default 1)")
    ap.add_argument("--page-size", required=True, type=int, help="tokens a KV page")
    ap.add_argument("--max-q-len", required=True, type=_q_lens,
                    help="the workspaces' max_q_len values, comma-separated (decode 1, verify the draft tokens)")
    ap.add_argument("--qk", choices=switch.QK_MODES, default=None,
                    help="how Q.K^T rounds Q, as VATTN_QK (default: this environment's VATTN_QK, unset: split; "
                         "e4m3 is the lossy fast mode)")
    ap.add_argument("--cache", type=Path, default=cuda.CACHE, help=f"the cubin folder (default {cuda.CACHE})")
    a = ap.parse_args(argv)
    qk = a.qk or switch.qk_mode()
    for field, value in (("--head-dim", a.head_dim), ("--num-q-heads", a.num_q_heads),
                         ("--num-kv-heads", a.num_kv_heads), ("--tp", a.tp), ("--page-size", a.page_size)):
        if value < 1:
            ap.error(f"{field}: got {value}; allowed: a positive integer")
    if a.num_q_heads % a.num_kv_heads:
        ap.error(f"--num-q-heads: got {a.num_q_heads} with --num-kv-heads {a.num_kv_heads}; allowed: a multiple of it")
    if a.num_q_heads % a.tp or (a.num_kv_heads % a.tp and a.tp % a.num_kv_heads):
        ap.error(f"--tp: got {a.tp} with {a.num_q_heads} query and {a.num_kv_heads} KV heads; allowed: a divisor of "
                 "the query heads that divides the KV heads or is a multiple of them")
    q_heads, kv_heads = a.num_q_heads // a.tp, max(1, a.num_kv_heads // a.tp)  # one GPU's

    cuda.CACHE = a.cache
    print(f"one GPU of {a.tp}: {q_heads} query heads, {kv_heads} KV heads (GQA {q_heads // kv_heads}), head_dim "
          f"{a.head_dim}, {a.kv_dtype} pages of {a.page_size}, Q.K^T {qk}", flush=True)
    built = False
    for q_len in a.max_q_len:
        args = backend.model_build(a.kv_dtype, a.head_dim, q_heads, kv_heads, a.page_size, q_len, qk)
        if args is None:
            print(f"max_q_len {q_len}: not covered by the Hopper kernels (vattn runs Triton there); nothing to build",
                  flush=True)
            continue
        print(f"max_q_len {q_len}: {compile_build(build.main_defines(**args))}", flush=True)
        built = True
    if built and a.head_dim % reduce.SLICE == 0:  # its bf16 partials' merge (reduce.serves; below 16 sequences x
        # programs vattn's Triton reduce takes it)
        print(compile_reduce(a.head_dim), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
