"""vattn/native: launch.cpp's Launch and PointerLaunch, and their ctypes twins, below cuLaunchKernelEx (a recording
C function in its place: no GPU), and the fallback to the twins where the extension cannot be built."""

import shutil

import pytest


@pytest.fixture(scope="module")
def built_launch(tmp_path_factory):
    """vattn/native/launch.cpp built into a fresh cache (~20 s): the extension module."""
    pytest.importorskip("torch")
    from vattn.native import launch

    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        pytest.skip("needs a C++ compiler")
    return launch.module(tmp_path_factory.mktemp("launch"))


@pytest.fixture(params=["cpp", "python"])
def launch_type(request):
    """The C++ Launch and PyLaunch, its stand-in where the extension cannot be built: one contract."""
    torch = pytest.importorskip("torch")
    from vattn.native.launch import PyLaunch

    return torch, request.getfixturevalue("built_launch").Launch if request.param == "cpp" else PyLaunch


@pytest.fixture(params=["cpp", "python"])
def pointer_launch_type(request):
    """The C++ PointerLaunch and PyPointerLaunch: one contract."""
    torch = pytest.importorskip("torch")
    from vattn.native.launch import PyPointerLaunch

    return torch, request.getfixturevalue("built_launch").PointerLaunch if request.param == "cpp" else PyPointerLaunch


def _recording_driver(record, rc):
    """A C function in cuLaunchKernelEx's place: record(config, fn, params, extra) reads what a launch passes
    during the call; it returns rc[0]."""
    import ctypes

    from vattn.native.launch import _LaunchConfig

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                      ctypes.c_void_p)
    def driver(config, fn, params, extra):
        record(config.contents, fn, params, extra)
        return rc[0]

    return driver


