"""Build vattn's Hopper main kernel (main_sm90.cu) at first use and launch it through the CUDA driver API.

The source with a build's compile-time shape becomes a cached sm_90a cubin (vattn.native.cuda). The launch
(vattn/native/launch.cpp) calls cuLaunchKernelEx on torch's current stream, so it is captured by CUDA graphs like
any other kernel."""

from __future__ import annotations

import ctypes
from pathlib import Path

from vattn.native import cuda

SOURCE = Path(__file__).with_name("main_sm90.cu")
QROWS = 64  # as main_sm90.cu: the packed query rows of a CTA
MAPS_KEPT = 512  # TMA descriptor pairs kept per kernel (the TMA kernels): one per (K, V) cache pair


def _accumulators(regs: int) -> tuple[str, str]:
    """An m64nN wgmma's f32 accumulators (regs = N / 2 a thread): PTX operand list and in/out constraints."""
    return ", ".join(f"%{i}" for i in range(regs)), ", ".join(f'"+f"(d[{i}])' for i in range(regs))


def _wgmma_rs(n: int, dtype: str = "f16") -> str:
    """O += P.V for an N-wide O (N = head_dim): P (f16 or bf16) from registers, V MN-major in shared memory."""
    regs = n // 2
    d, out = _accumulators(regs)
    a = ", ".join(f"%{regs + i}" for i in range(4))
    name = f"wgmma_rs_n{n}" + ("_bf16" if dtype == "bf16" else "")
    return f"""
__device__ __forceinline__ void {name}(float (&d)[{regs}], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint64_t db) {{
  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n"
               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype}.{dtype} {{{d}}}, {{{a}}}, %{regs + 4}, p, 1, 1, 1;\\n}}\\n"
               : {out}
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}}
"""


def _wgmma_ss(name: str, n: int, k: int, types: str, imm: str) -> str:
    """S = Q.K^T for an N-token tile, both operands K-major in shared memory; imm: the scale (and, for 16-bit
    types, transpose) immediates."""
    regs = n // 2
    d, out = _accumulators(regs)
    return f"""
__device__ __forceinline__ void {name}(float (&d)[{regs}], uint64_t da, uint64_t db, int scale_d) {{
  asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n"
               "wgmma.mma_async.sync.aligned.m64n{n}k{k}.f32.{types} {{{d}}}, %{regs}, %{regs + 1}, p, {imm};\\n}}\\n"
               : {out}
               : "l"(da), "l"(db), "r"(scale_d));
}}
"""


def _wgmma_wrappers() -> str:
    """The wgmma shapes the kernels issue, as inline-PTX functions (their operand lists are long)."""
    return (_wgmma_ss("wgmma_ss_n64", 64, 16, "f16.f16", "1, 1, 0, 0")
            + _wgmma_ss("wgmma_ss_n64_bf16", 64, 16, "bf16.bf16", "1, 1, 0, 0")
            + "".join(_wgmma_ss(f"wgmma_ss_n{n}_e4m3", n, 32, "e4m3.e4m3", "1, 1") for n in (64, 128))
            + "".join(_wgmma_rs(n, t) for n in (128, 256) for t in ("f16", "bf16")))


def source(**defines: int) -> str:
    head = "".join(f"#define {k} {v}\n" for k, v in sorted(defines.items()))
    return head + SOURCE.read_text().replace("// @WGMMA_WRAPPERS@", _wgmma_wrappers(), 1)


def compile_cubin(defines: dict, *, verbose: bool = False) -> Path:
    """The cached cubin for these compile-time constants, compiled now if absent."""
    return cuda.compile_source(source(**defines), "vattn_main_sm90", verbose=verbose)


def _flag(defines: dict, name: str) -> bool:
    return str(defines.get(name, 0)) not in ("0", "")


def kernel_name(defines: dict) -> str:
    """KV16=1 selects vattn_main_sm90_kv16 (bf16 caches by TMA), K8=1 vattn_main_sm90_k8 (K read as e4m3 by the
    tensor cores, pages by TMA), neither vattn_main_sm90."""
    return "vattn_main_sm90_kv16" if _flag(defines, "KV16") else "vattn_main_sm90_k8" if _flag(defines, "K8") \
        else "vattn_main_sm90"


