"""Static evidence for the main kernel without a GPU: compile it for sm_90a and report ptxas's registers and
spills and the SASS instruction count, per (page size, config). Runs on a CPU-only machine.

    python -m benchmarks.kernel.sass --pages 1,16 --configs 64,4,2,2,1,0,0:64,4,2,2,1,0,1

The loop is issue-bound at 2 programs per SM (BENCHMARKS.md, Nsight Compute), so the instruction count
of one compiled kernel against another predicts which runs faster. ptxas and cuobjdump: a CUDA toolkit's
(PATH, /usr/local/cuda/bin) or the ones Triton ships.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.kernel.configs import label, parse_config

POINTERS = {"q_ptr": "*bf16", "k_ptr": "*fp8e4nv", "v_ptr": "*fp8e4nv", "bt_ptr": "*i32", "seq_lens_ptr": "*i32",
            "cu_q_ptr": "*i32", "k_descale_ptr": "*fp32", "v_descale_ptr": "*fp32", "work_seq_ptr": "*i32",
            "work_start_ptr": "*i32", "work_end_ptr": "*i32", "work_part_ptr": "*i32", "work_order_ptr": "*i32",
            "o_part_ptr": "*fp32", "lse_part_ptr": "*fp32"}
INTEGER_OPS = ("IMAD", "IADD", "LEA", "SHF", "LOP3", "ISETP", "SEL", "IMNMX")


def _tool(name: str) -> str:
    """A CUDA toolkit's binary, else the one Triton ships (its ptxas reads PTX ISA <= 8.8)."""
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    for path in (shutil.which(name), f"/usr/local/cuda/bin/{name}", str(bundled)):
        if path and Path(path).exists():
            return path
    raise SystemExit(f"{name}: not on PATH, in /usr/local/cuda/bin or in Triton's {bundled.parent}")


def ptx(page: int, config, *, head_dim: int = 256, qrows: int = 64) -> str:
    """Triton's PTX of the main kernel: fp8 KV with descales, bf16 Q, GQA16 packing, the given config. The
    constexprs come from vattn.kernel.main_launch_args on meta tensors, as a launch would pass them."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from vattn import kernel as K

    gqa = 16
    meta = dict(device="meta")
    q = torch.empty(8, gqa, head_dim, dtype=torch.bfloat16, **meta)
    kv = torch.empty(1024, page, 1, head_dim, dtype=torch.float8_e4m3fn, **meta)
    i32 = torch.empty(64, dtype=torch.int32, **meta)
    scale = torch.empty(1, dtype=torch.float32, **meta)
    o = torch.empty(1, 1, qrows, head_dim, dtype=torch.float32, **meta)
    lse = torch.empty(1, 1, qrows, dtype=torch.float32, **meta)
    plan = {f: i32 for f in ("work_seq", "work_start", "work_end", "work_part", "work_order")}
    _, kwargs = K.main_launch_args(q, kv, kv, i32.view(4, 16), i32, i32, scale, scale, 1.0, plan, o, lse,
                                   gqa=gqa, max_q_len=qrows // gqa, config=config)
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages")}
    fn = K._attn_main_kernel
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in kwargs:
            signature[name], constexprs[(i,)] = "constexpr", kwargs[name]
        else:
            signature[name] = POINTERS.get(name, "fp32" if name == "softmax_scale" else "i32")
        if name in POINTERS or name.startswith("stride"):  # as the launcher specialises them at run time
            attrs[(i,)] = [["tt.divisibility", 16]]
    compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                              options=options)
    return compiled.asm["ptx"]


def assemble(ptx_text: str) -> dict:
    """ptxas -v and cuobjdump -sass on one PTX: registers, spill bytes, SASS instructions (all, integer)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        # a newer Triton may stamp a PTX ISA newer than the toolkit's ptxas; the kernel uses none of it
        src.write_text(re.sub(r"^\.version \d+\.\d+", ".version 8.7", ptx_text, count=1, flags=re.M))
        info = subprocess.run([_tool("ptxas"), "-arch=sm_90a", "-v", str(src), "-o", str(cubin)],
                              capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    lines = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,5}\*/", ln)]
    return dict(registers=int(re.search(r"Used (\d+) registers", info).group(1)),
                spill_bytes=int(re.search(r"(\d+) bytes spill stores", info).group(1)),
                sass=len(lines), sass_integer=sum(any(op in ln for op in INTEGER_OPS) for ln in lines),
                loops=_loops(lines))


def _loops(lines: list[str]) -> list[int]:
    """Instructions in each backward branch's span, in code order: the KV loops' bodies, each issued once per
    tile (with split_tail: the unmasked body, then the masked tail). SASS instructions are 16 bytes apart.
    A forward branch inside a body (lazy_rescale's) makes the span an upper bound."""
    spans = []
    for ln in lines:
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?BRA\s.*?0x([0-9a-f]+)", ln)
        if m and int(m.group(2), 16) < int(m.group(1), 16):
            spans.append((int(m.group(1), 16) - int(m.group(2), 16)) // 16 + 1)
    return spans


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernel.sass", description=__doc__.split("\n")[0])
    ap.add_argument("--pages", default="1,16,64", help="comma-separated page sizes (default 1,16,64)")
    ap.add_argument("--configs", default="64,4,2,2,1,0,0:64,4,2,2,1,0,1",
                    help="colon-separated bench --config strings (default: split-Q, without/with hoist_rows)")
    ap.add_argument("--qrows", type=int, default=64, help="packed query rows: q_len x GQA (default 64)")
    ap.add_argument("--head-dim", type=int, default=256)
    a = ap.parse_args(argv)
    print("| page | config | registers | spill bytes | SASS | integer SASS | loop bodies |\n|---|---|---|---|---|---|---|")
    for page in (int(p) for p in a.pages.split(",")):
        for text in a.configs.split(":"):
            config = parse_config(text)
            r = assemble(ptx(page, config, head_dim=a.head_dim, qrows=a.qrows))
            print(f"| {page} | {label(config)} | {r['registers']} | {r['spill_bytes']} | {r['sass']} | "
                  f"{r['sass_integer']} | {' / '.join(map(str, r['loops']))} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
