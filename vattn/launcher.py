"""Launch compiled Triton kernels without going through JITFunction.run on every call.

Why: `kernel[grid](*args, **kwargs)` re-derives the kernel's specialisation on every call (binds
~30 arguments, specialises each, builds the cache key as a string of the options, rebuilds launch
metadata and calls the empty launch hooks) before the C launcher runs; on an H200 host that is
27-57 us a launch, several times the launch itself, and vattn makes three launches per layer.

How: the first launch of a specialisation goes through the normal path, which compiles (or finds)
the binary and returns its CompiledKernel; that kernel's launcher, function handle and packed
metadata are kept under a key that determines the specialisation, and later launches with the same
key call the launcher directly (`CompiledKernel.run(gx, gy, gz, stream, function, packed_metadata,
launch_metadata, enter_hook, exit_hook, *args)`, the call JITFunction.run ends with in Triton 3.6
and 3.9) on the current torch CUDA stream, so launches are captured by CUDA graphs as before.

The key: the current device; every runtime argument by kind -- a tensor by (dtype, data pointer
divisible by 16), which is all Triton specialises a pointer on; an int by its value (a value
determines Triton's int specialisation: equal to 1, divisible by 16, i32/i64/u64); a bool by
value; a float by kind only (floats are never specialised); None as itself -- and the constexpr and
option kwargs by value. Anything else (another type, an unhashable value) takes the normal path.
The fast path is also left to the normal path when Triton's launch hooks are set (a profiler needs
their metadata), when knobs.runtime.debug is on or the kernel has pre-run hooks, under the
interpreter (TRITON_INTERPRET=1) and without CUDA. Any exception from the fast launcher falls back
to the normal path for that call. Compile-time knobs read from the environment (e.g. instrumentation
mode) are taken as fixed for the process.

Two entry points: `Kernel.launch(grid, args, kwargs)` derives the key on every call (used by the
standalone launch wrappers in vattn.kernel / vattn.planner); `Kernel.bind(args, kwargs, live)`
freezes every argument except the `live` tensors once, so a launch only reads their data pointers
(vattn.api keeps one binding per validated call signature).

A binding goes one step further once its 16-byte aligned specialisation has launched: it hands the
compiled kernel to vattn/native/launch.cpp's PointerLaunch, its parameters packed once (native_params:
the compiled signature's runtime arguments, then Triton's scratch pointers, checked against the PTX's
parameter list), so a call is one C function that reads the live pointers and calls cuLaunchKernelEx.
Why: on an H200 host the bound Triton launches of the plan and of the reduce took 6.8-10.3 us each,
against 4.2-5.9 for the Hopper main kernel's C++ launch with its nine-tensor check (run BG host,
benchmarks/h200-host-overhead.json). It is used only where the extension builds (Triton's own C
launcher otherwise), for a grid of the first launch's, on its device, without hooks or debug mode;
a misaligned pointer or any error sends that binding back to the path above for good.
"""

from __future__ import annotations

import functools
import re
import threading

_LOCK = threading.Lock()
_KERNELS: dict = {}
_ENTRY_CAP = 4096  # specialisations kept per kernel; past it the cache restarts (a safe, slow path)
_MISSING = object()
NATIVE_LAUNCH = True  # bindings take launch.cpp's PointerLaunch where they can (see the module docstring)


def kernel(fn) -> "Kernel":
    """The Kernel wrapping Triton function `fn` (one per function object)."""
    k = _KERNELS.get(fn)
    if k is None:
        with _LOCK:
            k = _KERNELS.setdefault(fn, Kernel(fn))
    return k


class _Env:
    """Triton/torch hooks the fast path reads, bound once (ok False where the fast path cannot run)."""

    def __init__(self):
        self.ok = False
        try:
            import torch
            import triton
            from triton import knobs
            from triton.runtime.jit import JITFunction

            self.JITFunction = JITFunction
            self.rt = knobs.runtime
            self.chain = getattr(knobs, "HookChain", None)
            if bool(knobs.runtime.interpret) or not torch.cuda.is_available():
                return
            self.device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
            self.stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
                lambda idx: torch.cuda.current_stream(idx).cuda_stream)
            self.version = triton.__version__
        except Exception:
            return
        self.ok = True

    def plain(self) -> bool:
        """No launch hooks (they would need launch metadata) and no debug mode."""
        rt = self.rt
        return not rt.debug and self.idle(rt.launch_enter_hook) and self.idle(rt.launch_exit_hook)

    def idle(self, hook) -> bool:
        return hook is None or (hook.__class__ is self.chain and not hook.calls)


_ENV: _Env | None = None


