"""The Hopper main kernel's launch (launch.cpp): a CPython extension built at first use with the system C++
compiler against torch's headers, cached beside the cubins (vattn.hopper.build.CACHE) by a hash of its source, the
torch and Python versions.

It checks a call's nine tensors against the signature it was made with and launches the kernel through
cuLaunchKernel, so that an eager vattn.attention call whose signature repeats skips the Python signature (see
vattn.api.attention). The build takes ~20 s once; a failure raises, and the Hopper backend then falls back to
Triton with one warning, as for a failed kernel build."""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("launch.cpp")
MODULE = "vattn_hopper_launch"


def _compiler() -> str:
    for name in (sysconfig.get_config_var("CXX") or "", "c++", "g++", "clang++"):
        path = shutil.which(name.split()[0]) if name else None
        if path:
            return path
    raise RuntimeError("vattn's Hopper launch needs a C++ compiler (c++, g++ or clang++ on PATH)")


def build_command(out: Path, src: Path) -> list[str]:
    """The compile and link of the extension against the running torch and Python."""
    import torch
    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    libs = cpp_extension.library_paths()
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    return [_compiler(), "-O2", "-shared", "-fPIC", "-std=c++20", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *includes, str(src), "-o", str(out), *[f"-L{p}" for p in libs],
            *[f"-Wl,-rpath,{p}" for p in libs], "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10"]


@functools.lru_cache(maxsize=None)
def module():
    """The built extension module (built now if absent from the cache)."""
    import torch

    from vattn.hopper.build import CACHE

    tag = f"{SOURCE.read_text()}|torch {torch.__version__}|{sys.version}|{sysconfig.get_config_var('EXT_SUFFIX')}"
    key = hashlib.sha256(tag.encode()).hexdigest()[:16]
    out = CACHE / f"{MODULE}_{key}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not out.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:  # renamed into the cache: see build.compile_cubin
            built = Path(tmp) / out.name
            cmd = build_command(built, SOURCE)
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"building vattn's Hopper launch failed ({' '.join(cmd)}):\n{res.stderr[-4000:]}")
            os.replace(built, out)
    spec = importlib.util.spec_from_loader(MODULE, importlib.machinery.ExtensionFileLoader(MODULE, str(out)))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
