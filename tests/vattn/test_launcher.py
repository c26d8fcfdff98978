"""vattn.launcher (cached compiled launches) and vattn.api's per-signature checks, on a CPU.

The launch key must change whenever Triton would pick another binary (dtype, 16-byte alignment of a
pointer, an int's value and so its ==1 / %16 / width specialisation, a constexpr or launch option,
the device) and stay equal otherwise. The fast path runs here against a stand-in compiled kernel
(no GPU): what it hands the launcher, and when it must take the normal path instead.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import vattn
from vattn import launcher

from test_api import dev, planned  # noqa: F401  (dev: the fixture, CPU under the interpreter or the GPU)
from test_native import built_launch, pointer_launch_type  # noqa: F401  (fixtures: the C++ launch and its twin)


def _t(dtype=torch.float16, offset=0):
    return torch.zeros(64, dtype=dtype)[offset:]


def test_spec_key_changes_with_what_triton_specialises_on():
    a = _t()
    base = launcher.spec_key(0, (a, 32, 5, 0.5), dict(D=64, num_warps=4))
    assert base == launcher.spec_key(0, (_t(), 32, 5, 0.5), dict(D=64, num_warps=4))  # other tensor, same kind
    assert base == launcher.spec_key(0, (a, 32, 5, 0.25), dict(D=64, num_warps=4))  # floats: never specialised
    assert base == launcher.spec_key(0, (a, 32, 5, 0.5), dict(num_warps=4, D=64))  # kwarg order
    for changed in [
        (1, (_t(torch.bfloat16), 32, 5, 0.5), dict(D=64, num_warps=4)),  # dtype
        (1, (_t(offset=4), 32, 5, 0.5), dict(D=64, num_warps=4)),  # 8-byte offset: not 16-byte aligned
        (1, (a, 33, 5, 0.5), dict(D=64, num_warps=4)),  # no longer divisible by 16
        (1, (a, 32, 1, 0.5), dict(D=64, num_warps=4)),  # == 1 (a constexpr to Triton)
        (1, (a, 32, 2**31 + 5, 0.5), dict(D=64, num_warps=4)),  # i64
        (1, (a, 32, True, 0.5), dict(D=64, num_warps=4)),  # bool, equal to 1 in Python
        (1, (a, 32, 5, 1), dict(D=64, num_warps=4)),  # int where a float was
        (1, (a, 32, 5, 0.5), dict(D=128, num_warps=4)),  # constexpr
        (1, (a, 32, 5, 0.5), dict(D=64, num_warps=8)),  # launch option
        (1, (a, 32, 5, None), dict(D=64, num_warps=4)),  # None
    ]:
        key = launcher.spec_key(0, *changed[1:])
        assert key is not None and key != base, changed
    assert launcher.spec_key(1, (a, 32, 5, 0.5), dict(D=64, num_warps=4)) != base  # device
    assert launcher.spec_key(0, (a, [1]), {}) is None  # a kind it does not know: the normal path
    assert launcher.spec_key(0, (a,), dict(X=[1])) is None  # unhashable constexpr


class _Compiled:
    """A CompiledKernel stand-in: its launcher records what it is handed."""

    function = 7
    packed_metadata = (4, 1, 0)

    def __init__(self, calls, fail=False):
        self.calls, self.fail = calls, fail

    def _init_handles(self):
        pass

    def run(self, *args):
        if self.fail:
            raise RuntimeError("launch failed")
        self.calls.append(args)


@pytest.fixture
def fake(monkeypatch):
    """A CUDA-capable environment stand-in (device and stream are plain ints) and a JIT kernel whose
    normal path is recorded instead of compiled."""
    import triton
    from triton import knobs

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    @triton.jit
    def k(x_ptr, n, scale, y_ptr, BLOCK: "tl.constexpr"):  # noqa: F821
        pass

    state = dict(device=0, slow=[], fast=[], fail=False)

    class Env(launcher._Env):
        def __init__(self):
            self.ok, self.JITFunction, self.rt, self.chain = True, triton.runtime.jit.JITFunction, knobs.runtime, \
                knobs.HookChain
            self.device = lambda: state["device"]
            self.stream = lambda dev: 100 + dev
            self.version = "3.9.0"

    monkeypatch.setattr(launcher, "_ENV", Env())
    monkeypatch.setattr(launcher, "native_launch_type", lambda: None)  # Triton's launcher (the native fixture's)
    kern = launcher.Kernel(k)
    assert kern.fast

    def slow(self, grid, args, kwargs):
        state["slow"].append((grid, tuple(args), dict(kwargs)))
        return _Compiled(state["fast"], fail=state["fail"])

    monkeypatch.setattr(launcher.Kernel, "slow", slow)
    return kern, state


def test_launch_reuses_the_binary_only_for_the_same_key(fake):
    kern, st = fake
    x, y = _t(torch.float32), _t(torch.float32)
    kern.launch((2,), (x, 32, 0.5, y), dict(BLOCK=64, num_warps=4))
    assert len(st["slow"]) == 1 and not st["fast"]
    kern.launch((2,), (x, 32, 0.25, y), dict(BLOCK=64, num_warps=4))
    assert len(st["slow"]) == 1
    # every parameter in order, the constexpr at its place: what JITFunction.run hands the launcher
    assert st["fast"][-1] == (2, 1, 1, 100, 7, (4, 1, 0), None, None, None, x, 32, 0.25, y, 64)
    kern.launch((2,), (x, 48, 0.5, y), dict(BLOCK=64, num_warps=4))  # another int value: the normal path
    kern.launch((2,), (x[1:], 32, 0.5, y), dict(BLOCK=64, num_warps=4))  # misaligned pointer
    kern.launch((2,), (x.half(), 32, 0.5, y), dict(BLOCK=64, num_warps=4))  # dtype
    kern.launch((2,), (x, 32, 0.5, y), dict(BLOCK=128, num_warps=4))  # constexpr
    st["device"] = 1
    kern.launch((2,), (x, 32, 0.5, y), dict(BLOCK=64, num_warps=4))  # device
    assert len(st["slow"]) == 6 and len(st["fast"]) == 1


def test_bound_launch_reads_live_pointers_and_keys_their_alignment(fake):
    kern, st = fake
    x, y = _t(torch.float32), _t(torch.float32)
    b = kern.bind((x, 32, 0.5, y), dict(BLOCK=64), live=(0,))
    b.launch(3, 1, 1, x)
    b.launch(3, 1, 1, x)
    assert len(st["slow"]) == 1 and len(st["fast"]) == 1
    assert st["fast"][0] == (3, 1, 1, 100, 7, (4, 1, 0), None, None, None, x.data_ptr(), 32, 0.5, y.data_ptr(), 64)
    b.launch(3, 1, 1, x[1:])  # misaligned live pointer: another specialisation, through the normal path
    assert len(st["slow"]) == 2 and st["slow"][-1][1][0].data_ptr() == x[1:].data_ptr()
    b.launch(3, 1, 1, x[2:])  # misaligned again: now cached under its own key
    assert len(st["slow"]) == 2 and st["fast"][-1][9] == x[2:].data_ptr()
    # a binding with the same frozen kinds shares the binaries; another dtype does not
    assert kern.bind((x, 32, 0.7, _t(torch.float32)), dict(BLOCK=64), live=(0,)).entries is b.entries
    assert kern.bind((x.half(), 32, 0.5, y), dict(BLOCK=64), live=(0,)).key != b.key
    assert kern.bind((x, 32, 0.5, y.half()), dict(BLOCK=64), live=(0,)).key != b.key
    assert kern.bind((x, 16, 0.5, y), dict(BLOCK=64), live=(0,)).key != b.key
    assert kern.bind((x, 32, 0.5, y), dict(BLOCK=32), live=(0,)).key != b.key


def test_a_constexpr_left_at_its_default_still_binds(fake):
    # vattn's reduce leaves PDL (default False) out when it is not taken: that binding must take the fast path
    # too (it fell to the normal path on every call, ~25 us of host time on an H200)
    import triton

    @triton.jit
    def k2(x_ptr, n, BLOCK: "tl.constexpr", PDL: "tl.constexpr" = False):  # noqa: F821
        pass

    _, st = fake
    kern = launcher.Kernel(k2)
    x = _t(torch.float32)
    b = kern.bind((x, 32), dict(BLOCK=64), live=(0,))
    b.launch(3, 1, 1, x)
    b.launch(3, 1, 1, x)
    assert len(st["slow"]) == 1 and st["fast"] == [(3, 1, 1, 100, 7, (4, 1, 0), None, None, None, x.data_ptr(), 32,
                                                     64, False)]
    assert kern.bind((x, 32), dict(BLOCK=64, PDL=True), live=(0,)).key != b.key


def test_fast_path_steps_aside(fake, monkeypatch):
    from triton import knobs

    kern, st = fake
    x, y = _t(torch.float32), _t(torch.float32)
    b = kern.bind((x, 32, 0.5, y), dict(BLOCK=64), live=(0, 3))
    b.launch(1, 1, 1, x, y)
    b.launch(1, 1, 1, x, y)
    assert (len(st["slow"]), len(st["fast"])) == (1, 1)
    hook = lambda meta: None  # noqa: E731  a profiler's: it needs the normal path's launch metadata
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        b.launch(1, 1, 1, x, y)
        kern.launch((1,), (x, 32, 0.5, y), dict(BLOCK=64))
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert (len(st["slow"]), len(st["fast"])) == (3, 1)
    monkeypatch.setattr(knobs.runtime, "debug", True)
    b.launch(1, 1, 1, x, y)
    assert (len(st["slow"]), len(st["fast"])) == (4, 1)
    monkeypatch.setattr(knobs.runtime, "debug", False)
    st["fail"] = True  # a launcher that raises: that call goes through the normal path
    b2 = kern.bind((x, 64, 0.5, y), dict(BLOCK=64), live=(0, 3))
    b2.launch(1, 1, 1, x, y)
    b2.launch(1, 1, 1, x, y)
    assert (len(st["slow"]), len(st["fast"])) == (6, 1)


def test_interpreter_and_cpu_take_the_normal_path(monkeypatch):
    calls = []

    class Fn:
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append((grid, a, kw))

    kern = launcher.Kernel(Fn())  # not a JITFunction (the interpreter's), or no CUDA: never fast
    assert not kern.fast
    kern.launch((1, 1, 1), (1, 2), dict(B=3))
    kern.bind((torch.zeros(2), 2), dict(B=3), live=(0,)).launch(4, 1, 1, torch.ones(2))
    assert [c[0] for c in calls] == [(1, 1, 1), (4, 1, 1)] and calls[1][1][0].tolist() == [1.0, 1.0]


def test_attention_checks_once_per_signature(dev, monkeypatch):  # noqa: F811
    from vattn import checks as vattn_checks

    launches, checks = [], []
    monkeypatch.setattr(launcher.Kernel, "slow", lambda self, grid, args, kwargs: launches.append(grid))
    real_check = vattn_checks.attention_args
    monkeypatch.setattr(vattn_checks, "attention_args", lambda *a: checks.append(1) or real_check(*a))
    x, pl = planned(dev)
    vattn.attention(**x, plan=pl)
    vattn.attention(**x, plan=pl)
    assert len(checks) == 1 and len(pl.calls) == 1
    if dev == "cpu":  # the interpreter always takes the normal path; on a GPU, earlier tests' binaries are reused
        assert len(launches) == 4  # main + reduce, twice
    x2 = dict(x, block_tables=torch.zeros(2, 7, dtype=torch.int32, device=dev))  # another stride: checked
    vattn.attention(**x2, plan=pl)
    assert len(checks) == 2 and len(pl.calls) == 2
    # after a checked call, a changed tensor is still refused with its field, value and what is allowed
    for change, match in [
        (dict(q=x["q"].float()), r"q.dtype: got torch.float32"),
        (dict(q=x["q"].transpose(1, 2).contiguous().transpose(1, 2)), r"q.stride: got \(1024, 1, 8\)"),
        (dict(block_tables=x["block_tables"].long()), r"block_tables: got torch.int64"),
        (dict(seq_lens=x["seq_lens"][:1]), r"seq_lens.shape: got \(1,\)"),
        (dict(k_descale=None), r"k_descale: got None"),
        (dict(v_descale=torch.ones(2, device=dev)), r"v_descale: got torch.float32 numel=2"),
        (dict(softmax_scale=-1.0), r"softmax_scale: got -1.0"),
        (dict(k_cache=x["k_cache"].to(torch.bfloat16)), r"k_cache.dtype: got torch.bfloat16"),
    ]:
        with pytest.raises(ValueError, match=match):
            vattn.attention(**dict(x, **change), plan=pl)
    if dev == "cpu":
        with pytest.raises(ValueError, match=r"seq_lens.device: got meta"):
            vattn.attention(**dict(x, seq_lens=x["seq_lens"].to("meta")), plan=pl)


def test_plan_checks_once_per_signature(dev, monkeypatch):  # noqa: F811
    from vattn import checks

    x, pl = planned(dev)
    ws = pl.workspace
    assert len(ws.plan_calls) == 1
    calls = []
    real = checks.int_vector
    monkeypatch.setattr(checks, "int_vector", lambda *a: calls.append(a[0]) or real(*a))
    monkeypatch.setattr(launcher.Kernel, "slow", lambda self, grid, args, kwargs: None)
    again = vattn.plan(x["seq_lens"], x["cu_seqlens_q"], num_kv_heads=2, page_size=16, workspace=ws)
    assert again is pl and not calls
    with pytest.raises(ValueError, match=r"seq_lens.dtype: got torch.int64"):
        vattn.plan(x["seq_lens"].long(), x["cu_seqlens_q"], num_kv_heads=2, page_size=16, workspace=ws)
    with pytest.raises(ValueError, match=r"num_kv_heads: got 4"):
        vattn.plan(x["seq_lens"], x["cu_seqlens_q"], num_kv_heads=4, page_size=16, workspace=ws)
    with pytest.raises(ValueError, match=r"cu_seqlens_q.shape: got \(2,\)"):
        vattn.plan(x["seq_lens"], x["cu_seqlens_q"][:2], num_kv_heads=2, page_size=16, workspace=ws)


def test_a_binding_keeps_no_live_tensor(fake):
    import gc
    import weakref

    kern, st = fake
    x, y = _t(torch.float32), _t(torch.float32)
    b = kern.bind((x, 32, 0.5, y), dict(BLOCK=64), live=(0,))
    b.launch(1, 1, 1, x)
    ref = weakref.ref(x)
    del x
    st["slow"].clear()  # the stand-in normal path's record of the first launch
    gc.collect()
    assert ref() is None and b.args[3] is y  # the frozen one is held: its pointer is baked in


# -- the native launch: a bound kernel through launch.cpp's PointerLaunch -------------------------------------

def _jit_kernel():
    """A kernel with a runtime argument of each kind native_params packs, and two that Triton makes constexprs."""
    import triton
    import triton.language as tl

    @triton.jit
    def k(x_ptr, n, big, one, scale, y_ptr, nothing, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs) * scale + n + big + one)

    return k


def test_native_params_follow_the_ptx_triton_compiles(monkeypatch):
    """native_params against a real sm_90 compile (no GPU needed): the runtime arguments in order (an int equal
    to 1 and None are constexprs to Triton, so not parameters), i64 in 8 bytes, then the two scratch pointers;
    the PTX must agree, so a signature that does not is refused, as is what a PointerLaunch cannot pack."""
    from types import SimpleNamespace

    from sm90_compile import compile_as_jit

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    k = _jit_kernel()
    x, y = _t(torch.float32), _t(torch.float32)
    args = (x, 5, 2**40, 1, 0.5, y, None)
    compiled = compile_as_jit(k, args, dict(BLOCK=64))
    full = args + (64,)
    assert launcher.ptx_param_bytes(compiled.asm["ptx"], compiled.metadata.name) == [8, 4, 8, 4, 8, 8, 8]
    assert launcher.native_params(compiled, full, [0]) == [
        ("ptr", 0, 16), ("i32", 5), ("u64", 2**40), ("f32", 0.5), ("u64", y.data_ptr()), ("u64", 0), ("u64", 0)]
    assert launcher.native_params(compiled, full, [5, 0]) == [
        ("ptr", 1, 16), ("i32", 5), ("u64", 2**40), ("f32", 0.5), ("ptr", 0, 16), ("u64", 0), ("u64", 0)]
    assert launcher.native_params(compiled, full, [1]) is None  # a live argument that is not a pointer

    def variant(signature=None, **meta):
        signature = signature or compiled.src.signature
        src = SimpleNamespace(fn=compiled.src.fn, signature=signature, constants={
            path: v for path, v in compiled.src.constants.items() if signature[k.arg_names[path[0]]] == "constexpr"})
        return SimpleNamespace(src=src, metadata=compiled.metadata._replace(**meta), asm=compiled.asm)

    assert launcher.native_params(variant(), full, [0]) is not None  # the stand-in itself packs
    # the PTX disagrees: `one` said to be a runtime i32, or `big` an i32
    assert launcher.native_params(variant(compiled.src.signature | dict(one="i32")), full, [0]) is None
    assert launcher.native_params(variant(compiled.src.signature | dict(big="i32")), full, [0]) is None
    for refused in [dict(signature=compiled.src.signature | dict(scale="bf16")), dict(global_scratch_size=64),
                    dict(profile_scratch_size=8), dict(num_ctas=2), dict(launch_cooperative_grid=True)]:
        sig = refused.pop("signature", None)
        assert launcher.native_params(variant(sig, **refused), full, [0]) is None, (sig, refused)


def test_vattns_triton_kernels_pack_for_a_native_launch():
    """The plan, reduce and main kernels, compiled as vattn binds them (a subprocess: they must be JITFunctions),
    pack as a PointerLaunch: every parameter the PTX has, the live tensors' pointers at their places."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[2]), env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, str(Path(__file__).with_name("sm90_compile.py"))], capture_output=True,
                         text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    kernels = json.loads(res.stdout)
    assert set(kernels) == {"plan", "reduce", "main"}
    for name, k in kernels.items():
        assert k["params"] is not None, name
        widths = [8 if kind in ("u64", "ptr") else 4 for kind, *_ in k["params"]]
        assert widths == k["ptx"], name
        live = [rest[0] for kind, *rest in k["params"] if kind == "ptr"]
        assert live == list(range(len(k["live"]))), name  # each live tensor once, in the binding's order
        assert k["params"][-2:] == [["u64", 0], ["u64", 0]], name  # Triton's scratch pointers, null
    assert kernels["reduce"]["params"][0] == ["u64", "frozen"]  # the partials, bound once