def main_defines(*, head_dim: int, gqa: int, page: int, extra_defines: dict | None = None, pack_heads: int = 1,
                 group_split: int = 1) -> dict:
    """main_sm90.cu's compile-time constants for one build (MainSm90's arguments): the CTA's head_dim and query
    heads, the page, and extra_defines (K8=1, KV16=1 pick the kernel); no GPU needed, so that compile_cubin can
    build it anywhere nvcc is (vattn.hopper.prebuild)."""
    name = kernel_name(extra_defines or {})
    if head_dim not in ((256,) if name == "vattn_main_sm90" else (128, 256)) or not 1 <= gqa * pack_heads <= QROWS:
        raise ValueError(f"MainSm90: head_dim {head_dim}, gqa {gqa} x pack_heads {pack_heads}: covers head_dim "
                         f"256 (K8=1, KV16=1: 128 or 256) and <= {QROWS} query heads a CTA (max_q_len x that "
                         f"<= {QROWS} packed rows)")
    if pack_heads != 1 and (name == "vattn_main_sm90" or head_dim * pack_heads != 256):
        raise ValueError(f"MainSm90: pack_heads {pack_heads} with {name} at head_dim {head_dim}: only "
                         "vattn_main_sm90_k8 and _kv16 pack heads, to a head_dim of 256")
    if group_split < 1 or gqa % group_split or (group_split > 1 and pack_heads > 1):
        raise ValueError(f"MainSm90: group_split {group_split} with gqa {gqa}, pack_heads {pack_heads}: allowed a "
                         "divisor of gqa, and 1 where heads are packed")
    head_dim, gqa = head_dim * pack_heads, gqa * pack_heads // group_split  # the CTA's
    # head_dim 128 streams 128-token tiles: its main kernel 5% faster than on 64 (benchmarks/NOTES.md P18)
    wide = dict(BLOCK_N=128) if name == "vattn_main_sm90_k8" and head_dim == 128 else {}
    packed = dict(PACK_HEADS=pack_heads) if pack_heads > 1 else {}
    split = dict(GROUP_SPLIT=group_split) if group_split > 1 else {}
    return dict(HEAD_DIM=head_dim, GQA=gqa, PAGE=page) | wide | packed | split | dict(extra_defines or {})


class TensorMaps:
    """TMA descriptors (CUtensorMap, 128 bytes) of the K and V caches, encoded with cuTensorMapEncodeTiled: a 4-D
    map [num_pages, PAGE, Hkv, D], one box = one page of one KV head. e4m3 caches (vattn_main_sm90_k8): K in
    128-byte column boxes with the 128-byte swizzle (the fp8 wgmma's layout), V in whole unswizzled rows. bf16
    caches (vattn_main_sm90_kv16): K and V alike in 64-column (128-byte) boxes with the 128-byte swizzle, the
    layout of the 16-bit wgmma's operands. pack: KV heads a CTA reads together (main_sm90.cu's PACK_HEADS): the
    map is then over [num_pages, PAGE, Hkv / pack, pack x D], a box one page of pack adjacent heads."""

    def __init__(self, k_cache, v_cache, l2_promotion: int = 3, pack: int = 1):
        self._buf = ctypes.create_string_buffer(2 * 128 + 64)
        base = (ctypes.addressof(self._buf) + 63) & ~63  # CUtensorMap is 64-byte aligned
        self.k, self.v = base, base + 128
        region = 128 // k_cache.element_size()  # elements in a 128-byte swizzle row
        promo = dict(promotion=l2_promotion)  # CU_TENSOR_MAP_L2_PROMOTION_*: 0 none, 1 64B, 2 128B, 3 256B
        promo["pack"] = pack
        self._encode(self.k, k_cache, box_inner=region, swizzle=3, **promo)  # CU_TENSOR_MAP_SWIZZLE_128B
        if v_cache.element_size() == 1:
            self._encode(self.v, v_cache, box_inner=v_cache.shape[3] * pack, swizzle=0, **promo)  # _SWIZZLE_NONE
        else:
            self._encode(self.v, v_cache, box_inner=region, swizzle=3, **promo)

    @staticmethod
    def layout_key(k_cache, v_cache) -> tuple:
        """What the maps depend on but the caches' addresses (fixed for calls of one signature)."""
        return tuple((tuple(t.shape), t.stride()) for t in (k_cache, v_cache))

    @staticmethod
    def layout(t, box_inner: int, pack: int = 1) -> tuple:
        """(dims in elements, byte strides, box) of the 4-D map of cache t [num_pages, PAGE, Hkv, D] (e4m3 or
        bf16), innermost first, its heads read pack at a time; ValueError, naming the cache's strides, where TMA
        cannot address it."""
        pages, page, heads, dim = t.shape
        size = t.element_size()
        if size not in (1, 2) or t.stride(3) != 1:
            raise ValueError(f"TMA map: cache dtype {t.dtype} strides {t.stride()}: needs one- or two-byte elements "
                             "(e4m3, bf16) with unit stride in head_dim")
        if pack > 1:
            if heads % pack or t.stride(2) != dim:
                raise ValueError(f"TMA map: cache shape {tuple(t.shape)} strides {t.stride()}: reading {pack} KV heads "
                                 "together needs their count a multiple of it and adjacent heads (stride(2) == D)")
            heads, dim = heads // pack, dim * pack
        strides = (t.stride(2) * pack * size, t.stride(1) * size, t.stride(0) * size)
        if any(st % 16 for st in strides) or t.data_ptr() % 16:
            raise ValueError(f"TMA map: cache strides {t.stride()} ({size}-byte elements) and its address must be "
                             "whole multiples of 16 bytes")
        if page > 256 or box_inner > 256:
            raise ValueError(f"TMA map: page_size {page}: a box holds at most 256 rows")
        return (dim, heads, page, pages), strides, (box_inner, 1, page, 1)

    @classmethod
    def _encode(cls, addr: int, t, *, box_inner: int, swizzle: int, promotion: int, pack: int) -> None:
        u64, u32 = ctypes.c_uint64, ctypes.c_uint32
        dims, strides, box = cls.layout(t, box_inner, pack)
        dims, strides, box = (u64 * 4)(*dims), (u64 * 3)(*strides), (u32 * 4)(*box)
        ones = (u32 * 4)(1, 1, 1, 1)
        drv = cuda.driver()
        # CU_TENSOR_MAP_DATA_TYPE_UINT8 or _UINT16 (a copy needs no more), rank 4, no interleave, no out-of-bounds
        # fill
        drv.check(drv.lib.cuTensorMapEncodeTiled(ctypes.c_void_p(addr), t.element_size() - 1, 4,
                                                 ctypes.c_void_p(t.data_ptr()), dims, strides, box, ones, 0, swizzle,
                                                 promotion, 0), "cuTensorMapEncodeTiled")


