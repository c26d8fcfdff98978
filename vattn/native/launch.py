"""vattn's kernel launches (launch.cpp): a CPython extension built at first use with the system C++ compiler
against torch's headers, cached beside the cubins (the cache folder its callers pass, vattn.native.cuda.CACHE) by a
hash of its source, the torch and Python versions.

Its Launch checks a call's nine tensors against the signature it was made with and launches the main kernel
through cuLaunchKernelEx, so that an eager vattn.attention call whose signature repeats skips the Python signature
(see vattn.api.attention); its PointerLaunch launches the reduce with the two addresses a call changes, and
vattn.launcher's bound Triton kernels (the plan, Triton's reduce and main kernel) once compiled. The build
takes ~20 s once. Where it cannot be built (no C++ compiler, no Python headers), `launch_type` and
`pointer_launch_type` warn once and give PyLaunch and PyPointerLaunch, the same contracts in Python and ctypes:
correct, with more host time (the Python signature: ~16-27 us an eager call on an H200 host instead of 5-7)."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path

SOURCE = Path(__file__).with_name("launch.cpp")
MODULE = "vattn_native_launch"


def _compiler() -> str:
    for name in (sysconfig.get_config_var("CXX") or "", "c++", "g++", "clang++"):
        path = shutil.which(name.split()[0]) if name else None
        if path:
            return path
    raise RuntimeError("vattn's C++ kernel launches need a C++ compiler (c++, g++ or clang++ on PATH)")


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
def module(cache: Path):
    """The built extension module (built now if absent from the cache folder)."""
    import torch

    tag = f"{SOURCE.read_text()}|torch {torch.__version__}|{sys.version}|{sysconfig.get_config_var('EXT_SUFFIX')}"
    key = hashlib.sha256(tag.encode()).hexdigest()[:16]
    out = cache / f"{MODULE}_{key}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not out.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:  # renamed into the cache: see build.compile_cubin
            built = Path(tmp) / out.name
            cmd = build_command(built, SOURCE)
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"building vattn's C++ kernel launches failed ({' '.join(cmd)}):\n"
                                   f"{res.stderr[-4000:]}")
            os.replace(built, out)
    spec = importlib.util.spec_from_loader(MODULE, importlib.machinery.ExtensionFileLoader(MODULE, str(out)))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=None)
def built_module(cache: Path):
    """The extension module, or None (with one warning) where it cannot be built."""
    try:
        return module(cache)
    except Exception as exc:
        warnings.warn(f"vattn: the C++ kernel launches could not be built ({exc!r}); launching through ctypes "
                      "and Triton's launcher, with more host time a call")
        return None


def launch_type(cache: Path):
    """The Launch class: the extension's, or PyLaunch where it cannot be built."""
    built = built_module(cache)
    return PyLaunch if built is None else built.Launch


def pointer_launch_type(cache: Path):
    """The PointerLaunch class: the extension's, or PyPointerLaunch where it cannot be built."""
    built = built_module(cache)
    return PyPointerLaunch if built is None else built.PointerLaunch


class _LaunchAttribute(ctypes.Structure):  # cuda.h's CUlaunchAttribute: an id, its value in a 64-byte union at 8
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):  # cuda.h's CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_DRIVER_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_void_p)  # cuLaunchKernelEx's prototype
_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


def current_stream_fn(device: int):
    """A callable giving torch's current raw stream on `device` (the capture stream inside a CUDA graph capture):
    torch's private C getter where it has one, the public API otherwise."""
    import torch

    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return (functools.partial(raw_stream, device) if raw_stream
            else lambda: torch.cuda.current_stream(device).cuda_stream)


class _Enqueue:
    """launch.cpp's Enqueue in ctypes: one kernel's launch config, enqueued with a call's parameter slots."""

    def __init__(self, launch_fn, stream_fn, function, grid, threads, smem, pdl):
        self._driver, self._stream, self._function = _DRIVER_LAUNCH(launch_fn), stream_fn, function
        self._pdl = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
        self._config = _LaunchConfig(grid=(ctypes.c_uint * 3)(*grid), block=(ctypes.c_uint * 3)(threads, 1, 1),
                                     smem=smem, attrs=ctypes.pointer(self._pdl), num_attrs=1 if pdl else 0)

    def __call__(self, params) -> None:
        self._config.stream = self._stream()
        rc = self._driver(ctypes.byref(self._config), self._function, params, None)
        if rc != 0:
            raise RuntimeError(f"cuLaunchKernelEx failed: CUresult {rc}")


_FIXED = {"u64": ctypes.c_uint64, "i32": ctypes.c_int32, "f32": ctypes.c_float}
_DESCALES = (6, 7)  # [1] tensors: their strides are not part of the signature


def _meta(t, strides: bool = True):
    return None if t is None else (t.shape, t.stride() if strides else None, t.dtype, t.device)


