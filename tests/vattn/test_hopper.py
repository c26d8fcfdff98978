"""The Hopper main kernel (vattn/hopper): its generated source compiles for sm_90a wherever nvcc is, and on an
sm_90 GPU its partials, merged by vattn's reduce, match vattn.reference on ragged batches."""

import dataclasses
import re
import shutil
import warnings

import pytest

from test_native import _recording_driver, built_launch, pointer_launch_type  # noqa: F401  (fixtures)

from vattn.hopper import build
from vattn.native import cuda


def test_source_has_both_wgmma_wrappers_with_full_operand_lists():
    src = build.source(HEAD_DIM=256, GQA=16, PAGE=16)
    assert "@WGMMA_WRAPPERS@" not in src
    # m64n64 writes 32 accumulators, m64n256 128; the A fragments and descriptors follow them
    assert "m64n64k16.f32.f16.f16 {%0, %1," in src and "%31}, %32, %33, p, 1, 1, 0, 0" in src
    assert "m64n256k16.f32.f16.f16 {%0," in src and "%127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1" in src
    assert "m64n128k16.f32.f16.f16 {%0," in src and "%63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1" in src
    assert "m64n128k32.f32.e4m3.e4m3 {%0," in src and "%63}, %64, %65, p, 1, 1" in src
    assert "m64n64k16.f32.bf16.bf16 {%0," in src and "m64n256k16.f32.bf16.bf16 {%0," in src


# the kernels: vattn_main_sm90 with S(i + 1) issued behind P(i).V (the default) or with FlashAttention-3's
# overlap, and vattn_main_sm90_k8 (K as e4m3 operands, pages by TMA; that overlap). One cubin holds both kernels,
# and with KV16 vattn_main_sm90_kv16 too (bf16 caches: K and V by TMA as the wgmmas read them).
# PROBES: opt-in variants kept for measurement (k8cp: the k8 kernel with pages by cp.async; slower, NOTES P20;
# k8direct: the result stored from the accumulators, as where out's rows are not 16-byte aligned; NOTES P37;
# the bulk-copy variants of the result's store and Q's load were measured and removed, P40).
SCHEDULES = {"serial": {}, "overlap": {"OVERLAP": 1}, "k8": {"K8": 1}, "kv16": {"KV16": 1}}
PROBES = {"k8cp": {"K8": 1, "K8_CPASYNC": 1}, "k8direct": {"K8": 1, "STAGE_OUT": 0}}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("partials", ["fp32", "bf16"])
@pytest.mark.parametrize("schedule", sorted(SCHEDULES | PROBES))
def test_compiles_for_sm90a_without_spills_or_serialised_wgmma(tmp_path, monkeypatch, schedule, partials):
    monkeypatch.setattr(cuda, "CACHE", tmp_path)
    bf16 = {"PARTIAL_BF16": 1} if partials == "bf16" else {}
    cubin = build.compile_cubin(dict(HEAD_DIM=256, GQA=16, PAGE=16) | (SCHEDULES | PROBES)[schedule] | bf16)
    report = cuda.ptxas_report(cubin).read_text()
    assert cubin.stat().st_size > 0
    # vattn_main_sm90, vattn_main_sm90_k8 (and vattn_main_sm90_kv16)
    kernels = 3 if "KV16" in (SCHEDULES | PROBES)[schedule] else 2
    assert report.count("Compiling entry function") == kernels, report
    assert report.count("0 bytes spill stores, 0 bytes spill loads") == kernels, report
    # C7513: ptxas had to wait for each wgmma before the next instruction, which undoes the overlap
    assert "C7513" not in report and "serialized" not in report, report


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("defines", [dict(HEAD_DIM=256, GQA=16, PAGE=16, KV16=1),
                                     dict(HEAD_DIM=128, GQA=8, PAGE=16, K8=1, BLOCK_N=128, K8_CONSUMERS=2),
                                     dict(HEAD_DIM=256, GQA=16, PAGE=4)], ids=["hd256", "hd128", "page4"])