@pytest.mark.parametrize("pdl", [True, False])
def test_launch_checks_the_calls_signature_and_fills_the_kernel_parameters(launch_type, pdl):
    """A Launch below cuLaunchKernelEx: a C function in its place records what the launch passes (read during
    the call). A call like the examples launches with their pointers and strides, the fixed values, the TMA
    maps and, with pdl, the programmatic-serialisation attribute; any other signature launches nothing; a
    driver error raises."""
    import ctypes

    torch, Launch = launch_type
    seen, rc = [], [0]
    spec = [("ptr", 0), ("u64", 2 ** 40 + 3), ("i32", -5), ("f32", 0.5), ("ptr", 7), ("stride", 8, 0), ("kmap",),
            ("vmap",)]

    def record(c, fn, params, extra):
        u64 = lambda j: ctypes.c_uint64.from_address(params[j]).value
        attrs = [(c.attrs[i].id, c.attrs[i].value) for i in range(c.num_attrs)]
        seen.append(dict(fn=fn, grid=tuple(c.grid), block=tuple(c.block), smem=c.smem, stream=c.stream, attrs=attrs,
                         q=u64(0), fixed=u64(1), i32=ctypes.c_int32.from_address(params[2]).value,
                         f32=ctypes.c_float.from_address(params[3]).value, vd=u64(4), out_stride=u64(5),
                         kmap=ctypes.string_at(params[6], 128), vmap=ctypes.string_at(params[7], 128), extra=extra))

    driver = _recording_driver(record, rc)

    q = torch.randn(8, 16, 256).to(torch.bfloat16)
    k, v = torch.zeros(10, 16, 1, 256, dtype=torch.float8_e4m3fn), torch.zeros(10, 16, 1, 256, dtype=torch.float8_e4m3fn)
    tables, lens, cu = torch.zeros(2, 5, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
    kd, out = torch.ones(1), torch.empty(8, 2, 16, 256, dtype=torch.bfloat16)[:, 0]  # out: token stride 8192
    call = [q, k, v, tables, lens, cu, kd, None, None, out]
    launch = Launch(ctypes.cast(driver, ctypes.c_void_p).value, lambda: 77, 1234, (1, 2, 1), 256, 1000,
                    tuple(call[:8]) + (out,), 256 ** -0.5, spec, pdl)
    assert launch.launch(*call) == -1 and seen == []  # no TMA maps for these caches yet
    launch.add_maps(k.data_ptr(), v.data_ptr(), bytes(range(128)), bytes(range(128, 256)))
    assert launch.launch(*call) == 1
    assert seen == [dict(fn=1234, grid=(1, 2, 1), block=(256, 1, 1), smem=1000, stream=77,
                         attrs=[(6, 1)] if pdl else [], q=q.data_ptr(), fixed=2 ** 40 + 3, i32=-5, f32=0.5, vd=0,
                         out_stride=8192, kmap=bytes(range(128)), vmap=bytes(range(128, 256)), extra=None)]
    assert launch.launch(*call[:8], 256 ** -0.5, out) == 1  # the scale None stands for, given explicitly
    others = {"q's shape": dict(q=q[:4]), "q's strides": dict(q=torch.empty(16, 8, 256, dtype=q.dtype).transpose(0, 1)),
              "q's dtype": dict(q=q.half()), "the caches": dict(k=k[:5]), "a descale": dict(kd=None),
              "the other descale": dict(vd=kd), "out's strides": dict(out=out.contiguous()), "no out": dict(out=None),
              "the scale": dict(scale=0.1), "a non-tensor": dict(tables=[[0] * 5] * 2)}
    names = ["q", "k", "v", "tables", "lens", "cu", "kd", "vd", "scale", "out"]
    for what, change in others.items():
        args = [change.get(n, a) for n, a in zip(names, call)]
        assert launch.launch(*args) == 0, what
    assert len(seen) == 2
    rc[0] = 1
    with pytest.raises(RuntimeError, match="cuLaunchKernelEx failed: CUresult 1"):
        launch.launch(*call)


def test_launch_refuses_a_parameter_it_cannot_fill(launch_type):
    torch, Launch = launch_type
    q = torch.zeros(8, 16, 256)
    examples = (q, q, q, q, q, q, None, None, q)
    with pytest.raises(ValueError, match=r"params\[1\]: kind u32 .*allowed: u64, i32, f32, ptr, stride, kmap, vmap"):
        Launch(0, lambda: 0, 0, (1, 1, 1), 128, 0, examples, 1.0, [("ptr", 0), ("u32", 1)], True)
    with pytest.raises(ValueError, match=r"params\[0\] names tensor 6 dim 0, which the examples lack"):
        Launch(0, lambda: 0, 0, (1, 1, 1), 128, 0, examples, 1.0, [("stride", 6, 0)], True)
    with pytest.raises(ValueError, match=r"params\[1\]: aligned to 12 bytes; allowed: a power of two"):
        Launch(0, lambda: 0, 0, (1, 1, 1), 128, 0, examples, 1.0, [("ptr", 0, 16), ("ptr", 1, 12)], True)


def test_a_launch_takes_a_pointer_off_its_alignment_for_another_signature(launch_type):
    """("ptr", i, align) (the Triton path's Launch: its binary assumes 16-byte aligned pointers): a call whose
    tensor i sits off that alignment is not this signature (0, nothing launched), whatever its shape."""
    import ctypes

    torch, Launch = launch_type
    seen, rc = [], [0]
    driver = _recording_driver(lambda c, fn, params, extra: seen.append(ctypes.c_uint64.from_address(params[0]).value),
                               rc)
    q, lens = torch.zeros(8, 16, 64), torch.zeros(5, dtype=torch.int32)
    call = [q, q, q, q, lens, q, None, None, None, q]
    launch = Launch(ctypes.cast(driver, ctypes.c_void_p).value, lambda: 0, 1, (1, 1, 1), 128, 0,
                    tuple(call[:8]) + (q,), 64 ** -0.5, [("ptr", 4, 16), ("u64", 3)], False)
    assert launch.launch(*call) == 1 and seen == [lens.data_ptr()]
    call[4] = torch.zeros(6, dtype=torch.int32)[1:]  # the same shape and strides, 4 bytes off
    assert launch.launch(*call) == 0 and len(seen) == 1


@pytest.mark.parametrize("pdl", [True, False])
def test_a_pointer_launch_fills_the_calls_addresses_beside_its_fixed_parameters(pointer_launch_type, pdl):
    """A PointerLaunch (the reduce's) below cuLaunchKernelEx: each call's tensors' data pointers go into their
    slots, the fixed values stay; a pointer off its alignment raises and launches nothing, as does a non-tensor;
    a driver error raises; the objects it keeps live as long as it does."""
    import ctypes
    import gc
    import weakref

    torch, PointerLaunch = pointer_launch_type
    seen, rc = [], [0]

    def record(c, fn, params, extra):
        u64 = lambda j: ctypes.c_uint64.from_address(params[j]).value
        seen.append(dict(fn=fn, grid=tuple(c.grid), block=tuple(c.block), smem=c.smem, stream=c.stream,
                         attrs=[(c.attrs[i].id, c.attrs[i].value) for i in range(c.num_attrs)],
                         fixed=u64(0), cu=u64(1), out=u64(2), i32=ctypes.c_int32.from_address(params[3]).value,
                         f32=ctypes.c_float.from_address(params[4]).value, extra=extra))

    driver = _recording_driver(record, rc)

    class Kept:
        pass

    kept = Kept()
    gone = weakref.ref(kept)
    spec = [("u64", 2 ** 40 + 3), ("ptr", 0), ("ptr", 1, 16), ("i32", -5), ("f32", 0.5)]
    launch = PointerLaunch("reduce(cu, out)", ctypes.cast(driver, ctypes.c_void_p).value, lambda: 77, 1234,
                           (3, 4, 5), 256, 0, spec, pdl, (kept,))
    del kept
    gc.collect()
    assert gone() is not None  # kept by the launch
    cu, out = torch.zeros(5, dtype=torch.int32), torch.zeros(4, 64, dtype=torch.bfloat16)
    assert launch.launch(cu, out) is None
    assert launch.launch(cu[1:], out[1]) is None  # other addresses: out's row 1 is 128 bytes on
    assert seen == [dict(fn=1234, grid=(3, 4, 5), block=(256, 1, 1), smem=0, stream=77,
                         attrs=[(6, 1)] if pdl else [], fixed=2 ** 40 + 3, cu=c.data_ptr(), out=o.data_ptr(), i32=-5,
                         f32=0.5, extra=None) for c, o in ((cu, out), (cu[1:], out[1]))]
    with pytest.raises(ValueError, match=r"reduce\(cu, out\): argument 1 at 0x[0-9a-f]+; allowed: a 16-byte aligned"):
        launch.launch(cu, out[0, 4:])  # 8 bytes on
    with pytest.raises(TypeError, match=r"reduce\(cu, out\): argument 0 must be a tensor"):
        launch.launch([0, 1], out)
    with pytest.raises(TypeError, match="argument 1 must be a tensor"):
        launch.launch(cu)
    assert len(seen) == 2
    rc[0] = 700
    with pytest.raises(RuntimeError, match="cuLaunchKernelEx failed: CUresult 700"):
        launch.launch(cu, out)
    del launch
    gc.collect()
    assert gone() is None


def test_a_pointer_launch_refuses_a_parameter_it_cannot_fill(pointer_launch_type):
    _, PointerLaunch = pointer_launch_type
    with pytest.raises(ValueError, match=r"params\[1\]: kind stride .*allowed: u64, i32, f32, ptr"):
        PointerLaunch("k", 0, lambda: 0, 0, (1, 1, 1), 128, 0, [("ptr", 0), ("stride", 0, 1)], True, None)
    with pytest.raises(ValueError, match=r"params\[0\]: argument 0 aligned to 12 bytes; allowed: .*power of two"):
        PointerLaunch("k", 0, lambda: 0, 0, (1, 1, 1), 128, 0, [("ptr", 0, 12)], True, None)


def test_a_launch_that_cannot_be_built_goes_through_ctypes_after_one_warning(monkeypatch, tmp_path):
    import warnings

    from vattn.native import launch

    def no_headers(cache):
        raise RuntimeError("Python.h: No such file or directory")

    monkeypatch.setattr(launch, "module", no_headers)
    with pytest.warns(UserWarning, match="C\\+\\+ kernel launches could not be built .*Python.h.*through ctypes"):
        assert launch.launch_type(tmp_path) is launch.PyLaunch
    with warnings.catch_warnings():  # asked again, for the reduce's or the Triton kernels': no second warning
        warnings.simplefilter("error")
        assert launch.launch_type(tmp_path) is launch.PyLaunch
        assert launch.pointer_launch_type(tmp_path) is launch.PyPointerLaunch
        assert launch.built_module(tmp_path) is None