class PyLaunch:
    """launch.cpp's Launch (see there for the arguments and results) in Python and ctypes."""

    def __init__(self, launch_fn, stream_fn, function, grid, threads, smem, examples, scale, params, pdl):
        self._enqueue = _Enqueue(launch_fn, stream_fn, function, grid, threads, smem, pdl)
        self._key = [_meta(t, i not in _DESCALES) for i, t in enumerate(examples)]
        self._scale, self._default_scale = scale, 1.0 / math.sqrt(examples[0].shape[2])
        self._slots, self._live, self._maps, self._map_params = [], [], {}, []
        for j, (kind, *operands) in enumerate(params):
            if kind in _FIXED:
                self._slots.append(_FIXED[kind](*operands))
            elif kind in ("kmap", "vmap"):
                self._slots.append(ctypes.c_uint64())
                self._map_params.append((j, kind))
            elif kind in ("ptr", "stride"):
                i, d = operands[0], operands[1] if kind == "stride" else 0
                if not 0 <= i < len(examples) or kind == "stride" and (examples[i] is None or not 0 <= d < examples[i].dim()):
                    raise ValueError(f"Launch: params[{j}] names tensor {i} dim {d}, which the examples lack")
                if kind == "ptr" and len(operands) > 1 and (operands[1] <= 0 or operands[1] & (operands[1] - 1)):
                    raise ValueError(f"Launch: params[{j}]: aligned to {operands[1]} bytes; allowed: a power of two")
                self._slots.append(ctypes.c_uint64())
                self._live.append((j, kind, *operands))
            else:
                raise ValueError(f"Launch: params[{j}]: kind {kind} with its operands; allowed: u64, i32, f32, ptr, "
                                 "stride, kmap, vmap")
        self._params = (ctypes.c_void_p * len(params))(*map(ctypes.addressof, self._slots))

    def launch(self, *call) -> int:
        tensors = call[:8] + call[9:]
        try:
            if [_meta(t, i not in _DESCALES) for i, t in enumerate(tensors)] != self._key:
                return 0
            scale = self._default_scale if call[8] is None else float(call[8])
        except (AttributeError, TypeError, ValueError):  # not tensors, not a number
            return 0
        if scale != self._scale:
            return 0
        for j, kind, i, *operand in self._live:  # operand: a pointer's alignment, a stride's dim
            t = tensors[i]
            if kind == "stride":
                self._slots[j].value = t.stride(operand[0])
                continue
            self._slots[j].value = 0 if t is None else t.data_ptr()
            if operand and self._slots[j].value % operand[0]:
                return 0
        if self._map_params:
            maps = self._maps.get((tensors[1].data_ptr(), tensors[2].data_ptr()))
            if maps is None:
                return -1
            for j, kind in self._map_params:
                self._params[j] = maps[1] + (0 if kind == "kmap" else 128)
        self._enqueue(self._params)
        return 1

    def add_maps(self, k_ptr: int, v_ptr: int, k_map: bytes, v_map: bytes) -> None:
        if len(k_map) != 128 or len(v_map) != 128:
            raise ValueError("Launch.add_maps: a CUtensorMap is 128 bytes")
        if len(self._maps) >= 512:  # as launch.cpp's kMapsKept
            self._maps.clear()
        buf = ctypes.create_string_buffer(256 + 64)
        base = (ctypes.addressof(buf) + 63) & ~63  # a CUtensorMap's alignment
        ctypes.memmove(base, k_map + v_map, 256)
        self._maps[(k_ptr, v_ptr)] = (buf, base)


class PyPointerLaunch:
    """launch.cpp's PointerLaunch (see there for the arguments) in Python and ctypes."""

    def __init__(self, name, launch_fn, stream_fn, function, grid, threads, smem, params, pdl, keep):
        self._name, self._enqueue = name, _Enqueue(launch_fn, stream_fn, function, grid, threads, smem, pdl)
        self._slots, self._pointers, self._keep = [], [], keep
        for j, (kind, *operands) in enumerate(params):
            if kind in _FIXED and operands:
                self._slots.append(_FIXED[kind](operands[0]))
            elif kind == "ptr" and operands:
                i, align = operands[0], operands[1] if len(operands) > 1 else 1
                if i < 0 or align <= 0 or align & (align - 1):
                    raise ValueError(f"PointerLaunch: params[{j}]: argument {i} aligned to {align} bytes; allowed: "
                                     "an argument index >= 0 and a power of two")
                self._slots.append(ctypes.c_uint64())
                self._pointers.append((self._slots[-1], i, align))
            else:
                raise ValueError(f"PointerLaunch: params[{j}]: kind {kind} with its operands; allowed: u64, i32, "
                                 "f32, ptr")
        self._params = (ctypes.c_void_p * len(params))(*map(ctypes.addressof, self._slots))

    def launch(self, *tensors) -> None:
        for slot, i, align in self._pointers:
            try:
                slot.value = tensors[i].data_ptr()
            except (IndexError, AttributeError):
                raise TypeError(f"{self._name}: argument {i} must be a tensor") from None
            if slot.value % align:
                raise ValueError(f"{self._name}: argument {i} at {slot.value:#x}; allowed: a {align}-byte aligned "
                                 "address")
        self._enqueue(self._params)
