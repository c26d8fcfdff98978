"""The CUDA driver API through ctypes, and the cubins nvcc compiles for it.

Cubins are compiled for sm_90a (wgmma needs the `a` target), cached in CACHE (VATTN_CACHE, else ~/.cache/vattn) by a
hash of their source, and loaded with cuModuleLoadData into the context torch made current."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("VATTN_CACHE", Path.home() / ".cache" / "vattn"))


def nvcc() -> str:
    for path in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if path and Path(path).exists():
            return path
    raise RuntimeError("vattn's Hopper kernel needs nvcc (CUDA 12.3+): not on PATH or in /usr/local/cuda/bin")


def compile_source(src: str, stem: str, *, verbose: bool = False) -> Path:
    """The cached sm_90a cubin of a CUDA source (named stem and the source's hash), compiled now if absent; ptxas's
    report beside it (ptxas_report)."""
    key = hashlib.sha256(src.encode()).hexdigest()[:16]
    out = CACHE / f"{stem}_{key}.cubin"
    if out.exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    # built beside the cache and renamed into it: processes that build at once (an engine's TP workers) never
    # read a half-written file
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        cu = Path(tmp) / f"{stem}.cu"
        cu.write_text(src)
        cmd = [nvcc(), "-cubin", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas=-v",
               "-o", str(Path(tmp) / "k.cubin"), str(cu)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"nvcc failed ({' '.join(cmd)}):\n{res.stderr[-4000:]}")
        if verbose:
            print(res.stderr.strip())
        report = Path(tmp) / "k.ptxas.txt"
        report.write_text(res.stderr)
        os.replace(report, ptxas_report(out))
        os.replace(Path(tmp) / "k.cubin", out)
    return out


def ptxas_report(cubin: Path) -> Path:
    """Where compile_source keeps ptxas's -v report of a cubin: registers, spills, wgmma serialisation warnings."""
    return cubin.with_suffix(".ptxas.txt")


def load_function(cubin: Path, name: str) -> tuple:
    """(image, module, function): kernel `name` of a cubin, loaded into the current context. The image buffer must
    live as long as the module."""
    drv = driver()
    data = cubin.read_bytes()
    image = ctypes.create_string_buffer(data, len(data))
    module, fn = ctypes.c_void_p(), ctypes.c_void_p()
    drv.check(drv.lib.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
    drv.check(drv.lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), "cuModuleGetFunction")
    return image, module, fn


def launch_kernel_ex_address() -> int:
    """cuLaunchKernelEx's address, for launch.cpp's launches to call."""
    return ctypes.cast(driver().lib.cuLaunchKernelEx, ctypes.c_void_p).value


class Driver:
    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: CUDA driver error {rc} ({name.value.decode() if name.value else '?'})")


@functools.lru_cache(maxsize=None)
def driver() -> Driver:
    return Driver()