@pytest.fixture
def native(fake, monkeypatch, pointer_launch_type):
    """The fake environment with launch.cpp's PointerLaunch (and its ctypes twin) as the native launch, a recording
    C function in cuLaunchKernelEx's place, and the stand-in compiled kernel carrying a real sm_90 compile of the
    fixture's kernel (its signature, metadata and PTX)."""
    import ctypes

    from sm90_compile import compile_as_jit
    from test_native import _recording_driver

    kern, st = fake
    _, PointerLaunch = pointer_launch_type
    x, y = _t(torch.float32), _t(torch.float32)
    real = compile_as_jit(kern.fn, (x, 32, 0.5, y), dict(BLOCK=64))
    st["driver"], st["rc"] = [], [0]

    def record(c, fn, params, extra):
        u64 = lambda j: ctypes.c_uint64.from_address(params[j]).value
        st["driver"].append(dict(fn=fn, grid=tuple(c.grid), block=c.block[0], stream=c.stream, x=u64(0),
                                 n=ctypes.c_int32.from_address(params[1]).value,
                                 scale=ctypes.c_float.from_address(params[2]).value, y=u64(3)))

    driver = _recording_driver(record, st["rc"])
    st["keep"] = driver
    monkeypatch.setattr(launcher, "native_launch_type",
                        lambda: (PointerLaunch, ctypes.cast(driver, ctypes.c_void_p).value))
    monkeypatch.setattr(_Compiled, "src", real.src, raising=False)
    monkeypatch.setattr(_Compiled, "metadata", real.metadata, raising=False)
    monkeypatch.setattr(_Compiled, "asm", real.asm, raising=False)
    return kern, st


