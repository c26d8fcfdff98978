"""The Hopper kernel behind vattn.api's Backend dispatch, opt-in with VATTN_HOPPER=1 (vattn/switch.py; read
when vattn is imported). It takes the calls its kernels cover: an sm_90 GPU, e4m3 or bf16 KV with strides of
whole 16 bytes, bf16 Q, head_dim 256 or 128; a CTA packs max_q_len x GQA <= 64 rows (one wgmma M: decode and
narrower groups leave rows masked), and more rows than that take several CTAs a KV head, each a part of its query
heads (programs_per_kv_head); every other call goes to Triton. A workspace whose calls it covers plans for one CTA
per SM (slots_per_sm), and at head_dim 128 for CTAs that read two adjacent KV heads as one of 256 where they fit
(kv_heads_per_program). Its reduce is vattn/hopper/reduce.py's where that serves the call (bind_reduce), else
vattn's Triton reduce. A build or launch failure falls back to Triton with one warning (vattn.api.attention; a
reduce that cannot be built, to the Triton reduce)."""

from __future__ import annotations

import functools

from vattn import switch
from vattn.api import Backend

QROWS, BLOCK_N = 64, 64  # the kernel's packed rows and its tile in tokens (whole pages)


def enabled() -> bool:
    """VATTN_HOPPER while VATTN is on (switch.hopper); whether vattn serves a call at all is the engine's gate to
    decide and report."""
    return switch.hopper()


@functools.lru_cache(maxsize=None)
def _is_sm90(device) -> bool:
    import torch

    return torch.cuda.get_device_capability(device) == (9, 0)


SPLIT_GROUPS = True  # group_split's choice; False leaves more than 64 rows to Triton (for A/B timing)


