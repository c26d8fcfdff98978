"""Fill .whl-sglang/ with what benchmarks/e2e/install_sglang_on_device.sh installs on the offline GPU host.

    python3 benchmarks/e2e/make_sglang_wheels.py            # download, repack, split, pack, write checksums
    python3 benchmarks/e2e/make_sglang_wheels.py --check    # only check .whl-sglang/ against the checksums
    python3 benchmarks/e2e/make_sglang_wheels.py --repack   # the files already here into folders of today's size

Run it on a machine with PyPI access (any OS: wheels are fetched for the host's CPython 3.12 on x86-64).
The host's image already has torch 2.11, triton 3.6, numpy and the rest listed in the device tool's package
list; sglang-0.5.17.txt names what it lacks, pinned where sglang 0.5.17 pins.
sglang-kernel's wheel (383 MB) is mostly FA3 (flash_ops.abi3.so, 1.1 GB): it is repacked without FA3, the
Blackwell ops and FlashMLA (a "lite" wheel, all the FlashInfer and Triton bases need), and FA3 travels apart,
xz-compressed and split. Everything is then packed into folders p1, p2, ... of at most 50 MiB each: one
folder per `run` call (carry: [".whl-sglang/pN"]), since a call carries 64 MiB with the repository (11.9 MB of
tracked files on 2026-12-05, when folders of 52 MiB no longer fitted).
"""
from __future__ import annotations

import argparse
import hashlib
import lzma
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUT = REPO / ".whl-sglang"
WHEELS = HERE / "sglang-0.5.17.txt"
SUMS = HERE / "sglang-0.5.17.sha256"
KERNEL = "sglang-kernel==0.4.5"
FA3 = "sgl_kernel/flash_ops.abi3.so"
LEFT_OUT = (FA3, "sgl_kernel/sm100/", "sgl_kernel/flashmla_ops.abi3.so")  # not used on Hopper MHA
FA3_PART = "flash_ops.abi3.so.xz.part"
PART_BYTES = 48 * 2**20
FOLDER_BYTES = 50 * 2**20
PLATFORMS = ["manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]


def download(specs: list[str], dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *[f"--platform={p}" for p in PLATFORMS], "-d", str(dest), *specs]
    subprocess.run(cmd, check=True)


def compress(data: bytes) -> bytes:
    """xz, multi-threaded when the xz tool is here (1.1 GB: minutes, not a quarter of an hour)."""
    if shutil.which("xz"):
        return subprocess.run(["xz", "-T0", "-6", "-c"], input=data, capture_output=True, check=True).stdout
    return lzma.compress(data, preset=6)


def repack_kernel(wheel: Path, dest: Path) -> None:
    """The lite wheel (same name: pip installs it as sglang-kernel 0.4.5) and FA3's xz parts, into dest."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(dest / wheel.name, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if info.filename.startswith(LEFT_OUT):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):  # drop the rows of the files left out
                rows = [r for r in data.decode().splitlines() if not r.startswith(LEFT_OUT)]
                data = ("\n".join(rows) + "\n").encode()
            dst.writestr(zipfile.ZipInfo(info.filename, date_time=info.date_time), data)
        fa3 = compress(src.read(FA3))
    for i in range(0, len(fa3), PART_BYTES):
        (dest / f"{FA3_PART}{i // PART_BYTES:02d}").write_bytes(fa3[i:i + PART_BYTES])


def pack(files: list[Path], out: Path = OUT) -> None:
    """Largest first into the first folder of out with room (p1, p2, ...): few calls, each under its limit."""
    folders: list[int] = []
    for f in sorted(files, key=lambda p: -p.stat().st_size):
        size = f.stat().st_size
        slot = next((i for i, used in enumerate(folders) if used + size <= FOLDER_BYTES), None)
        if slot is None:
            folders.append(0)
            slot = len(folders) - 1
        folders[slot] += size
        (out / f"p{slot + 1}").mkdir(exist_ok=True)
        f.rename(out / f"p{slot + 1}" / f.name)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            h.update(block)
    return h.hexdigest()


def write_sums(out: Path = OUT, sums: Path = SUMS, maker: str = "benchmarks/e2e/make_sglang_wheels.py") -> None:
    files = sorted(p for p in out.rglob("*") if p.is_file())
    sums.write_text(f"# sha256 of every file in {out.name}/ ({maker})\n"
                    + "".join(f"{sha256(p)}  {p.relative_to(out)}\n" for p in files))
    for d in sorted(out.iterdir()):
        print(f"{d.name}: {sum(p.stat().st_size for p in d.iterdir()) / 2**20:.1f} MiB, {len(list(d.iterdir()))} files")


def repack() -> int:
    """The files of a checked .whl-sglang/ into folders of FOLDER_BYTES, and the checksums rewritten."""
    if check():
        return 1
    files = [p for p in OUT.rglob("*") if p.is_file()]
    flat = OUT / "flat"
    flat.mkdir()
    for f in files:
        f.rename(flat / f.name)
    for d in OUT.iterdir():
        if d != flat:
            d.rmdir()
    pack(list(flat.iterdir()))
    flat.rmdir()
    write_sums()
    return 0


def check(out: Path = OUT, sums: Path = SUMS) -> int:
    bad = []
    for line in sums.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        digest, name = line.split()
        path = out / name
        if not path.is_file() or sha256(path) != digest:
            bad.append(name)
    print("all files match" if not bad else f"missing or different: {', '.join(bad)}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check .whl-sglang/ against the checksums")
    ap.add_argument("--repack", action="store_true", help="check .whl-sglang/, then pack its files into folders "
                    "of FOLDER_BYTES and rewrite the checksums (no download)")
    a = ap.parse_args()
    if a.check:
        return check()
    if a.repack:
        return repack()
    if OUT.exists():
        shutil.rmtree(OUT)
    flat, kernel = OUT / "flat", OUT / "kernel"
    flat.mkdir(parents=True)
    kernel.mkdir()
    download([s for s in (line.split("#")[0].strip() for line in WHEELS.read_text().splitlines()) if s], flat)
    download([KERNEL], kernel)
    repack_kernel(next(kernel.glob("sglang_kernel-*.whl")), flat)
    shutil.rmtree(kernel)
    pack(list(flat.iterdir()))
    flat.rmdir()
    write_sums()
    return 0


if __name__ == "__main__":
    sys.exit(main())