def test_a_binding_launches_natively_once_its_aligned_binary_has_launched(native):
    kern, st = native
    x, y = _t(torch.float32), _t(torch.float32)
    b = kern.bind((x, 32, 0.5, y), dict(BLOCK=64), live=(0,))
    b.launch(3, 1, 1, x)  # compiles (the normal path)
    b.launch(3, 1, 1, x)  # Triton's launcher, then the binding takes a PointerLaunch
    assert (len(st["slow"]), len(st["fast"]), st["driver"]) == (1, 1, [])
    x2 = _t(torch.float32)
    b.launch(3, 1, 1, x2)
    assert len(st["fast"]) == 1
    assert st["driver"] == [dict(fn=7, grid=(3, 1, 1), block=128, stream=100, x=x2.data_ptr(), n=32, scale=0.5,
                                 y=y.data_ptr())]
    b.launch(4, 1, 1, x2)  # another grid: Triton's launcher
    assert (len(st["fast"]), len(st["driver"])) == (2, 1)


def test_a_native_launch_steps_aside_for_hooks_and_gives_way_for_good_on_an_error(native, monkeypatch):
    from triton import knobs

    kern, st = native
    x, y = _t(torch.float32), _t(torch.float32)
    b = kern.bind((x, 32, 0.5, y), dict(BLOCK=64), live=(0,))
    for _ in range(3):
        b.launch(3, 1, 1, x)
    assert (len(st["slow"]), len(st["fast"]), len(st["driver"])) == (1, 1, 1)
    hook = lambda meta: None  # noqa: E731  a profiler's: the normal path, with its launch metadata
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        b.launch(3, 1, 1, x)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    monkeypatch.setattr(knobs.runtime, "debug", True)
    b.launch(3, 1, 1, x)
    monkeypatch.setattr(knobs.runtime, "debug", False)
    assert (len(st["slow"]), len(st["fast"]), len(st["driver"])) == (3, 1, 1)
    b.launch(3, 1, 1, x)
    assert len(st["driver"]) == 2
    b.launch(3, 1, 1, x[1:])  # misaligned: the PointerLaunch refuses it; this call and the rest go to Triton
    assert (len(st["slow"]), len(st["driver"])) == (4, 2) and st["slow"][-1][1][0].data_ptr() == x[1:].data_ptr()
    b.launch(3, 1, 1, x)
    assert (len(st["fast"]), len(st["driver"])) == (2, 2)
    b2 = kern.bind((x, 48, 0.5, y), dict(BLOCK=64), live=(0,))
    for _ in range(3):
        b2.launch(3, 1, 1, x)
    assert len(st["driver"]) == 3
    st["rc"][0] = 1  # the driver fails: that call and the rest through Triton's launcher
    b2.launch(3, 1, 1, x)
    b2.launch(3, 1, 1, x)
    assert (len(st["driver"]), len(st["fast"]), b2.native[0]) == (4, 5, False)