def _env() -> _Env:
    global _ENV
    if _ENV is None:
        _ENV = _Env()
    return _ENV


def arg_key(a):
    """The part of a runtime argument that decides Triton's specialisation, or _MISSING if unknown."""
    c = a.__class__
    if c is int:
        return a
    if c is float:
        return float
    if c is bool:
        return (bool, a)
    if a is None:
        return None
    ptr = getattr(a, "data_ptr", None)
    dtype = getattr(a, "dtype", None)
    if ptr is None or dtype is None:
        return _MISSING
    return (dtype, ptr() & 15 == 0)


def options_key(kwargs: dict):
    """kwargs (constexprs and launch options) as a hashable key."""
    return tuple(sorted(kwargs.items(), key=lambda kv: kv[0]))


def spec_key(device, args, kwargs) -> tuple | None:
    """The cache key of one launch: device, per-argument kinds, constexpr/option values (None: no key)."""
    keys = tuple(map(arg_key, args))
    if _MISSING in keys:
        return None
    try:
        key = (device, keys, options_key(kwargs))
        hash(key)
    except TypeError:
        return None
    return key


def _entry(compiled):
    """(launcher, function, packed metadata, direct, cooperative, pdl, compiled) of a CompiledKernel, or None
    if it lacks them; direct is the C launch of Triton 3.6 (see _direct) or None."""
    try:
        compiled._init_handles()
        run, function, meta = compiled.run, compiled.function, compiled.packed_metadata
    except Exception:
        return None
    if function is None or not callable(run):
        return None
    return (run, function, meta) + _direct(run) + (compiled,)


def _direct(run) -> tuple:
    """Triton 3.6's CudaLauncher.__call__ only allocates scratch memory (none for a kernel that needs none)
    and forwards to its C `launch` with the cooperative-grid and PDL flags inserted: call that directly
    when there is no scratch, one CTA per program and no tensor-descriptor wrapper. Other versions keep
    the __call__ (their layout differs). (None, 0, 0) when not applicable."""
    if not _env().version.startswith("3.6.") or type(run).__name__ != "CudaLauncher":
        return None, 0, 0
    try:
        if run.global_scratch_size or run.profile_scratch_size or getattr(run, "num_ctas", 1) != 1:
            return None, 0, 0
        launch = run.launch
        if type(launch).__name__ != "builtin_function_or_method":  # wrapped for tensor descriptors
            return None, 0, 0
        return launch, run.launch_cooperative_grid, run.launch_pdl
    except AttributeError:
        return None, 0, 0


# a runtime argument's Triton type -> PointerLaunch's kind for it, and its bytes in the kernel's parameters
_PACKED = {"i32": ("i32", 4), "u32": ("i32", 4), "i64": ("u64", 8), "u64": ("u64", 8), "fp32": ("f32", 4)}
_SCRATCH = ("global_scratch_size", "profile_scratch_size")  # Triton's pointers after the arguments, where it has them


def native_params(compiled, full: tuple, live_full: list, align: int = 16) -> list | None:
    """The parameters of launch.cpp's PointerLaunch for `compiled` called with `full` (every parameter in order,
    as Kernel.full_args; those at positions live_full are passed per call, as ("ptr", k, align)), or None where
    this launch is not one a PointerLaunch makes as Triton's launcher would: scratch memory, a cluster, a
    cooperative grid, a tensor descriptor, a runtime argument of another type than a pointer, i32, u32, i64, u64
    or fp32, or a parameter list that differs from the PTX's. Triton passes the runtime arguments that its
    signature does not make constexprs (ints equal to 1 and None among them), in order, then a null pointer for
    each scratch buffer its version declares (Triton 3.6 and 3.9: global, then profile)."""
    try:
        meta, src = compiled.metadata, compiled.src
        if (meta.num_ctas != 1 or meta.launch_cooperative_grid or getattr(meta, "tensordesc_meta", None)
                or meta.shared > 228 * 1024):
            return None
        names = list(src.fn.arg_names)
        index = lambda key: names.index(key) if isinstance(key, str) else key[0] if isinstance(key, tuple) else key
        signature = {index(k): ty for k, ty in src.signature.items()}
        constants = {index(k) for k in getattr(src, "constants", {})}
        params, widths = [], []
        for i in sorted(signature):
            ty = signature[i]
            if ty == "constexpr" or i in constants:
                continue
            if ty.startswith("*"):
                v = full[i]
                params.append(("ptr", live_full.index(i), align) if i in live_full else
                              ("u64", v if v.__class__ is int else v.data_ptr()))
                widths.append(8)
            elif ty in _PACKED and i not in live_full:
                kind, width = _PACKED[ty]
                params.append((kind, full[i]))
                widths.append(width)
            else:  # a type it does not pack, or a live argument that is not a pointer
                return None
        for size in _SCRATCH:
            if hasattr(meta, size):
                if getattr(meta, size):
                    return None
                params.append(("u64", 0))
                widths.append(8)
        return params if ptx_param_bytes(compiled.asm["ptx"], meta.name) == widths else None
    except Exception:
        return None


