"""Fill .whl-peers/ with the peer kernels' wheels for the offline GPU host: FlashInfer 0.7.2 (its fa2 kernels and
TensorRT-LLM's XQA) and FlashAttention-4 with its CuTe DSL.

    python3 -m benchmarks.kernel.peers.make_wheels            # download, repack, split, pack, write checksums
    python3 -m benchmarks.kernel.peers.make_wheels --check    # only check .whl-peers/ against the checksums

Run it on a machine with PyPI access. FlashInfer's wheel is repacked with LZMA (62 -> 48 MiB, the same files) and
FA4's CUDA 13 DSL library (88 MiB) is split into parts; everything is packed into folders p1, p2, ... of at most
50 MiB, one folder per `run` call (carry: [".whl-peers/pN"]). On the host, once every folder has arrived,
`source benchmarks/kernel/peers/install_on_device.sh` checks, joins and installs them. FA3 and sglang's Triton
kernels come with sglang (benchmarks/e2e/make_sglang_wheels.py).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import zipfile
from pathlib import Path

from benchmarks.e2e.make_sglang_wheels import check, download, pack, write_sums

REPO = Path(__file__).resolve().parents[3]
OUT = REPO / ".whl-peers"
SUMS = Path(__file__).resolve().parent / "wheels.sha256"
FLASHINFER = ["flashinfer-python==0.7.2", "apache-tvm-ffi==0.1.11"]
FA4 = ["flash-attn-4==4.0.0b36", "nvidia-cutlass-dsl==4.8.1", "nvidia-cutlass-dsl-libs-base==4.8.1",
       "nvidia-cutlass-dsl-libs-core==4.8.1", "nvidia-cutlass-dsl-libs-cu13==4.8.1", "quack-kernels==0.6.5",
       "torch-c-dlpack-ext==0.1.5", "einops==0.8.2", "cuda-bindings==13.5.0", "cuda-pathfinder==1.9.1"]
PART_BYTES = 48 * 2**20


def lzma_repack(wheel: Path) -> None:
    """The same members, LZMA-compressed, under the same name (pip reads any zip compression)."""
    tmp = wheel.with_suffix(".lzma")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_LZMA) as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info), compress_type=zipfile.ZIP_LZMA)
    tmp.replace(wheel)


def split(path: Path) -> None:
    """A file over PART_BYTES into NAME.part00, NAME.part01, ... beside it (install_on_device.sh joins them)."""
    if path.stat().st_size <= PART_BYTES:
        return
    with path.open("rb") as f:
        for i, block in enumerate(iter(lambda: f.read(PART_BYTES), b"")):
            path.with_name(f"{path.name}.part{i:02d}").write_bytes(block)
    path.unlink()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check .whl-peers/ against the checksums")
    a = ap.parse_args()
    if a.check:
        return check(OUT, SUMS)
    if OUT.exists():
        shutil.rmtree(OUT)
    flat = OUT / "flat"
    flat.mkdir(parents=True)
    download(FLASHINFER + FA4, flat)
    lzma_repack(next(flat.glob("flashinfer_python-*.whl")))
    for wheel in list(flat.iterdir()):
        split(wheel)
    pack(list(flat.iterdir()), OUT)
    flat.rmdir()
    write_sums(OUT, SUMS, "python3 -m benchmarks.kernel.peers.make_wheels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