def test_a_checked_launch_checks_the_call_and_launches_the_adopted_kernel(native, built_launch, monkeypatch):
    """Bound.checked_launch (vattn.attention's shortcut on the Triton path): the adopted kernel as launch.cpp's
    Launch, which takes a call of its examples' signature and reads the live tensor's pointer from the named
    argument; another shape, a misaligned pointer, a hook or debug mode: 0, nothing launched. None before the
    binding has adopted its native launch and after that has failed."""
    from triton import knobs

    kern, st = native
    monkeypatch.setattr(launcher, "checked_launch_type", lambda: (built_launch.Launch, launcher.native_launch_type()[1]))
    x, y = _t(torch.float32), _t(torch.float32)
    b = kern.bind((x, 32, 0.5, y), dict(BLOCK=64), live=(0,))
    q, pages = torch.zeros(4, 2, 8), torch.zeros(3, 16, 1, 8)
    i32 = lambda *shape: torch.zeros(*shape, dtype=torch.int32)  # noqa: E731
    examples = (q, pages, pages, i32(1, 4), x, i32(2), None, None, torch.zeros_like(q))

    def call(live, q=q, scale=0.125):  # vattn.attention's order: the scale before out
        return (q, pages, pages, examples[3], live, examples[5], None, None, scale, examples[8])

    assert b.checked_launch(examples, 0.125, (4,)) is None  # not adopted yet
    for _ in range(2):
        b.launch(3, 1, 1, x)
    launch = b.checked_launch(examples, 0.125, (4,))
    x2 = _t(torch.float32)
    assert launch(*call(x2)) == 1
    assert st["driver"] == [dict(fn=7, grid=(3, 1, 1), block=128, stream=100, x=x2.data_ptr(), n=32, scale=0.5,
                                 y=y.data_ptr())]
    assert launch(*call(x2, q=torch.zeros(5, 2, 8))) == 0  # another shape
    assert launch(*call(x2, scale=0.25)) == 0  # another scale
    assert launch(*call(torch.zeros(65)[1:])) == 0  # the same signature, 4 bytes off the binary's 16
    hook = lambda meta: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert launch(*call(x2)) == 0  # a profiler's hook wants Triton's launcher and its metadata
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    monkeypatch.setattr(knobs.runtime, "debug", True)
    assert launch(*call(x2)) == 0
    monkeypatch.setattr(knobs.runtime, "debug", False)
    assert len(st["driver"]) == 1
    st["rc"][0] = 1
    with pytest.raises(RuntimeError):
        launch(*call(x2))
    st["rc"][0] = 0
    assert launch(*call(x2)) == 0 and len(st["driver"]) == 2  # failed once: not tried again
    st["rc"][0] = 1
    b.launch(3, 1, 1, x2)  # the binding's own native launch fails too: Triton's launcher for good
    assert b.native[0] is False and b.checked_launch(examples, 0.125, (4,)) is None