def group_split(gqa: int, rows: int) -> int:
    """CTAs a KV head takes (main_sm90.cu's GROUP_SPLIT): 1 where its rows (max_q_len x GQA) fit one CTA, else the
    fewest that divide GQA with each CTA's part of the rows fitting, or 0 (none: SPLIT_GROUPS off). The CTAs of a
    KV head read the same pages side by side (the second mostly from L2), each with its own softmax and P.V."""
    if rows <= QROWS:
        return 1
    if not SPLIT_GROUPS:
        return 0
    q_len = rows // gqa
    return next((s for s in range(2, gqa + 1) if gqa % s == 0 and q_len * gqa // s <= QROWS), 0)


def covers_shape(kv_dtype: str, head_dim: int, page_size: int, rows: int, gqa: int) -> bool:
    """The shapes the kernels take, by the cache's dtype ("fp8" for e4m3, "bf16"), head_dim, page size, packed
    rows (max_q_len x GQA) and GQA; pure Python, shared with the cost model (vattn.cost). The TMA kernels need pages
    of whole 8-row swizzle atoms; e4m3 at head_dim 256 also takes pages of 4."""
    fp8 = kv_dtype == "fp8"
    page_ok = BLOCK_N % page_size == 0 and page_size % (4 if fp8 and head_dim == 256 else 8) == 0
    return kv_dtype in ("fp8", "bf16") and head_dim in (128, 256) and page_ok and group_split(gqa, rows) > 0


def _kv_name(ws) -> str | None:
    """covers_shape's name of the workspace's cache dtype ("fp8" for e4m3, "bf16"), None for one it does not take."""
    import torch

    return {torch.float8_e4m3fn: "fp8", torch.bfloat16: "bf16"}.get(ws.kv_dtype)


def _covers(ws) -> bool:
    """What the workspace alone decides (the call's tensors add their dtypes and strides)."""
    import torch

    kv = _kv_name(ws)
    return (ws.device.type == "cuda" and _is_sm90(ws.device) and kv is not None and ws.q_dtype == torch.bfloat16
            and covers_shape(kv, ws.head_dim, ws.page_size, ws.gqa * ws.max_q_len, ws.gqa))


def supports(ws, q, k_cache) -> bool:
    import torch

    # TMA (and the page-of-4 kernel's 16-byte loads) address the cache by any strides of whole 16 bytes; a CTA
    # reads packed heads as one row of the cache only where they are adjacent
    return (_covers(ws) and k_cache.dtype == ws.kv_dtype and q.dtype == torch.bfloat16 and k_cache.stride(3) == 1
            and all(st * k_cache.element_size() % 16 == 0 for st in k_cache.stride()[:3])
            and (ws.kv_heads_per_program == 1 or k_cache.stride(2) == ws.head_dim))


PACK_KV_HEADS = True  # kv_heads_per_program's choice; False gives one KV head a CTA everywhere (for A/B timing)
PACK_KV_DTYPES = ("fp8", "bf16")  # the caches whose kernels (k8, kv16) it packs


def kv_heads_per_cta(kv_dtype: str, head_dim: int, num_kv_heads: int, page_size: int, rows: int) -> int:
    """2 where a CTA reads two adjacent KV heads of head_dim 128 as one of 256 (main_sm90.cu's PACK_HEADS), else 1,
    for a covered shape (covers_shape's arguments, and the KV head count): e4m3 or bf16 on pages of whole 8-row
    atoms (the k8 and kv16 kernels), an even count of KV heads, and both heads' query rows in one CTA (rows =
    max_q_len x GQA, twice that <= 64). A page of both heads is then one TMA box of rows twice as wide, and a
    64-token tile carries both: on an H200 the e4m3 main kernel of 32 x 8k tokens at head_dim 256 took 44.8 / 42.9
    us where the same bytes as two heads of 128 took 48.1 / 47.7 (GQA 16 / 8 a CTA, benchmarks/NOTES.md P78).
    Pure Python, shared with the cost model."""
    return 2 if (PACK_KV_HEADS and kv_dtype in PACK_KV_DTYPES and head_dim == 128 and num_kv_heads % 2 == 0
                 and page_size % 8 == 0 and 2 * rows <= QROWS) else 1


def kv_heads_per_program(ws) -> int:
    """kv_heads_per_cta for a workspace this backend covers (Backend.kv_heads_per_program)."""
    if not _covers(ws):  # (which also names the cache dtype)
        return 1
    return kv_heads_per_cta(_kv_name(ws), ws.head_dim, ws.num_kv_heads, ws.page_size, ws.max_q_len * ws.gqa)


def programs_per_kv_head(ws) -> int:
    """group_split for a workspace this backend covers (Backend.programs_per_kv_head)."""
    return group_split(ws.gqa, ws.max_q_len * ws.gqa) if _covers(ws) else 1


BF16_PARTIALS = True  # partial_dtype's choice; False keeps them fp32 (for A/B timing)


def partial_dtype(ws):
    """bf16 for a workspace this backend covers (Backend.partial_dtype; main_sm90.cu's PARTIAL_BF16): half the
    bytes a split piece stores after its last tile and the reduce reads. On an H200, bf16 against fp32 partials on
    one machine, two rounds each (benchmarks/NOTES.md P84): plan + main + reduce 89.8, 89.6 -> 87.9, 88.0 us on
    16x35k, 50.6, 50.9 -> 49.3, 49.4 on 32x8k-hd128-gqa8; rel_err 2.2e-3 -> 2.8e-3."""
    import torch

    return torch.bfloat16 if BF16_PARTIALS and _covers(ws) else None


def slots_per_sm(ws) -> int | None:
    return 1 if _covers(ws) else None  # one CTA per SM (registers and shared memory)


# The e4m3 kernels' page copies carry an L2 evict-first policy, as the bf16 kernel's do (main_sm90.cu's
# TMA_EVICT_FIRST): a stream read once then leaves Q, the page tables and the partials in L2. On an H200, off and
# on alternating, two rounds of the bench (benchmarks/NOTES.md P90, run AX): plan + main + reduce faster in 23 of 26
# pairs, 16x35k 88.1, 88.1 -> 86.1, 85.8 us, 32x8k-hd128-gqa4 48.2, 49.0 -> 46.2, 47.1; bs20 mixed (320.8 -> 329.0,
# 325.6 -> 322.0). False restores the old builds (for A/B timing).
EVICT_FIRST_E4M3 = True


def main_build(head_dim: int, gqa: int, page: int, bf16_kv: bool, pack_heads: int = 1, bf16_partials: bool = False,
               group_split: int = 1, qk: str = "split") -> dict:
    """MainSm90's arguments for the build this backend runs (the workspace's shape, heads a CTA, partials, and how
    the e4m3 kernel rounds Q: VATTN_QK's qk, "e4m3" taking Q.K^T in one pass, K8_QPARTS=1, lossy)."""
    partials = {"PARTIAL_BF16": 1} if bf16_partials else {}
    k8 = {"K8": 1, "TMA_EVICT_FIRST": 1} if EVICT_FIRST_E4M3 else {"K8": 1}
    if qk == switch.LOSSY_QK:
        k8["K8_QPARTS"] = 1
    if pack_heads > 1:  # two heads of 128 as one of 256: head_dim 256's build
        defines = {"KV16": 1, "TMA_EVICT_FIRST": 1} if bf16_kv else dict(k8)
        return dict(head_dim=head_dim, gqa=gqa, page=page, extra_defines=defines | partials, pack_heads=pack_heads)

    # bf16 caches take vattn_main_sm90_kv16 (TMA pages straight into the wgmma layout); e4m3 caches on pages of
    # whole 8-row swizzle atoms vattn_main_sm90_k8 (TMA pages, K as fp8 for the tensor cores: 1.3x the other
    # kernel on 16x35k, benchmarks/NOTES.md), on pages of 4 tokens vattn_main_sm90
    # (the bf16 kernel's copies evict-first: 16x35k-bf16 main 142.6 / 144.8 us against 145.8 / 146.5, NOTES P21);
    # e4m3 at head_dim 128 whose heads are not read in pairs with two consumer warpgroups on alternate tiles (main
    # 1-2.5% faster in three runs, P34)
    defines = {"KV16": 1, "TMA_EVICT_FIRST": 1} if bf16_kv else dict(k8) if page % 8 == 0 else None
    if not bf16_kv and defines and head_dim == 128:
        defines["K8_CONSUMERS"] = 2
    return dict(head_dim=head_dim, gqa=gqa, page=page, extra_defines=(defines or {}) | partials,
                group_split=group_split)


def model_build(kv_dtype: str, head_dim: int, num_q_heads: int, num_kv_heads: int, page_size: int,
                max_q_len: int, qk: str = "split") -> dict | None:
    """main_build's arguments for a model's calls of up to max_q_len query tokens (kv_dtype as covers_shape's), by
    the rules a workspace of that shape takes from this backend (kv_heads_per_program, programs_per_kv_head,
    partial_dtype); None where the kernels do not cover it and vattn runs Triton. Pure Python."""
    gqa, rows = num_q_heads // num_kv_heads, max_q_len * (num_q_heads // num_kv_heads)
    if num_q_heads % num_kv_heads or not covers_shape(kv_dtype, head_dim, page_size, rows, gqa):
        return None
    return main_build(head_dim, gqa, page_size, kv_dtype == "bf16",
                      kv_heads_per_cta(kv_dtype, head_dim, num_kv_heads, page_size, rows), BF16_PARTIALS,
                      group_split(gqa, rows), qk)


def workspace_build(ws) -> tuple:
    """main_build's arguments for a workspace's calls, as it was planned by this backend's rules."""
    import torch

    return (ws.head_dim, ws.gqa, ws.page_size, ws.kv_dtype == torch.bfloat16, ws.kv_heads_per_program,
            ws.program_partial_dtype == torch.bfloat16, ws.programs_per_kv_head, ws.qk)


@functools.lru_cache(maxsize=None)
def _kernel(*build):
    from vattn.hopper.build import MainSm90

    return MainSm90(**main_build(*build))


def bind_main(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, softmax_scale,
              plan, pdl: bool = True):
    """The main kernel bound for calls of one signature; pdl as MainSm90.bind's (a benchmark times it without)."""
    ws = plan.workspace
    kernel = _kernel(*workspace_build(ws))
    o_part, lse_part, _ = ws.partials(by_program=True)
    return kernel.bind(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, softmax_scale,
                       plan.tensors, o_part, lse_part, pdl=pdl)


CUDA_REDUCE = True  # bind_reduce's choice; False leaves every merge to vattn's Triton reduce (for A/B timing)
_REDUCE_FAILED: list = []  # the CUDA reduce's build or load error, once: later calls take the Triton reduce


def bind_reduce(plan, cu_seqlens_q, out):
    """vattn/hopper/reduce.py's CUDA reduce bound for calls of one signature (Backend.bind_reduce), where it serves
    the call (reduce.serves); None: vattn's Triton reduce. If it cannot be built or loaded, one warning, and the
    Triton reduce from then on."""
    import warnings

    from vattn.hopper import reduce

    o_part, lse_part, gqa = plan.workspace.partials(by_program=True)
    if not CUDA_REDUCE or _REDUCE_FAILED or not reduce.serves(o_part, out, cu_seqlens_q.shape[0] - 1):
        return None
    try:
        kernel = reduce.ReduceSm90(out.shape[2])
    except Exception as exc:  # no nvcc, a failed compile: the Triton reduce merges as well, a little slower
        _REDUCE_FAILED.append(exc)
        warnings.warn(f"vattn: the Hopper reduce failed ({exc!r}); vattn's Triton reduce instead")
        return None
    return kernel.bind(o_part, lse_part, plan.tensors["seq_part_start"], cu_seqlens_q, out, gqa=gqa,
                       max_q_len=plan.workspace.max_q_len, pdl=True)


def run(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, softmax_scale, plan,
        out) -> None:
    from vattn import kernel as K

    args = (q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale)
    bind_main(*args, softmax_scale, plan)(*args, out)
    reduce = bind_reduce(plan, cu_seqlens_q, out)
    if reduce is not None:
        reduce(cu_seqlens_q, out)
        return
    ws = plan.workspace
    o_part, lse_part, gqa = ws.partials(by_program=True)
    K.launch_reduce(o_part, lse_part, plan.tensors["seq_part_start"], cu_seqlens_q, out, gqa=gqa,
                    max_q_len=ws.max_q_len, skip_whole=True, pdl=True)


def piece_overhead_tiles(kv_dtype) -> int:
    """A CTA's fixed cost in its tiles, by which the balanced planner packs short sequences: ~10 us (launch, the
    chains of dependent loads before Q and the first tile, the partial's store) is ~8 of the e4m3 kernel's 1.2 us
    tiles (benchmarks/NOTES.md P14); a bf16 tile streams twice the bytes, so the same cost is about half as many.
    kv_dtype: a torch dtype, or the cost model's name ("fp8", "bf16")."""
    return 4 if str(kv_dtype) in ("torch.bfloat16", "bf16") else 8


BACKEND = Backend("hopper_sm90", supports, run, bind_main, slots_per_sm, writes_whole=True,
                  piece_overhead_tiles=lambda ws: piece_overhead_tiles(ws.kv_dtype),
                  kv_heads_per_program=kv_heads_per_program, programs_per_kv_head=programs_per_kv_head,
                  partial_dtype=partial_dtype, pdl=True, bind_reduce=bind_reduce)