def test_no_kernel_reads_global_memory_before_it_waits_for_the_kernel_before_it(tmp_path, monkeypatch, defines):
    """The main kernels launch as programmatic dependents: a load ahead of griddepcontrol.wait (SASS ACQBULK)
    could read a plan, Q or cache the kernel before is still writing. nvcc moves ld.global.nc (LDG.E.CONSTANT:
    `const __restrict__` inputs, __ldg) across the wait, so none may be left at all."""
    import subprocess

    from benchmarks.kernel.sass import _tool

    monkeypatch.setattr(cuda, "CACHE", tmp_path)
    sass = subprocess.run([_tool("cuobjdump"), "-sass", str(build.compile_cubin(defines))], capture_output=True,
                          text=True, check=True).stdout
    functions = dict(re.findall(r"Function : (\w+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S))
    assert functions, sass[:2000]
    for name, code in functions.items():
        ops = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", code)
        waits = [int(at, 16) for at, op in ops if op == "ACQBULK"]
        loads = [(int(at, 16), op) for at, op in ops if op.startswith(("LDG", "LD."))]
        assert len(waits) == 1 and loads, (name, waits, len(loads))
        assert [op for at, op in loads if at < waits[0]] == [], name
        assert [op for _, op in loads if "CONSTANT" in op] == [], name


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_page_of_4_tokens_builds_the_default_kernel_alone(tmp_path, monkeypatch):
    # the k8 kernel's TMA boxes need pages of whole 8-row swizzle atoms; the backend also takes pages of 4
    monkeypatch.setattr(cuda, "CACHE", tmp_path)
    report = cuda.ptxas_report(build.compile_cubin(dict(HEAD_DIM=256, GQA=16, PAGE=4))).read_text()
    assert "entry function 'vattn_main_sm90' " in report and "vattn_main_sm90_k8" not in report, report


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("block_n, consumers, gqa", [(64, 1, 8), (128, 1, 8), (128, 2, 8), (128, 2, 7)])
def test_head_dim_128_builds_the_tma_kernel_alone_without_spills(tmp_path, monkeypatch, block_n, consumers, gqa):
    monkeypatch.setattr(cuda, "CACHE", tmp_path)
    defines = dict(HEAD_DIM=128, GQA=gqa, PAGE=16, K8=1, BLOCK_N=block_n, K8_CONSUMERS=consumers)
    report = cuda.ptxas_report(build.compile_cubin(defines)).read_text()
    assert "entry function 'vattn_main_sm90_k8' " in report and "entry function 'vattn_main_sm90' " not in report
    assert "0 bytes spill stores, 0 bytes spill loads" in report, report
    assert "C7513" not in report and "serialized" not in report, report


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("defines", [dict(K8=1), dict(KV16=1), dict(K8=1, HEAD_DIM=128, GQA=8, K8_CONSUMERS=2)])
def test_every_kernel_of_a_build_exports_its_launch_shape(tmp_path, monkeypatch, defines):
    # MainSm90 launches with the shared memory and threads the source computes (`<kernel>_launch`), read from the
    # loaded module: a build whose kernel lacks it could not be launched
    monkeypatch.setattr(cuda, "CACHE", tmp_path)
    cubin = build.compile_cubin(dict(HEAD_DIM=256, GQA=16, PAGE=16) | defines)
    kernels = re.findall(r"Compiling entry function '(\w+)'", cuda.ptxas_report(cubin).read_text())
    assert kernels
    image = cubin.read_bytes()
    for name in kernels:
        assert f"{name}_launch".encode() + b"\0" in image, name


# head_dim 256's measurement builds (benchmarks/NOTES.md, "Next GPU session"): S on m64n128k32 (one fp16 V stage
# beside 2 slots of 64 KB); two consumer warpgroups with two fp16 V stages each (also with clock stamps of both
# warpgroups' loop iterations), and taking turns to issue on 3 slots; the chain softmax scaling each score
# before its maxima (the default until session 20); each wgmma descriptor rebuilt from its address (K8_DESC_ADD=0,
# the default until session 22); the main kernel making balanced's plan itself (IN_KERNEL_PLAN, NOTES P95-P103),
# also before its wait for the previous kernel. They must build within one CTA's shared
# memory without serialised wgmmas; their few spilled registers are what they are measured with
C2V4 = dict(K8_CONSUMERS=2, K8_RAW_SLOTS=2, K8_VSTAGES=4)
MEASUREMENT_BUILDS = {"n128": dict(BLOCK_N=128), "c2v4": C2V4, "c2v4-stamps": C2V4 | dict(PROFILE_STAMPS=1),
                      "c2-pingpong": dict(K8_CONSUMERS=2, K8_PINGPONG=1, K8_RAW_SLOTS=3, K8_VSTAGES=2),
                      "softmax-chain-scaled-first": dict(SOFTMAX_SCALE_IN_EXP=0), "desc-rebuilt": dict(K8_DESC_ADD=0),
                      "in-kernel-plan": dict(IN_KERNEL_PLAN=1, PARTIAL_BF16=1, TMA_EVICT_FIRST=1),
                      "in-kernel-plan-before-wait": dict(IN_KERNEL_PLAN=1, PLAN_BEFORE_WAIT=1, PLAN_CHUNKS=2)}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("name", sorted(MEASUREMENT_BUILDS))
def test_head_dim_256_measurement_builds_compile(tmp_path, monkeypatch, name):
    monkeypatch.setattr(cuda, "CACHE", tmp_path)
    defines = dict(HEAD_DIM=256, GQA=16, PAGE=16, K8=1) | MEASUREMENT_BUILDS[name]
    report = cuda.ptxas_report(build.compile_cubin(defines)).read_text()
    assert "entry function 'vattn_main_sm90_k8' " in report, report
    assert "C7513" not in report and "serialized" not in report, report


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("head_dim, slice_, switches", [(256, 128, (0, 0)), (128, 128, (0, 0)), (256, 64, (0, 0)),
                                                         (256, 128, (1, 1))])
def test_the_reduce_compiles_without_spills(tmp_path, monkeypatch, head_dim, slice_, switches):
    # vattn/hopper/reduce.py's kernel at the backend's launch shape (128-value slices) for both head_dims, the
    # 64-value slices it was measured against, and its measurement switches (trigger, after_wait)
    from vattn.hopper import reduce

    monkeypatch.setattr(cuda, "CACHE", tmp_path)
    cubin = reduce.compile_cubin(head_dim, slice_=slice_, trigger=switches[0], after_wait=switches[1])
    report = cuda.ptxas_report(cubin).read_text()
    assert cubin.stat().st_size > 0 and "entry function 'vattn_reduce_sm90'" in report
    spills = [line for line in report.splitlines() if "bytes spill stores" in line]  # the kernel's and its calls'
    assert len(spills) == 2 and all(" 0 bytes spill stores" in line for line in spills), report


def test_the_cuda_reduce_serves_bf16_rows_of_whole_slices_from_16_sequences_x_programs():
    torch = pytest.importorskip("torch")
    from vattn.hopper import reduce

    def parts(programs=1, dtype=torch.bfloat16):
        return torch.zeros(8, programs, 64, 256, dtype=dtype)

    out = torch.zeros(64, 16, 256, dtype=torch.bfloat16)
    assert reduce.serves(parts(), out, 16) and reduce.serves(parts(2), out, 8)
    assert not reduce.serves(parts(), out, 15)  # vattn's Triton reduce (kernel.PDL_MIN_SEQUENCES)
    assert not reduce.serves(parts(dtype=torch.float32), out, 16)  # fp32 partials
    assert not reduce.serves(parts(), out.float(), 16)
    assert not reduce.serves(parts(), torch.zeros(64, 16, 64, dtype=torch.bfloat16), 16)  # head_dim 64
    assert not reduce.serves(parts(), torch.zeros(64, 16, 260, dtype=torch.bfloat16)[..., :256], 16)  # rows of 520 B


def test_tma_map_layout_is_one_page_of_one_head_innermost_first():
    torch = pytest.importorskip("torch")
    # [num_pages, PAGE, Hkv, D] e4m3, and the same cache seen through a layer-interleaved buffer (page stride 2x)
    cache = torch.zeros(10, 16, 2, 256, dtype=torch.float8_e4m3fn)
    dims, strides, box = build.TensorMaps.layout(cache, 128)
    assert dims == (256, 2, 16, 10) and strides == (256, 512, 8192) and box == (128, 1, 16, 1)
    interleaved = torch.zeros(10, 2, 16, 2, 256, dtype=torch.float8_e4m3fn)[:, 0]
    assert build.TensorMaps.layout(interleaved, 256)[1] == (256, 512, 16384)


def test_tma_map_layout_of_a_bf16_cache_counts_elements_and_bytes():
    torch = pytest.importorskip("torch")
    cache = torch.zeros(10, 16, 2, 256, dtype=torch.bfloat16)
    dims, strides, box = build.TensorMaps.layout(cache, 64)  # 64 head dims = one 128-byte swizzle row
    assert dims == (256, 2, 16, 10) and strides == (512, 1024, 16384) and box == (64, 1, 16, 1)


def test_tma_map_layout_refuses_what_tma_cannot_address():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="one- or two-byte elements"):
        build.TensorMaps.layout(torch.zeros(4, 16, 1, 256, dtype=torch.float32), 128)
    odd = torch.zeros(4, 16, 1, 264, dtype=torch.float8_e4m3fn)[..., :200]  # strides of 264 bytes
    with pytest.raises(ValueError, match="multiples of 16"):
        build.TensorMaps.layout(odd, 128)


def test_tma_map_layout_reads_two_adjacent_heads_as_one_row():
    torch = pytest.importorskip("torch")
    # two heads of 128 per token: a box is one page of both (256-byte rows), the map's one head is the pair
    cache = torch.zeros(10, 16, 2, 128, dtype=torch.float8_e4m3fn)
    assert build.TensorMaps.layout(cache, 128, pack=2) == ((256, 1, 16, 10), (256, 256, 4096), (128, 1, 16, 1))
    four = torch.zeros(10, 16, 4, 128, dtype=torch.float8_e4m3fn)
    assert build.TensorMaps.layout(four, 256, pack=2) == ((256, 2, 16, 10), (256, 512, 8192), (256, 1, 16, 1))
    with pytest.raises(ValueError, match=r"reading 2 KV heads together needs .* adjacent heads"):
        build.TensorMaps.layout(torch.zeros(10, 16, 2, 256, dtype=torch.float8_e4m3fn)[..., :128], 128, pack=2)
    with pytest.raises(ValueError, match=r"shape \(10, 16, 3, 128\)"):
        build.TensorMaps.layout(torch.zeros(10, 16, 3, 128, dtype=torch.float8_e4m3fn), 128, pack=2)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("kernel", [dict(K8=1), dict(KV16=1, TMA_EVICT_FIRST=1)], ids=["k8", "kv16"])
@pytest.mark.parametrize("gqa", [16, 8, 14])  # the CTA's query heads: twice GQA 8, 4 and 7
def test_packed_heads_build_the_tma_kernels_alone_without_spills(tmp_path, monkeypatch, gqa, kernel):
    monkeypatch.setattr(cuda, "CACHE", tmp_path)
    defines = dict(HEAD_DIM=256, GQA=gqa, PAGE=16, PACK_HEADS=2) | kernel
    report = cuda.ptxas_report(build.compile_cubin(defines)).read_text()
    assert "entry function 'vattn_main_sm90_k8' " in report and "entry function 'vattn_main_sm90' " not in report
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills and all(n == "0" for pair in spills for n in pair), report
    assert "C7513" not in report and "serialized" not in report, report


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("defines", [
    dict(HEAD_DIM=256, GQA=8, K8=1), dict(HEAD_DIM=256, GQA=8, KV16=1, TMA_EVICT_FIRST=1),
    dict(HEAD_DIM=256, GQA=8, PAGE=4), dict(HEAD_DIM=128, GQA=6, K8=1, BLOCK_N=128, K8_CONSUMERS=2)],
    ids=["k8", "kv16", "page4", "hd128-k8-two-consumers"])
def test_split_groups_build_every_kernel_without_spills(tmp_path, monkeypatch, defines):
    """GROUP_SPLIT=2 (two CTAs a KV head, each half its query heads: GQA 16 and 12 at 8 draft tokens), as the
    backend builds it: bf16 partials, the cache's KV head from the CTA's index."""
    monkeypatch.setattr(cuda, "CACHE", tmp_path)
    report = cuda.ptxas_report(build.compile_cubin(
        dict(PAGE=16) | defines | dict(GROUP_SPLIT=2, PARTIAL_BF16=1))).read_text()
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    assert spills and all(n == "0" for pair in spills for n in pair), report
    assert "C7513" not in report and "serialized" not in report, report


def test_the_backend_splits_a_kv_heads_query_heads_where_its_rows_pass_one_cta(monkeypatch):
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from vattn.hopper import backend

    # the fewest CTAs that divide GQA with each CTA's rows (max_q_len x its heads) <= 64
    assert [backend.group_split(g, q * g) for g, q in ((16, 4), (16, 8), (12, 8), (7, 8), (32, 8), (24, 5))] == [
        1, 2, 2, 1, 4, 2]
    assert backend.covers_shape("fp8", 256, 16, 128, 16) and backend.covers_shape("bf16", 128, 16, 96, 12)
    monkeypatch.setattr(backend, "_covers", lambda ws: True)  # an sm_90 GPU's workspace
    base = dict(kv_dtype=torch.float8_e4m3fn, head_dim=256, num_kv_heads=1, page_size=16, max_q_len=8, gqa=16)
    split = lambda **kw: backend.programs_per_kv_head(SimpleNamespace(**(base | kw)))
    assert [split(), split(max_q_len=4), split(gqa=8), split(head_dim=128, gqa=12)] == [2, 1, 1, 2]
    monkeypatch.setattr(backend, "SPLIT_GROUPS", False)  # more than 64 rows go to Triton again
    assert backend.group_split(16, 128) == 0 and not backend.covers_shape("fp8", 256, 16, 128, 16)
    assert backend.covers_shape("fp8", 256, 16, 64, 16)


def test_the_backend_packs_two_kv_heads_where_head_dim_128s_rows_fit_twice(monkeypatch):
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from vattn.hopper import backend

    monkeypatch.setattr(backend, "_covers", lambda ws: True)  # an sm_90 GPU's workspace
    base = dict(kv_dtype=torch.float8_e4m3fn, head_dim=128, num_kv_heads=2, page_size=16, max_q_len=4, gqa=8)
    pack = lambda **kw: backend.kv_heads_per_program(SimpleNamespace(**(base | kw)))
    assert pack() == 2 and pack(num_kv_heads=8) == 2 and pack(gqa=4) == 2 and pack(max_q_len=8, gqa=4) == 2
    assert pack(kv_dtype=torch.bfloat16) == 2  # kv16 reads them alike
    # 2 x 4 x 16 rows > 64; one KV head; an odd count; fp16 (no Hopper kernel); head_dim 256; pages of 4
    assert [pack(gqa=16), pack(num_kv_heads=1), pack(num_kv_heads=3), pack(kv_dtype=torch.float16),
            pack(head_dim=256), pack(page_size=4)] == [1] * 6
    monkeypatch.setattr(backend, "PACK_KV_HEADS", False)
    assert pack() == 1


def test_a_models_build_is_the_one_its_workspaces_are_bound_to(monkeypatch):
    """model_build (vattn.hopper.prebuild's, by the model's shape) against the build bind_main takes for a workspace
    planned by the backend's own rules, over the shapes the kernels cover."""
    torch = pytest.importorskip("torch")
    from itertools import product
    from types import SimpleNamespace

    from vattn.hopper import backend

    monkeypatch.setattr(backend, "_covers", lambda ws: True)  # an sm_90 GPU's workspace (covered shapes only)
    dtypes = {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16}
    builds = set()
    for kv, head_dim, (hq, hkv), page, q_len, qk in product(dtypes, (128, 256), ((16, 1), (16, 2), (32, 4), (12, 2)),
                                                           (4, 16, 64), (1, 4, 8), ("split", "e4m3")):
        want = backend.model_build(kv, head_dim, hq, hkv, page, q_len, qk)
        if not backend.covers_shape(kv, head_dim, page, q_len * hq // hkv, hq // hkv):
            assert want is None
            continue
        ws = SimpleNamespace(kv_dtype=dtypes[kv], head_dim=head_dim, num_kv_heads=hkv, page_size=page,
                             max_q_len=q_len, gqa=hq // hkv, qk=qk)
        ws.kv_heads_per_program = backend.kv_heads_per_program(ws)  # as vattn.Workspace takes them
        ws.programs_per_kv_head = backend.programs_per_kv_head(ws)
        ws.program_partial_dtype = backend.partial_dtype(ws) or torch.float32
        assert backend.main_build(*backend.workspace_build(ws)) == want, (kv, head_dim, hq, hkv, page, q_len, qk)
        # VATTN_QK=e4m3 takes Q.K^T in one pass where the kernel splits Q (the e4m3 TMA kernel, k8), nowhere else
        one_pass = want["extra_defines"].get("K8_QPARTS") == 1
        assert one_pass == (qk == "e4m3" and "K8" in want["extra_defines"]), want
        builds.add(repr(want))
    assert len(builds) > 10  # packed, split, kv16, k8 at both head_dims, the page-of-4 kernel
    assert backend.model_build("fp8", 256, 16, 1, 1, 4) is None  # pages of 1: Triton
    # the TMA kernels' copies evict-first in L2 (the page-of-4 kernel has no TMA copies)
    assert backend.model_build("fp8", 256, 16, 1, 16, 4)["extra_defines"]["TMA_EVICT_FIRST"] == 1
    assert backend.model_build("fp8", 128, 16, 2, 16, 8)["extra_defines"]["TMA_EVICT_FIRST"] == 1
    assert "TMA_EVICT_FIRST" not in backend.model_build("fp8", 256, 16, 1, 4, 4)["extra_defines"]
    monkeypatch.setattr(backend, "EVICT_FIRST_E4M3", False)
    assert "TMA_EVICT_FIRST" not in backend.model_build("fp8", 256, 16, 1, 16, 4)["extra_defines"]
    assert backend.model_build("bf16", 256, 16, 1, 16, 4)["extra_defines"]["TMA_EVICT_FIRST"] == 1


def test_prebuild_rejects_bad_shapes_by_name_and_builds_nothing_where_triton_runs(tmp_path, capsys):
    from vattn.hopper import prebuild

    base = ["--kv-dtype", "fp8", "--head-dim", "256", "--num-q-heads", "16", "--num-kv-heads", "1",
            "--page-size", "16", "--max-q-len", "4", "--cache", str(tmp_path)]
    for change, message in ((["--num-kv-heads", "3"], "--num-q-heads: got 16 with --num-kv-heads 3"),
                            (["--max-q-len", "4,9"], "--max-q-len: got '4,9'; allowed: comma-separated integers"),
                            (["--page-size", "0"], "--page-size: got 0; allowed: a positive integer"),
                            (["--kv-dtype", "fp16"], "--kv-dtype: invalid choice: 'fp16'"),
                            (["--tp", "3"], "--tp: got 3 with 16 query and 1 KV heads; allowed: a divisor")):
        with pytest.raises(SystemExit):
            prebuild.main(base + change)
        assert message in capsys.readouterr().err
    assert prebuild.main(base + ["--page-size", "1", "--num-q-heads", "32", "--num-kv-heads", "2", "--tp", "4"]) == 0
    out = capsys.readouterr().out  # sglang's share: a quarter of the query heads, the KV heads one a GPU
    assert "one GPU of 4: 8 query heads, 1 KV heads (GQA 8)" in out
    assert "max_q_len 4: not covered by the Hopper kernels (vattn runs Triton there)" in out
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_prebuild_compiles_the_cubins_the_backend_loads(tmp_path, monkeypatch, capsys):
    from vattn.hopper import backend, prebuild, reduce

    monkeypatch.setattr(cuda, "CACHE", cuda.CACHE)  # prebuild points it at --cache
    assert prebuild.main(["--kv-dtype", "fp8", "--head-dim", "128", "--num-q-heads", "32", "--num-kv-heads", "4",
                          "--tp", "2", "--page-size", "16", "--max-q-len", "4,8", "--cache", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()[1:]
    # what MainSm90 compiles at first use for those workspaces: two KV heads a CTA at q4, one with two consumers at q8
    want = [build.compile_cubin(build.main_defines(**backend.model_build("fp8", 128, 16, 2, 16, q))) for q in (4, 8)]
    want_reduce = reduce.compile_cubin(128)  # and their reduce (vattn/hopper/reduce.py)
    assert [w.parent for w in want + [want_reduce]] == [tmp_path] * 3
    assert sorted(tmp_path.glob("*.cubin")) == sorted(want + [want_reduce])
    assert "PACK_HEADS=2" in lines[0] and "K8_CONSUMERS=2" in lines[1]
    assert all(f"{w} (" in line and "TMA_EVICT_FIRST=1" in line and "vattn_main_sm90_k8: " in line
               and " 0 bytes of spill stores" in line for w, line in zip(want, lines)), lines
    assert lines[2].startswith(f"reduce: {want_reduce} (vattn_reduce_sm90: ") and " 0 bytes of spill stores" in lines[2]


def test_the_reduces_bound_launch_passes_its_kernels_parameters_in_order(pointer_launch_type, monkeypatch):
    """ReduceSm90.bind below cuLaunchKernelEx (no GPU: the loaded kernel and the SM count stand in): the launch
    passes reduce_sm90.cu's parameters in its signature's order, by name, with the grid of the batch's CTAs
    after the long sequences' slabs; out off 16 bytes raises and launches nothing."""
    import ctypes

    from vattn.native import launch as launch_mod
    from vattn.hopper import reduce

    torch, PointerLaunch = pointer_launch_type
    signature = re.search(r"vattn_reduce_sm90\(([^)]*)\)", reduce.SOURCE.read_text()).group(1)
    params = [(m.group(1), m.group(2)) for m in re.finditer(r"([\w:]+\*?)\s+(\w+)\s*(?:,|$)", signature)]
    seen = []

    def record(c, fn, slots, extra):
        read = {"int64_t": ctypes.c_int64, "int": ctypes.c_int32}
        seen.append(dict(fn=fn, grid=tuple(c.grid), block=tuple(c.block), stream=c.stream, values={
            name: (ctypes.c_uint64 if kind.endswith("*") else read[kind]).from_address(slots[j]).value
            for j, (kind, name) in enumerate(params)}))

    driver = _recording_driver(record, [0])
    monkeypatch.setattr(launch_mod, "pointer_launch_type", lambda cache: PointerLaunch)
    monkeypatch.setattr(launch_mod, "current_stream_fn", lambda device: lambda: 77)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: type("Properties", (), {"multi_processor_count": 132}))
    kernel = object.__new__(reduce.ReduceSm90.__wrapped__)  # its fields as __init__ sets them at head_dim 256
    kernel.head_dim, kernel.warps, kernel.slice, kernel.long_path, kernel.long_from = 256, 8, 128, True, 32
    kernel.fn, kernel._launch_fn = ctypes.c_void_p(4321), ctypes.cast(driver, ctypes.c_void_p).value
    batch, heads, gqa, max_q = 5, 16, 8, 4  # two programs a piece, of 8 heads each: every value differs
    o_part = torch.zeros(12, 2, max_q * gqa, 256, dtype=torch.bfloat16)
    lse_part, starts = torch.zeros(12, 2, max_q * gqa), torch.zeros(batch + 1, dtype=torch.int32)
    cu, out = torch.zeros(batch + 1, dtype=torch.int32), torch.zeros(20, heads, 256, dtype=torch.bfloat16)
    bound = kernel.bind(o_part, lse_part, starts, cu, out, gqa=gqa, max_q_len=max_q, pdl=True)
    bound(cu, out)
    # 16 heads x 2 slices of 128 on 8 warps: 4 CTAs a query row, 16 a sequence; 132 SMs: 9 slabs of long CTAs
    assert seen == [dict(fn=4321, grid=(4, max_q, batch + 9), block=(256, 1, 1), stream=77, values=dict(
        o_part=o_part.data_ptr(), sow=o_part.stride(0), soh=o_part.stride(1), sor=o_part.stride(2),
        lse_part=lse_part.data_ptr(), slw=lse_part.stride(0), slh=lse_part.stride(1), seq_part_start=starts.data_ptr(),
        cu_q=cu.data_ptr(), out=out.data_ptr(), sot=out.stride(0), soh_out=out.stride(1), num_q_heads=heads,
        gqa=gqa, pdl=1, batch=batch, long_from=32))]
    shifted = torch.zeros(20 * heads * 256 + 4, dtype=torch.bfloat16)[4:].view(20, heads, 256)  # 8 bytes on
    with pytest.raises(ValueError, match=r"vattn_reduce_sm90\(cu_seqlens_q, out\): argument 1 at .*16-byte aligned"):
        bound(cu, shifted)
    assert len(seen) == 1



def _hopper_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU")
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    return torch


CASES = {
    # seq_lens, q_lens: partial last tiles, sequences shorter than one tile or one page, ragged q (rows of
    # absent tokens must stay neutral), one long sequence split into many pieces among short ones, decode
    "ragged": ([1, 15, 63, 64, 65, 1000, 4500, 35000], [1, 2, 3, 4, 4, 2, 1, 4]),
    "long-among-short": ([100000] + [300] * 15, [4] * 16),
    "uniform-q4": ([8192] * 8, [4] * 8),
    "decode-q1": ([3000, 17, 20000, 640], [1] * 4),
}
# (head_dim, Hq, Hkv): the KERNEL.md configurations; max_q_len x GQA <= 64 rows of one CTA
# hd128-gqa7 (Qwen2.5-7B's 28 / 4 heads): a warp's 16 Q rows cross token boundaries at no fixed place, so the
# Q split takes its general row addresses
CONFIGS = {"hd256-gqa16": (256, 16, 1), "hd256-gqa8": (256, 8, 1), "hd128-gqa8": (128, 16, 2),
           "hd128-gqa4": (128, 8, 2), "hd128-gqa7": (128, 14, 2)}
# every schedule on the first configuration; the other configurations on the kernels the backend serves them with
# (k8 for e4m3 caches, kv16 for bf16)
RUNS = [(case, "hd256-gqa16", sched) for case in sorted(CASES) for sched in sorted(SCHEDULES)] + [
    (case, config, sched) for case in sorted(CASES) for config in sorted(CONFIGS) if config != "hd256-gqa16"
    for sched in ("k8", "kv16")]


@pytest.mark.gpu
@pytest.mark.timeout(180, method="thread")  # a kernel that deadlocks on its barriers blocks in C: end the process
@pytest.mark.parametrize("case,config,schedule", RUNS)
def test_matches_reference(case, config, schedule):
    _check_against_reference(case, config, SCHEDULES[schedule])


# K8_CONSUMERS=2: two consumer warpgroups on alternate tiles, the backend's e4m3 kernel at head_dim 128 (RUNS keeps
# the one-consumer build's "k8" runs there)
@pytest.mark.gpu
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("config", ["hd128-gqa8", "hd128-gqa4", "hd128-gqa7"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_consumer_warpgroups_match_reference(case, config):
    _check_against_reference(case, config, {"K8": 1, "K8_CONSUMERS": 2})


@pytest.mark.gpu
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("cuda_reduce", [False, True])
@pytest.mark.parametrize("case", ["ragged", "decode-q1"])
def test_the_ctypes_launch_matches_reference(monkeypatch, case, cuda_reduce):
    """PyLaunch and PyPointerLaunch, where the C++ launch cannot be built, launch the same kernels with the same
    parameters."""
    from vattn.native import launch

    monkeypatch.setattr(launch, "launch_type", lambda cache: launch.PyLaunch)
    monkeypatch.setattr(launch, "pointer_launch_type", lambda cache: launch.PyPointerLaunch)
    _check_against_reference(case, "hd256-gqa16", SCHEDULES["k8"] | ({"PARTIAL_BF16": 1} if cuda_reduce else {}),
                             cuda_reduce=cuda_reduce)


# out with rows 8 bytes off 16-byte alignment (a head stride of D + 4): the staged result's 16-byte stores cannot
# serve it, and the kernel stores from the accumulators instead
@pytest.mark.gpu
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("schedule", ["k8", "kv16"])
@pytest.mark.parametrize("case", ["ragged", "decode-q1"])
def test_an_unaligned_out_takes_the_direct_store(case, schedule):
    _check_against_reference(case, "hd256-gqa16", SCHEDULES[schedule], out_pad=4)


# two KV heads of 128 a CTA, read as one of 256 (PACK_HEADS, the backend's kernels at head_dim 128 where the
# rows fit): GQA 8 and 4 of two KV heads, GQA 4 of four (two programs an item), GQA 7 on decode (14 query heads a
# CTA: a row's head by its general address), and an unaligned out (the direct stores keep a row's own columns)
PACKED_CONFIGS = {"hd128-gqa4-hkv4": (128, 16, 4)}
PACKED_RUNS = [(case, config, 0) for case in sorted(CASES) for config in ("hd128-gqa8", "hd128-gqa4", "hd128-gqa4-hkv4")
               ] + [("decode-q1", "hd128-gqa7", 0), ("ragged", "hd128-gqa8", 4), ("decode-q1", "hd128-gqa4", 4)]


@pytest.mark.gpu
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("schedule", ["k8", "kv16"])
@pytest.mark.parametrize("case,config,out_pad", PACKED_RUNS)
def test_packed_kv_heads_match_reference(case, config, out_pad, schedule):
    _check_against_reference(case, config, SCHEDULES[schedule], out_pad=out_pad, pack=2)


@pytest.mark.probe
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("probe", sorted(PROBES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_probe_matches_reference(case, probe):
    _check_against_reference(case, "hd256-gqa16", PROBES[probe])


def _check_against_reference(case, config, defines, out_pad: int = 0, pack: int = 1, split: int = 1,
                             cuda_reduce: bool = False):
    """out_pad: out's head stride is head_dim + out_pad (a view of a wider tensor). pack: KV heads a CTA reads
    (MainSm90's pack_heads), split: CTAs a KV head (its group_split); planned and partials as the backend lays them
    out for them. cuda_reduce: merged by vattn/hopper/reduce.py's kernel, else by vattn's Triton reduce."""
    torch = _hopper_gpu()
    import vattn
    from vattn import kernel as K
    from vattn.planner import plan_python

    seq_lens, q_lens = (CASES | SPLIT_CASES | REDUCE_CASES)[case]
    d, hq, hkv = (CONFIGS | PACKED_CONFIGS | SPLIT_CONFIGS)[config]
    gqa, max_q = hq // hkv, max(q_lens)
    gen = torch.Generator(device="cuda").manual_seed(0)
    page = 16
    pages = [-(-n // page) for n in seq_lens]
    pool = sum(pages) + 7
    bf16_kv = "KV16" in defines
    kv_dtype = torch.bfloat16 if bf16_kv else torch.float8_e4m3fn
    # NaN in every cache row no sequence holds (the spare pages, and each last page past its sequence): a kernel
    # that loads whole pages must keep them out of the answer (p = 0 times NaN is NaN)
    k = torch.full((pool, page, hkv, d), float("nan"), device="cuda")
    v = torch.full((pool, page, hkv, d), float("nan"), device="cuda")
    perm = torch.randperm(pool, device="cuda", generator=gen).to(torch.int32)
    tables = torch.zeros(len(seq_lens), max(pages), dtype=torch.int32, device="cuda")
    first = 0
    for b, n in enumerate(pages):
        tables[b, :n] = perm[first:first + n]
        first += n
        for cache in (k, v):
            rows = cache[tables[b, :n].long()].view(-1, hkv, d)
            rows[:seq_lens[b]] = torch.randn(seq_lens[b], hkv, d, device="cuda", generator=gen)
            cache[tables[b, :n].long()] = rows.view(n, page, hkv, d)
    k, v = k.to(kv_dtype), v.to(kv_dtype)
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    q = torch.randn(cu[-1], hq, d, device="cuda", generator=gen).to(torch.bfloat16)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    cu_t = torch.tensor(cu, dtype=torch.int32, device="cuda")
    kd, vd = (None, None) if bf16_kv else (torch.tensor([0.9], device="cuda"), torch.tensor([1.1], device="cuda"))
    scale = d ** -0.5

    programs = hkv // pack * split  # a piece's CTAs
    lists = plan_python(seq_lens, q_lens, num_kv_heads=programs, slots=132, mode="balanced")
    plan = {f: torch.tensor(getattr(lists, f), dtype=torch.int32, device="cuda")
            for f in ("work_seq", "work_start", "work_end", "work_part", "work_order", "seq_part_start")}
    width = plan["work_seq"].shape[0]
    # the workspace's partials hold max_q_len x GQA rows, fewer than the CTA's 64 when GQA or q_len is smaller:
    # one guard item past them must stay untouched
    cta_gqa = gqa * pack // split
    rows = max_q * cta_gqa
    o_dtype = torch.bfloat16 if defines.get("PARTIAL_BF16") else torch.float32
    o_all = torch.full((width + 1, programs, rows, d), float("nan"), device="cuda", dtype=o_dtype)
    lse_all = torch.full((width + 1, programs, rows), float("nan"), device="cuda")
    o_part, lse_part = o_all[:width], lse_all[:width]
    kern = build.MainSm90(head_dim=d, gqa=gqa, page=page, extra_defines=defines, pack_heads=pack, group_split=split)
    # the kernel writes the rows of one-piece sequences, the reduce the rest
    out = torch.full((q.shape[0], hq, d + out_pad), float("nan"), device="cuda", dtype=q.dtype)[..., :d]
    kern.launch(q, k, v, tables, sl, cu_t, kd, vd, scale, plan, o_part, lse_part, out)
    # as the Hopper backend runs it: the reduce as the main kernel's programmatic dependent
    if cuda_reduce:
        from vattn.hopper.reduce import ReduceSm90

        ReduceSm90(d)(o_part, lse_part, plan["seq_part_start"], cu_t, out, gqa=cta_gqa, max_q_len=max_q, pdl=True)
    else:
        K.launch_reduce(o_part, lse_part, plan["seq_part_start"], cu_t, out, gqa=cta_gqa, max_q_len=max_q,
                        skip_whole=True, pdl=True)
    ref = vattn.reference(q, k, v, tables, sl, cu_t, kd, vd, scale)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    assert torch.isnan(o_all[width]).all() and torch.isnan(lse_all[width]).all(), "stored past the partials"
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 5e-3, f"{case}, {config}, {defines}: rel_err {rel:.2e}"


# the partials' O in bf16 (PARTIAL_BF16, the backend's): every kernel's staged store, and k8's direct one
BF16_PARTIALS = {"k8": {"K8": 1}, "kv16": {"KV16": 1}, "serial": {}, "k8direct": PROBES["k8direct"]}


@pytest.mark.gpu
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("schedule", sorted(BF16_PARTIALS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_bf16_partials_match_reference(case, schedule):
    _check_against_reference(case, "hd256-gqa16", BF16_PARTIALS[schedule] | {"PARTIAL_BF16": 1})


@pytest.mark.gpu
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("schedule", ["k8", "kv16"])
@pytest.mark.parametrize("case", ["ragged", "long-among-short"])
def test_packed_kv_heads_with_bf16_partials_match_reference(case, schedule):
    _check_against_reference(case, "hd128-gqa8", SCHEDULES[schedule] | {"PARTIAL_BF16": 1}, pack=2)


# vattn/hopper/reduce.py's reduce on the bf16 partials of every layout the backend gives it: one KV head, two packed,
# two CTAs a KV head (every case, whatever its sequence count: serves() picks it from 16 sequences x programs)
# two-long: two sequences of more pieces than a row's warp takes (reduce.py's long path, the CTAs before the batch's),
# ragged q among them
REDUCE_CASES = {"with-empty": ([0, 300, 5000, 17, 0] + [1000] * 11, [2, 4, 1, 4, 3] + [4] * 11),  # no KV: zeros
                "two-long": ([60000, 0, 300, 45000] + [200] * 12, [4, 2, 3, 1] + [2] * 12)}
CUDA_REDUCE_RUNS = [(case, config, pack, split) for case in sorted(CASES | REDUCE_CASES)
                    for config, pack, split in (("hd256-gqa16", 1, 1), ("hd128-gqa8", 2, 1), ("hd128-gqa4", 2, 1))
                    ] + [(case, "hd256-gqa16-hkv2", 1, 2) for case in ("q8-ragged", "q8-long-among-short")]


@pytest.mark.gpu
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("case,config,pack,split", CUDA_REDUCE_RUNS)
def test_the_cuda_reduce_matches_reference(case, config, pack, split):
    _check_against_reference(case, config, {"K8": 1, "PARTIAL_BF16": 1}, pack=pack, split=split, cuda_reduce=True)


# two CTAs a KV head, each half its query heads (GROUP_SPLIT, the backend's kernels where max_q_len x GQA > 64),
# with bf16 partials as the backend stores them: 8 draft tokens at GQA 16 (one KV head, and two) and at GQA 12
SPLIT_CASES = {
    "q8-ragged": ([9, 15, 63, 64, 65, 1000, 4500, 35000], [8, 2, 5, 8, 6, 8, 1, 8]),
    "q8-long-among-short": ([100000] + [300] * 15, [8] * 16),
    "q8-uniform": ([8192] * 8, [8] * 8),
}
SPLIT_CONFIGS = {"hd256-gqa16-hkv2": (256, 32, 2), "hd128-gqa12": (128, 24, 2)}
SPLIT_KERNELS = {("hd128-gqa12", "k8"): {"K8": 1, "K8_CONSUMERS": 2}}  # the backend's e4m3 kernel at head_dim 128


SPLIT_RUNS = [(case, config, sched) for case in sorted(SPLIT_CASES)
              for config in ("hd256-gqa16", "hd256-gqa16-hkv2", "hd128-gqa12")
              for sched in (("k8", "kv16") if config.startswith("hd128") else ("k8", "kv16", "serial"))]


@pytest.mark.gpu
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("case,config,schedule", SPLIT_RUNS)
def test_split_groups_match_reference(case, config, schedule):
    defines = SPLIT_KERNELS.get((config, schedule), SCHEDULES[schedule])
    _check_against_reference(case, config, defines | {"PARTIAL_BF16": 1}, split=2)


# -- the backend (vattn.hopper.backend) -------------------------------------------------------------

def test_backend_is_registered_only_when_opted_in():
    import os
    import subprocess
    import sys

    code = "import vattn; print(','.join(b.name for b in vattn.api.BACKENDS))"
    env = {k: v for k, v in os.environ.items() if k != "VATTN_HOPPER"}
    names = [subprocess.run([sys.executable, "-c", code], env=env | extra, capture_output=True, text=True,
                            check=True).stdout.strip() for extra in ({}, {"VATTN_HOPPER": "1"}, {"VATTN_HOPPER": "0"})]
    assert names == ["triton", "hopper_sm90,triton", "triton"]


def test_backend_declines_a_cpu_workspace():
    torch = pytest.importorskip("torch")
    import vattn
    from vattn.hopper import backend

    ws = vattn.Workspace(head_dim=256, num_q_heads=16, num_kv_heads=1, kv_dtype=torch.float8_e4m3fn,
                         q_dtype=torch.bfloat16, page_size=16, max_q_len=4, max_batch=2, device="cpu")
    k = torch.zeros(4, 16, 1, 256, dtype=torch.float8_e4m3fn)
    assert not backend.supports(ws, torch.zeros(4, 16, 256, dtype=torch.bfloat16), k)



@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", ["float8_e4m3fn", "bfloat16"])
def test_attention_runs_on_the_hopper_backend_when_registered(kv_dtype):
    torch = _hopper_gpu()
    kv_dtype = getattr(torch, kv_dtype)
    import vattn
    from vattn import api
    from vattn.hopper import backend

    used = []

    def counted(*args):
        used.append(1)
        backend.run(*args)

    api.register_backend(api.Backend(backend.BACKEND.name, backend.supports, counted))
    try:
        gen = torch.Generator(device="cuda").manual_seed(1)
        seq_lens, q_lens = [5000, 77, 1], [4, 3, 1]
        pages = [-(-n // 16) for n in seq_lens]
        k = torch.randn(sum(pages) + 1, 16, 1, 256, device="cuda", generator=gen).to(kv_dtype)
        v = torch.randn(sum(pages) + 1, 16, 1, 256, device="cuda", generator=gen).to(kv_dtype)
        tables = torch.zeros(3, max(pages), dtype=torch.int32, device="cuda")
        first = 0
        for b, n in enumerate(pages):
            tables[b, :n] = torch.arange(first, first + n, dtype=torch.int32, device="cuda")
            first += n
        batch = dict(q=torch.randn(sum(q_lens), 16, 256, device="cuda", generator=gen).to(torch.bfloat16),
                     k_cache=k, v_cache=v, block_tables=tables,
                     seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device="cuda"),
                     cu_seqlens_q=torch.tensor([0, 4, 7, 8], dtype=torch.int32, device="cuda"),
                     k_descale=torch.tensor([0.9], device="cuda"), v_descale=torch.tensor([1.1], device="cuda"))
        if kv_dtype == torch.bfloat16:
            batch["k_descale"] = batch["v_descale"] = None
        ws = vattn.Workspace(head_dim=256, num_q_heads=16, num_kv_heads=1, kv_dtype=kv_dtype,
                             q_dtype=torch.bfloat16, page_size=16, max_q_len=4, max_batch=3)
        pl = vattn.plan(batch["seq_lens"], batch["cu_seqlens_q"], num_kv_heads=1, page_size=16, workspace=ws)
        out = vattn.attention(**batch, plan=pl)
        ref = vattn.reference(**batch, softmax_scale=256 ** -0.5)
        assert used and backend.BACKEND.name not in api.FAILED
        assert float((out.float() - ref).norm() / ref.norm()) < 5e-3
    finally:
        api.BACKENDS.remove(next(x for x in api.BACKENDS if x.name == backend.BACKEND.name))


@pytest.mark.gpu
@pytest.mark.timeout(180, method="thread")
def test_a_plan_of_single_pieces_runs_without_a_reduce_eagerly_and_keeps_it_in_a_graph(monkeypatch):
    """plan(max_seq_len=512) on short sequences: every one is a single piece, which the Hopper kernel writes
    itself, so the eager call launches no reduce and still matches the reference. A graph captured with that
    bound keeps the reduce, and its replays on long sequences (several pieces each) match eager calls and the
    reference."""
    torch = _hopper_gpu()
    import vattn
    from benchmarks.kernel.harness import capture
    from vattn import api
    from vattn.hopper import backend

    reduces = []
    bound_reduce = api._bound_reduce

    def counted_reduce(*args, **kwargs):
        launch = bound_reduce(*args, **kwargs)
        return lambda *live: reduces.append(1) or launch(*live)

    monkeypatch.setattr(api, "_bound_reduce", counted_reduce)
    api.register_backend(backend.BACKEND)
    try:
        gen = torch.Generator(device="cuda").manual_seed(5)
        batch, page, max_len = 8, 16, 6000
        pages = -(-max_len // page)
        k = torch.randn(batch * pages + 1, page, 1, 256, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        v = torch.randn(batch * pages + 1, page, 1, 256, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        perm = torch.randperm(batch * pages, device="cuda", generator=gen).to(torch.int32)
        b = dict(q=torch.randn(4 * batch, 16, 256, device="cuda", generator=gen).to(torch.bfloat16), k_cache=k,
                 v_cache=v, block_tables=perm.view(batch, pages),
                 seq_lens=torch.tensor([300, 17, 512, 4, 64, 200, 450, 9], dtype=torch.int32, device="cuda"),
                 cu_seqlens_q=torch.arange(0, 4 * batch + 1, 4, dtype=torch.int32, device="cuda"),
                 k_descale=torch.tensor([0.9], device="cuda"), v_descale=torch.tensor([1.1], device="cuda"))
        ws = vattn.Workspace(head_dim=256, num_q_heads=16, num_kv_heads=1, kv_dtype=torch.float8_e4m3fn,
                             q_dtype=torch.bfloat16, page_size=page, max_q_len=4, max_batch=batch)
        out = torch.full_like(b["q"], float("nan"))

        def step():
            pl = vattn.plan(b["seq_lens"], b["cu_seqlens_q"], num_kv_heads=1, page_size=page, workspace=ws,
                            max_seq_len=512)
            vattn.attention(**b, plan=pl, out=out)
            return pl

        assert step().single_pieces
        torch.cuda.synchronize()
        ref = vattn.reference(**b, softmax_scale=256 ** -0.5)
        assert reduces == [] and not out.isnan().any()
        assert float((out.float() - ref).norm() / ref.norm()) < 5e-3
        graph = capture(step)  # its warm-up call is eager (no reduce); the captured call keeps it
        assert reduces == [1]
        b["seq_lens"].copy_(torch.tensor([6000, 17, 4100, 2500, 64, 5999, 450, 3000], dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = vattn.reference(**b, softmax_scale=256 ** -0.5)
        assert not out.isnan().any() and float((out.float() - ref).norm() / ref.norm()) < 5e-3
        assert backend.BACKEND.name not in api.FAILED
    finally:
        api.BACKENDS.remove(backend.BACKEND)


@pytest.mark.gpu
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("batch", [4, 24], ids=["ordinary-reduce", "dependent-reduce"])  # kernel.PDL_MIN_SEQUENCES
@pytest.mark.parametrize("head_dim, num_kv_heads, q_len", [(256, 1, 4), (128, 2, 4), (256, 1, 8)],
                         ids=["hd256", "hd128-packed", "hd256-q8-split"])
def test_backend_in_a_cuda_graph_replays_new_lengths_as_eager(batch, head_dim, num_kv_heads, q_len):
    """vattn.plan + vattn.attention on the Hopper backend captured in one graph (the reduce launched as the main
    kernel's programmatic dependent from 16 sequences on): replays on new lengths equal eager calls and the
    reference, so neither launch reads what the other has not yet written. At head_dim 128 a CTA reads both KV
    heads, and at 8 query tokens two CTAs share the KV head (the workspace plans and lays out its partials for
    either)."""
    torch = _hopper_gpu()
    import vattn
    from benchmarks.kernel.harness import capture
    from vattn import api, kernel as K
    from vattn.hopper import backend

    assert (batch >= K.PDL_MIN_SEQUENCES) == (batch == 24)
    bound = []  # what the backend's bind_reduce gave: its CUDA reduce from 16 sequences x programs, else None

    def bind_reduce(*args):
        bound.append(backend.bind_reduce(*args))
        return bound[-1]

    api.register_backend(dataclasses.replace(backend.BACKEND, bind_reduce=bind_reduce))
    try:
        gen = torch.Generator(device="cuda").manual_seed(3)
        page, max_len = 16, 6000
        pages = -(-max_len // page)
        kv_shape = (batch * pages + 1, page, num_kv_heads, head_dim)
        k = torch.randn(kv_shape, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        v = torch.randn(kv_shape, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        perm = torch.randperm(batch * pages, device="cuda", generator=gen).to(torch.int32)
        b = dict(q=torch.randn(q_len * batch, 16, head_dim, device="cuda", generator=gen).to(torch.bfloat16),
                 k_cache=k, v_cache=v, block_tables=perm.view(batch, pages),
                 seq_lens=torch.zeros(batch, dtype=torch.int32, device="cuda"),
                 cu_seqlens_q=torch.arange(0, q_len * batch + 1, q_len, dtype=torch.int32, device="cuda"),
                 k_descale=torch.tensor([0.9], device="cuda"), v_descale=torch.tensor([1.1], device="cuda"))
        ws = vattn.Workspace(head_dim=head_dim, num_q_heads=16, num_kv_heads=num_kv_heads,
                             kv_dtype=torch.float8_e4m3fn, q_dtype=torch.bfloat16, page_size=page, max_q_len=q_len,
                             max_batch=batch)
        assert (ws.kv_heads_per_program, ws.programs_per_kv_head) == ((num_kv_heads, 1) if q_len == 4 else (1, 2))
        lens = lambda seed: torch.randint(q_len, max_len, (batch,), generator=torch.Generator().manual_seed(seed),
                                          dtype=torch.int32)
        b["seq_lens"].copy_(lens(0))
        out = torch.empty_like(b["q"])

        def step():
            pl = vattn.plan(b["seq_lens"], b["cu_seqlens_q"], num_kv_heads=num_kv_heads, page_size=page,
                            workspace=ws)
            vattn.attention(**b, plan=pl, out=out)

        step()  # binds the launches outside the capture
        graph = capture(step)
        for seed in (1, 2, 3):
            b["seq_lens"].copy_(lens(seed))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            replayed = out.clone()
            step()
            torch.cuda.synchronize()
            assert torch.equal(replayed, out), seed
            ref = vattn.reference(**b, softmax_scale=head_dim ** -0.5)
            assert float((replayed.float() - ref).norm() / ref.norm()) < 5e-3, seed
        assert backend.BACKEND.name not in api.FAILED
        assert bound and all((r is not None) == (batch == 24) for r in bound)
    finally:
        api.BACKENDS.remove(next(x for x in api.BACKENDS if x.name == backend.BACKEND.name))


@pytest.mark.gpu
@pytest.mark.timeout(180, method="thread")
def test_a_reduce_that_cannot_be_built_leaves_the_merge_to_triton_after_one_warning(monkeypatch):
    torch = _hopper_gpu()
    import vattn
    from vattn import api
    from vattn.hopper import backend, reduce

    def no_nvcc(*args, **kwargs):
        raise RuntimeError("nvcc: not found (forced by the test)")

    monkeypatch.setattr(reduce, "compile_cubin", no_nvcc)
    monkeypatch.setattr(backend, "_REDUCE_FAILED", [])
    reduce.ReduceSm90.cache_clear()
    api.register_backend(backend.BACKEND)
    try:
        gen = torch.Generator(device="cuda").manual_seed(7)
        batch, page, max_len = 16, 16, 5000
        pages = -(-max_len // page)
        k = torch.randn(batch * pages, page, 1, 256, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        v = torch.randn(batch * pages, page, 1, 256, device="cuda", generator=gen).to(torch.float8_e4m3fn)
        b = dict(q=torch.randn(4 * batch, 16, 256, device="cuda", generator=gen).to(torch.bfloat16), k_cache=k,
                 v_cache=v, block_tables=torch.randperm(batch * pages, device="cuda", generator=gen).to(
                     torch.int32).view(batch, pages),
                 seq_lens=torch.full((batch,), max_len, dtype=torch.int32, device="cuda"),
                 cu_seqlens_q=torch.arange(0, 4 * batch + 1, 4, dtype=torch.int32, device="cuda"),
                 k_descale=torch.tensor([0.9], device="cuda"), v_descale=torch.tensor([1.1], device="cuda"))
        ws = vattn.Workspace(head_dim=256, num_q_heads=16, num_kv_heads=1, kv_dtype=torch.float8_e4m3fn,
                             q_dtype=torch.bfloat16, page_size=page, max_q_len=4, max_batch=batch)
        pl = vattn.plan(b["seq_lens"], b["cu_seqlens_q"], num_kv_heads=1, page_size=page, workspace=ws)
        with pytest.warns(UserWarning, match="the Hopper reduce failed .*nvcc: not found"):
            out = vattn.attention(**b, plan=pl)
        with warnings.catch_warnings(record=True) as later:  # another signature (out given): bound again, quietly
            warnings.simplefilter("always")
            again = vattn.attention(**b, plan=pl, out=torch.empty_like(b["q"]))
        assert not [w for w in later if "reduce" in str(w.message)]
        torch.cuda.synchronize()
        ref = vattn.reference(**b, softmax_scale=256 ** -0.5)
        for got in (out, again):
            assert float((got.float() - ref).norm() / ref.norm()) < 5e-3
        assert backend.BACKEND.name not in api.FAILED and len(backend._REDUCE_FAILED) == 1
    finally:
        api.BACKENDS.remove(backend.BACKEND)
        reduce.ReduceSm90.cache_clear()