def test_without_the_extension_a_binding_keeps_tritons_launcher(fake, monkeypatch):
    kern, st = fake
    monkeypatch.setattr(launcher, "native_launch_type", lambda: None)
    x, y = _t(torch.float32), _t(torch.float32)
    b = kern.bind((x, 32, 0.5, y), dict(BLOCK=64), live=(0,))
    for _ in range(3):
        b.launch(3, 1, 1, x)
    assert (len(st["slow"]), len(st["fast"]), b.native[0]) == (1, 2, False)


def test_triton_interpret_set_after_the_kernels_were_decorated_is_named():
    """triton.jit fixes compile-or-interpret when vattn.kernel first loads: TRITON_INTERPRET set later used to end
    in Triton's 'RuntimeError: 0 active drivers ([])' at launch."""
    code = ("import os, torch, vattn, vattn.kernel\n"
            "os.environ['TRITON_INTERPRET'] = '1'\n"
            "ws = vattn.Workspace(head_dim=64, num_q_heads=4, num_kv_heads=2, kv_dtype=torch.float16, "
            "q_dtype=torch.float16, page_size=16, max_q_len=4, max_batch=2, device='cpu')\n"
            "i32 = dict(dtype=torch.int32)\n"
            "lens, cu = torch.tensor([20, 5], **i32), torch.tensor([0, 1, 2], **i32)\n"
            "pl = vattn.plan(lens, cu, num_kv_heads=2, page_size=16, workspace=ws)\n"
            "kv = torch.zeros(4, 16, 2, 64).half()\n"
            "try:\n"
            "    vattn.attention(torch.zeros(2, 4, 64).half(), kv, kv, torch.zeros(2, 2, **i32), lens, cu, plan=pl)\n"
            "except ValueError as e:\n"
            "    print(e)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])  # this tree's vattn
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("TRITON_INTERPRET: got '1'; supported: its value when vattn's Triton kernels were "
                                  "first imported (unset then): set TRITON_INTERPRET before vattn is first imported"), \
        proc.stdout + proc.stderr[-2000:]