class MainSm90:
    """The loaded kernel for one compile-time shape (extra_defines K8=1: vattn_main_sm90_k8, KV16=1:
    vattn_main_sm90_kv16). head_dim and gqa are the model's; pack_heads (K8=1 or KV16=1 at head_dim 128): a CTA reads
    that many adjacent KV heads as one of head_dim 256 (main_sm90.cu's PACK_HEADS), gqa x pack_heads query heads;
    group_split: that many CTAs share a KV head, gqa / group_split query heads each (main_sm90.cu's GROUP_SPLIT)."""

    def __init__(self, *, head_dim: int, gqa: int, page: int, extra_defines: dict | None = None,
                 pack_heads: int = 1, group_split: int = 1):
        import torch

        self.defines = main_defines(head_dim=head_dim, gqa=gqa, page=page, extra_defines=extra_defines,
                                    pack_heads=pack_heads, group_split=group_split)
        name = kernel_name(self.defines)
        torch.cuda.current_stream()  # the primary context current on this thread
        torch.zeros(1, device="cuda")
        self.pack_heads, self.group_split = pack_heads, group_split
        self.tma = name != "vattn_main_sm90"  # the TMA kernels take the caches by tensor map
        self.kv16 = name == "vattn_main_sm90_kv16"
        self._maps: dict = {}  # (K and V cache addresses, TensorMaps.layout_key) -> TensorMaps
        drv = cuda.driver()
        self._image, self.module, self.fn = cuda.load_function(compile_cubin(self.defines), name)
        # the kernel's shared memory and threads, as its source computes them from the defines
        shape, addr, size = (ctypes.c_int * 2)(), ctypes.c_uint64(), ctypes.c_size_t()
        drv.check(drv.lib.cuModuleGetGlobal_v2(ctypes.byref(addr), ctypes.byref(size), self.module,
                                               f"{name}_launch".encode()), "cuModuleGetGlobal")
        if size.value != ctypes.sizeof(shape):
            raise RuntimeError(f"{name}_launch: {size.value} bytes in the module, expected {ctypes.sizeof(shape)}")
        drv.check(drv.lib.cuMemcpyDtoH_v2(shape, addr, size), "cuMemcpyDtoH")
        self.smem, self.threads = shape
        drv.check(drv.lib.cuFuncSetAttribute(self.fn, 8, self.smem), "cuFuncSetAttribute(max dynamic smem)")

    def launch(self, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
               softmax_scale, plan_tensors, o_part, lse_part, out, *, v_lbo: int = 8192, v_sbo: int = 1024,
               pdl: bool = True) -> None:
        self.bind(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, softmax_scale,
                  plan_tensors, o_part, lse_part, v_lbo=v_lbo, v_sbo=v_sbo, pdl=pdl)(
            q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out)

    def bind(self, q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
             softmax_scale, plan_tensors, o_part, lse_part, *, v_lbo: int = 8192, v_sbo: int = 1024,
             pdl: bool = True):
        """The launch for calls of one signature (shapes, strides, the plan and its workspace):
        launch(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out), through
        vattn.native.launch's Launch (C++; ctypes where it cannot be built), made at the first call (whose nine
        tensors are its signature) and kept as launch.fast[0]: vattn.api.attention calls it directly on later
        calls. o_part, lse_part: [W, Hkv / pack_heads, max_q_len x gqa x pack_heads, D] and [W, Hkv / pack_heads,
        max_q_len x gqa x pack_heads] (a row of the CTA's query heads keeps its own head's D columns); with
        group_split, [W, Hkv x group_split, max_q_len x gqa / group_split, D] and the same for lse. The kernel
        writes the partials, and out's rows of every sequence that is one piece (the reduce's
        skip_whole). Near its end each CTA lets a programmatic dependent (vattn's reduce with pdl) launch.
        pdl: launch it as a programmatic dependent of the stream's previous kernel: its CTAs may start while that
        kernel ends (vattn's plan lets them start at once) and wait for it after their prologue, before they
        read anything (griddepcontrol.wait, a no-op after any other launch)."""
        import torch

        from vattn.native.launch import current_stream_fn, launch_type

        partial_dtype = torch.bfloat16 if _flag(self.defines, "PARTIAL_BF16") else torch.float32
        if o_part.dtype != partial_dtype:
            raise ValueError(f"o_part: got {o_part.dtype}; this build stores its partials' O as {partial_dtype} "
                             "(PARTIAL_BF16)")
        fixed = lambda x: ("u64", int(x))
        # the call's tensors by position: q 0, k_cache 1, v_cache 2, block_tables 3, seq_lens 4, cu_seqlens_q 5,
        # k_descale 6, v_descale 7, out 8; the TMA kernels take the caches by tensor map (k8 with K8_CPASYNC by
        # address too)
        caches = [] if self.tma and not _flag(self.defines, "K8_CPASYNC") else [
            ("ptr", 1), *map(fixed, k_cache.stride()[:3]), ("ptr", 2), *map(fixed, v_cache.stride()[:3])]
        params = [
            ("ptr", 0), fixed(q.stride(0)), fixed(q.stride(1)), *caches,
            ("ptr", 3), fixed(block_tables.stride(0)), ("ptr", 4), ("ptr", 5), ("ptr", 6), ("ptr", 7),
            ("f32", softmax_scale),
            *(fixed(plan_tensors[name].data_ptr()) for name in ("work_seq", "work_start", "work_end", "work_part",
                                                                 "work_order")),
            fixed(o_part.data_ptr()), *map(fixed, o_part.stride()[:3]), fixed(lse_part.data_ptr()),
            *map(fixed, lse_part.stride()[:2]), ("ptr", 8), ("stride", 8, 0), ("stride", 8, 1),
            ("i32", v_lbo), ("i32", v_sbo),
        ] + ([fixed(plan_tensors["seq_part_start"].data_ptr()), fixed(plan_tensors["num_items"].data_ptr()),
              ("i32", seq_lens.shape[0])] if _flag(self.defines, "IN_KERNEL_PLAN") else []) + (
            [("kmap",), ("vmap",)] if self.tma else [])
        grid = (k_cache.shape[2] // self.pack_heads * self.group_split, plan_tensors["work_seq"].shape[0], 1)
        held = (plan_tensors, o_part, lse_part)  # the frozen addresses' tensors live as long as the launch
        # L2 promotion of the maps' copies (a knob of the maps, not of the source): 128 B for the bf16 kernel, whose
        # boxes are 128-byte rows (16x35k-bf16 main 146.4 / 148.1 us against 151.8 / 150.2 at 256 B, NOTES P21);
        # 256 B for k8 (at 128 B bs20 took 371.5 us against 359.0)
        promotion = int(self.defines.get("TMA_L2_PROMOTION", 2 if self.kv16 else 3))
        layout, maps_kept = TensorMaps.layout_key(k_cache, v_cache), self._maps
        stream = current_stream_fn(q.device.index)
        start = (cuda.launch_kernel_ex_address(), stream, self.fn.value, grid,
                 self.threads, self.smem)
        fast = []

        def launch(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, out) -> None:
            call = (q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, softmax_scale,
                    out)
            if not fast:
                fast.append(launch_type(cuda.CACHE)(*start, call[:8] + (out,), softmax_scale, params, pdl))
            done = fast[0].launch(*call)
            if done == -1:  # the first call on these caches: their TMA maps (one pair per layer in a server)
                key = (k_cache.data_ptr(), v_cache.data_ptr(), layout)
                maps = maps_kept.get(key)
                if maps is None:
                    if len(maps_kept) >= MAPS_KEPT:
                        maps_kept.clear()
                    maps = maps_kept[key] = TensorMaps(k_cache, v_cache, promotion, self.pack_heads)
                fast[0].add_maps(key[0], key[1], ctypes.string_at(maps.k, 128), ctypes.string_at(maps.v, 128))
                done = fast[0].launch(*call)
            if done != 1:
                raise RuntimeError("vattn's Hopper launch: called with another signature than the one it was bound "
                                   "for")

        launch.fast, launch.keep = fast, held
        return launch