def ptx_param_bytes(ptx: str, name: str) -> list[int] | None:
    """The byte width of each parameter of kernel `name` in PTX text, in order (None: no such entry)."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    return None if m is None else [int(bits) // 8 for bits in re.findall(r"\.param\s+\.[bsuf](\d+)", m.group(1))]


def native_launch_type():
    """(launch.cpp's PointerLaunch type, cuLaunchKernelEx's address), or None where the extension cannot be built:
    Triton's own C launcher then stays (PointerLaunch's ctypes twin would swap one C launcher for Python work)."""
    types = _native_types()
    return types and (types[0].PointerLaunch, types[1])


def checked_launch_type():
    """(launch.cpp's Launch type, which checks a vattn.attention call's signature itself, cuLaunchKernelEx's
    address), or None where the extension cannot be built (its ctypes twin would be slower than the Python check)."""
    types = _native_types()
    return types and (types[0].Launch, types[1])


@functools.lru_cache(maxsize=None)
def _native_types():
    try:
        from vattn.native import cuda
        from vattn.native.launch import built_module

        mod = built_module(cuda.CACHE)
        if mod is None:
            return None
        return mod, cuda.launch_kernel_ex_address()
    except Exception:
        return None


def _call(e, g0, g1, g2, stream, args) -> None:
    """One launch through entry e (see _entry); hooks and launch metadata None (checked idle)."""
    if e[3] is None:
        e[0](g0, g1, g2, stream, e[1], e[2], None, None, None, *args)
    else:
        e[3](g0, g1, g2, stream, e[1], e[4], e[5], None, None, e[2], None, None, None, *args)


def _check_mode(fn, exc: Exception) -> None:
    """After a failed launch: triton.jit compiled or interpreted `fn` as TRITON_INTERPRET said when it decorated it
    (vattn.kernel's first import); set (or cleared) since, the launch fails inside Triton ('0 active drivers ([])'
    on a CPU), which this names instead."""
    import os

    from triton import knobs
    from triton.runtime.jit import JITFunction

    compiled = isinstance(fn, JITFunction)
    if compiled == bool(knobs.runtime.interpret):
        then = "unset" if compiled else "set"
        raise ValueError(f"TRITON_INTERPRET: got {os.environ.get('TRITON_INTERPRET')!r}; supported: its value when "
                         f"vattn's Triton kernels were first imported ({then} then): set TRITON_INTERPRET before "
                         "vattn is first imported (a fresh process), not after") from exc


class Kernel:
    """A Triton JITFunction with a cache of compiled launchers (see the module docstring)."""

    def __init__(self, fn):
        self.fn = fn
        env = _env()
        self.fast = env.ok and isinstance(fn, env.JITFunction)
        self._entries: dict = {}  # spec_key -> (launcher, function, packed metadata)
        self._bound: dict = {}  # Bound static key -> {launch key -> entry}
        if self.fast:
            params = fn.params
            self.names = tuple(p.name for p in params)
            self.constexpr = tuple(bool(p.is_constexpr) for p in params)
            # a constexpr left out of kwargs takes its default, as in JITFunction.run
            self.defaults = tuple(p.default if p.has_default else _MISSING for p in params)
            self.n_runtime = self.constexpr.count(False)

    # -- the normal path, and what it compiled --------------------------------------------------------
    def slow(self, grid, args, kwargs):
        try:
            return self.fn[grid](*args, **kwargs)
        except Exception as exc:
            _check_mode(self.fn, exc)
            raise

    def full_args(self, args, kwargs) -> tuple | None:
        """Every parameter in order (constexprs at their places, as JITFunction.run passes them to the
        launcher, which skips them; a defaulted one left out as its default), or None when args/kwargs do not
        name each one exactly once."""
        if len(args) != self.n_runtime:
            return None
        it = iter(args)
        out = []
        for name, is_c, default in zip(self.names, self.constexpr, self.defaults):
            if is_c:
                v = kwargs.get(name, default)
                if v is _MISSING:
                    return None
                out.append(v)
            else:
                if name in kwargs:
                    return None
                out.append(next(it))
        return tuple(out)

    def _remember(self, cache: dict, key, compiled) -> None:
        if key is None or compiled is None:
            return
        e = _entry(compiled)
        if e is not None:
            if len(cache) >= _ENTRY_CAP:
                cache.clear()
            cache[key] = e

    # -- generic entry point --------------------------------------------------------------------------
    def launch(self, grid, args: tuple, kwargs: dict):
        """fn[grid](*args, **kwargs), through the cached launcher when this specialisation ran before."""
        if not self.fast:
            return self.slow(grid, args, kwargs)
        env = _ENV
        dev = env.device()
        key = spec_key(dev, args, kwargs)
        e = self._entries.get(key) if key is not None else None
        if e is not None and not self.fn.pre_run_hooks and env.plain():
            full = self.full_args(args, kwargs)
            if full is not None:
                try:
                    g = tuple(grid) + (1, 1)
                    _call(e, g[0], g[1], g[2], env.stream(dev), full)
                    return None
                except Exception:
                    pass  # the normal path below launches (or raises its own error)
        compiled = self.slow(grid, args, kwargs)
        if key is not None and self.full_args(args, kwargs) is not None:
            self._remember(self._entries, key, compiled)
        return compiled

    # -- pre-bound entry point ------------------------------------------------------------------------
    def bind(self, args: tuple, kwargs: dict, live: tuple) -> "Bound":
        """Freeze args/kwargs except the tensors at positions `live` (indices into args), which each
        Bound.launch passes anew. The other tensors are held and their pointers frozen: they must not be
        moved or resized while the Bound lives (vattn: the workspace's own buffers)."""
        return Bound(self, tuple(args), dict(kwargs), tuple(live))


class Bound:
    """One kernel with every argument fixed but a few live tensors: launch(g0, g1, g2, *tensors).

    The caller guarantees that the live tensors have the dtypes they had at bind time and are on the
    current CUDA device (vattn.api checks both on every call, through the signature it keys its
    Bounds by); the launch reads their data pointers, whose alignment is part of the launch key."""

    def __init__(self, kernel: Kernel, args: tuple, kwargs: dict, live: tuple):
        # the live tensors are not kept: a binding outlives its first call's tensors (a KV cache among them)
        self.kernel, self.kwargs, self.live = kernel, kwargs, live
        self.args = tuple(None if i in live else a for i, a in enumerate(args))
        self.launch = self._slow_launch
        self.native = [False]
        self.adopted = None  # what _adopt built its PointerLaunch from (checked_launch builds from it too)
        full = kernel.full_args(args, kwargs) if kernel.fast else None
        if full is None or not live:
            return
        positions = []  # index of each runtime arg in the full (every-parameter) tuple
        for i, is_c in enumerate(kernel.constexpr):
            if not is_c:
                positions.append(i)
        live_full = [positions[i] for i in live]
        keys = []
        for i, a in enumerate(args):
            if i in live:
                if getattr(a, "data_ptr", None) is None:
                    return
                keys.append(("live", a.dtype))
            else:
                k = arg_key(a)
                if k is _MISSING:
                    return
                keys.append(k)
        try:
            static = (tuple(keys), options_key(kwargs))
            hash(static)
        except TypeError:
            return
        self.key = static
        self.entries = kernel._bound.setdefault(static, {})
        self.full = tuple(None if j in live_full else v for j, v in enumerate(full))  # keeps no live tensor
        self.live_full = live_full
        self.native = [None]  # its PointerLaunch's launch once adopted (_adopt); False: not to be tried (again)
        self.launch = self._generate(full, live_full)

    def _slow_launch(self, g0, g1, g2, *tensors):
        args = list(self.args)
        for i, t in zip(self.live, tensors):
            args[i] = t
        return self.kernel.slow((g0, g1, g2), args, self.kwargs)

    def _miss(self, key, g0, g1, g2, tensors):
        self.kernel._remember(self.entries, key, self._slow_launch(g0, g1, g2, *tensors))

    def _adopt(self, e, dev, g0, g1, g2) -> None:
        """Launch this binding's calls on `dev` with grid (g0, g1, g2) through a PointerLaunch of entry e's kernel
        (its 16-byte aligned specialisation) from now on, where native_params can pack it; tried once."""
        self.native[0] = False
        native = native_launch_type() if NATIVE_LAUNCH and g0 * g1 * g2 > 0 else None
        compiled = e[6]
        params = native and native_params(compiled, self.full, self.live_full)
        if not params:
            return
        pointer_launch, launch_fn = native
        meta = compiled.metadata
        try:
            launch = pointer_launch(meta.name, launch_fn, functools.partial(_ENV.stream, dev), e[1], (g0, g1, g2),
                                    32 * meta.num_warps, meta.shared, params, bool(meta.launch_pdl), self.args)
        except Exception:
            return
        self._ns.update(_ndev=dev, _ng0=g0, _ng1=g1, _ng2=g2)
        self.adopted = (e[1], (g0, g1, g2), 32 * meta.num_warps, meta.shared, params, bool(meta.launch_pdl), dev)
        self.native[0] = launch.launch

    def checked_launch(self, examples: tuple, scale: float, arg_of_live: tuple):
        """This binding's natively launched kernel as a launch.cpp Launch, which checks a vattn.attention call
        (examples, scale: the signature it accepts; see launch.cpp) and reads the k-th live tensor's pointer from
        the call's tensor argument arg_of_live[k]: launch(*call) -> 1 launched, 0 not this signature, not a plain
        launch (hooks or debug mode want Triton's launcher, as this binding's launch checks) or after a launch
        through it failed (that call raised). None until the binding has adopted its native launch, once that
        has failed, or without the extension."""
        types = checked_launch_type()
        if not self.native[0] or self.adopted is None or types is None:
            return None
        function, grid, threads, smem, params, pdl, dev = self.adopted
        params = [("ptr", arg_of_live[p[1]], *p[2:]) if p[0] == "ptr" else p for p in params]
        fast = types[0](types[1], functools.partial(_ENV.stream, dev), function, grid, threads, smem, examples,
                        scale, params, pdl).launch
        plain, fn, keep = _ENV.plain, self.kernel.fn, self.args  # keep: the frozen pointers' tensors
        failed = []

        def launch(*call) -> int:
            if failed or fn.pre_run_hooks or not plain():
                return 0
            try:
                return fast(*call)
            except Exception:  # raised to this call's caller; later calls take the checked path
                failed.append(True)
                raise

        launch.keep = keep
        return launch

    def _generate(self, full: tuple, live_full: list):
        """A launch function for this binding: once adopted (_adopt), the PointerLaunch for its grid and device;
        otherwise the live pointers read, the launch key is the device when all of them are 16-byte aligned,
        else (device, per-pointer alignment), and a miss or any error takes the normal path. Generated so that
        a call does no per-argument Python work (_call, inlined)."""
        n = len(live_full)
        ts = [f"t{i}" for i in range(n)]
        ps = [f"p{i}" for i in range(n)]
        env = _ENV
        ns = {"_device": env.device, "_stream": env.stream, "_rt": env.rt, "_chain": env.chain,
              "_entries": self.entries, "_miss": self._miss, "_fn": self.kernel.fn, "_native": self.native,
              "_adopt": self._adopt}
        self._ns = ns
        slots = []
        for j, v in enumerate(full):
            if j in live_full:
                slots.append(ps[live_full.index(j)])
            else:  # frozen: a held tensor (self.args keeps it alive) by its pointer, anything else as is
                ns[f"c{j}"] = v.data_ptr() if (v.__class__ is not int and callable(getattr(v, "data_ptr", None))) else v
                slots.append(f"c{j}")
        slots = ", ".join(slots)
        per = ", ".join(f"{p} & 15 == 0" for p in ps) + ("," if n == 1 else "")
        src = f"""
def launch(g0, g1, g2, {', '.join(ts)}):
    plain = (not _rt.debug and not _fn.pre_run_hooks
             and ((h := _rt.launch_enter_hook) is None or (h.__class__ is _chain and not h.calls))
             and ((h := _rt.launch_exit_hook) is None or (h.__class__ is _chain and not h.calls)))
    if plain and (native := _native[0]) and g0 == _ng0 and g1 == _ng1 and g2 == _ng2 and _device() == _ndev:
        try:
            native({', '.join(ts)})
            return
        except Exception:
            _native[0] = False
    {'; '.join(f'{p} = {t}.data_ptr()' for p, t in zip(ps, ts))}
    dev = _device()
    key = dev if not ({' | '.join(ps)}) & 15 else (dev, ({per}))
    e = _entries.get(key)
    if e is not None and plain:
        try:
            if e[3] is None:
                e[0](g0, g1, g2, _stream(dev), e[1], e[2], None, None, None, {slots})
            else:
                e[3](g0, g1, g2, _stream(dev), e[1], e[4], e[5], None, None, e[2], None, None, None, {slots})
        except Exception:
            e = None
        if e is not None:
            if _native[0] is None and key == dev:
                _adopt(e, dev, g0, g1, g2)
            return
    _miss(key, g0, g1, g2, ({', '.join(ts)},))
"""
        exec(compile(src, f"<vattn.launcher {getattr(self.kernel.fn, '__name__', '?')}>", "exec"), ns)
        return ns["launch"]
