"""vattn's portable Triton kernels: the split main kernel and the segment reduce.

The main kernel handles one work item (a KV piece [start, end) of one sequence)
for one KV head, with every query head of that KV head and every query token of
the sequence packed into one tile: row r = token * G + head_in_group. Each KV
byte is therefore read once per (piece, KV head). It writes a partial: O
normalised by its own softmax sum, and lse2 = max + log2(sum) in the log2
domain. The reduce merges the partials of each (sequence, token, q head).

Launch wrappers take already-validated tensors (vattn.api checks them).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from vattn import launcher, switch

LOG2E = 1.4426950408889634  # 1/ln(2): exp(x) = exp2(x * LOG2E)
FP8_MAX = 448.0  # largest finite e4m3fn value


@dataclass(frozen=True)
class MainConfig:
    """Compile-time choices of the main kernel (tuned with benchmarks.kernel.bench)."""

    block_n: int = 64  # KV tokens per tile (the planners cut pieces at 64)
    num_warps: int = 4
    num_stages: int = 2
    # fp8 KV only: 0 = K widened to fp16; 1 = Q quantised per row to e4m3, one fp8 Q.K^T (coarse:
    # 2.4e-2 on 16 x 35k, over KERNEL.md's 2e-2); 2 = Q split into e4m3 hi + lo/16, two fp8 dots
    # (Q kept to ~2^-8, K read as stored: no per-element widening of K)
    qk_fp8: int = 0
    prefetch_pages: bool = False  # load the next tile's page ids one iteration ahead
    # K-major formulation: S^T = K.Q^T and O^T = V^T.P^T, so the KV tile is the M side of both dots
    # (M = 64 tokens, D): Hopper's wgmma needs M >= 64, which 16 or 32 packed rows alone do not give
    kmajor: bool = False
    # Page-aligned tiles: with every piece starting on a page boundary (vattn.plan cuts at multiples of 64)
    # and BLOCK_N a multiple of PAGE, a tile's rows sit at the same in-page slots every iteration, so their
    # offsets (row % PAGE) * stride + head are computed once, and the loop adds page * page_stride only.
    # Nsight Compute (BENCHMARKS.md) has page 16 issuing ~18% more instructions than page 1 in this
    # issue-bound loop; off until measured (only vattn.plan's aligned plans may use it).
    hoist_rows: bool = False
    # Tiles wholly inside the piece and before every query token's causal limit run without masks (most
    # of a long piece); the last tiles run masked. Saves the per-element compare and select of the mask.
    split_tail: bool = False
    # Rescale the accumulator only when some row's running max grew by more than 2^8 (FlashAttention-4's
    # trick): P then stays <= 256 (fp16-safe) and the [rows x D] multiply is skipped on most tiles.
    lazy_rescale: bool = False


def default_config(head_dim: int, qrows: int, kv_is_fp8: bool, qk: str = "split") -> MainConfig:
    """Config used when the caller gives none, from the H200 runs of 2026-11-29 (BENCHMARKS.md):
    - 4 warps (2 programs/SM) beat 8 warps (1/SM), 1.42 to 0.94 TB/s on 16 x 35k; 8 warps only
      where acc[QROWS, D] fp32 would not fit 4 warps' registers (more than 64 x 256);
    - fp8 KV with >= 64 packed rows: split-Q fp8 Q.K^T + page prefetch, 150.7 us on 16 x 35k against
      176.5 us widening K to fp16; at 128 rows (q8) 233-242 us against 286 us widened;
    - fp8 KV, hd256, 16 packed rows (q_len 1 x GQA16): the same in the K-major formulation, main
      kernel 116.9 us against 137.0 (at 64 rows K-major was 11x slower, at 32 rows 18% slower);
    - otherwise (bf16/fp16 KV, or fp8 with 16 rows at hd128 or 32 rows) K and V widened to the 16-bit
      type, 3 stages: 16 x 35k GQA8 181 us main against 213 us K-major split-Q.
    The interpreter gets the same config: the kernel then runs its e4m3/bf16 roundings and dots emulated
    in fp32 (EMULATE_LOWP), so CPU tests exercise the GPU's default numerics.
    qk="e4m3" (VATTN_QK, vattn/switch.py: the lossy fast mode) makes the split-Q configs round Q once
    (qk_fp8=1); the widened and 16-bit configs do not split Q and stay as they are."""
    rows = _pad_rows(qrows)
    warps = 8 if head_dim * rows > 256 * 64 else 4
    kmajor = rows == 16 and head_dim == 256
    if not kv_is_fp8 or not (rows >= 64 or kmajor):
        # 16 rows at hd128: row offsets hoisted out of the loop, 60.2 against 66.2 us main on 32x8k-hd128-gqa4
        # (one 2026-11-30 H200 sweep); at 64 rows hd256 hoisting made the widened loop slower (168 vs 160 us)
        return MainConfig(block_n=64, num_warps=warps, num_stages=3, hoist_rows=kv_is_fp8 and rows == 16 and head_dim <= 128)
    # 64 rows: hoisted row offsets and an unmasked body loop, 122.5 against 129.1 us main on 16x35k (same sweep)
    return MainConfig(block_n=64, num_warps=warps, num_stages=2, qk_fp8=1 if qk == switch.LOSSY_QK else 2,
                      prefetch_pages=True, kmajor=kmajor,
                      hoist_rows=rows == 64, split_tail=rows == 64)


# -- low-precision emulation for Triton's interpreter (EMULATE_LOWP; never set on a GPU) --
# The interpreter's fp32 -> e4m3 and fp32 -> bf16 casts truncate, drop carries and do not saturate, and
# its bf16/fp8 dots are wrong (KERNEL.md). Under EMULATE_LOWP each narrowing cast first rounds in fp32
# arithmetic exactly as the GPU's cvt.rn(.satfinite) does (the cast after it is then exact), and each dot
# widens its already-rounded operands to fp32: the products are those of the GPU's fp8/bf16 MMA (exact in
# fp32), only the order of the fp32 accumulation differs.


@triton.jit
def _e4m3_rn(x):
    """fp32 -> the nearest e4m3fn value as fp32: ties to even, saturating at +-448 (cvt.rn.satfinite)."""
    ax = tl.abs(x)
    # the binade's exponent, from the bits; below 2^-6 e4m3 is subnormal with the fixed step 2^-9
    e = tl.maximum(((ax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
    inv_step = ((130 - e) << 23).to(tl.float32, bitcast=True)  # 2^(3-e): 3 mantissa bits
    step = ((124 + e) << 23).to(tl.float32, bitcast=True)  # 2^(e-3)
    # ax * inv_step < 16 is exact; adding 1.5 * 2^23 rounds it to an integer, ties to even
    r = ((ax * inv_step + 12582912.0) - 12582912.0) * step
    r = tl.minimum(r, 448.0)
    return tl.where(x < 0, -r, r)


@triton.jit
def _bf16_rn(x):
    """fp32 -> the nearest bf16 value as fp32, ties to even (cvt.rn.bf16.f32)."""
    b = x.to(tl.uint32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _narrow(x, DT: tl.constexpr, EMULATE_LOWP: tl.constexpr):
    """x.to(DT) with the GPU's rounding, also in the interpreter (fp16 casts are right there already)."""
    if EMULATE_LOWP:
        if DT == tl.float8e4nv:
            x = _e4m3_rn(x.to(tl.float32))
        elif DT == tl.bfloat16:
            x = _bf16_rn(x.to(tl.float32))
    return x.to(DT)


@triton.jit
def _dot(a, b, acc, EMULATE_LOWP: tl.constexpr):
    """tl.dot(a, b, acc); emulated: on the fp32 values of the (already rounded) operands."""
    if EMULATE_LOWP:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _q_tile(q_ptr, stride_qt, stride_qh, k_descale_ptr, softmax_scale, q0, n_q, kv_len, h,
            G: tl.constexpr, QROWS: tl.constexpr, QR_PAD: tl.constexpr, D: tl.constexpr,
            HAS_DESCALE: tl.constexpr, CDT: tl.constexpr, SCALE_Q: tl.constexpr, QK_FP8: tl.constexpr,
            EMULATE_LOWP: tl.constexpr):
    """The packed Q tile [QR_PAD, D] as matrix operands, with each row's folded logit scale and causal
    limit. Returns (q, q_lo, row_scale, limit); q_lo is meaningful only when QK_FP8 == 2."""
    rows = tl.arange(0, QR_PAD)
    tok = rows // G
    row_ok = (tok < n_q) & (rows < QROWS)
    d = tl.arange(0, D)
    q_off = (q0 + tok).to(tl.int64)[:, None] * stride_qt + (h * G + rows % G)[:, None] * stride_qh
    q = tl.load(q_ptr + q_off + d[None, :], mask=row_ok[:, None], other=0.0)
    # token j sees KV positions < kv_len - n_q + j + 1 (causal over the last n_q)
    limit = tl.where(row_ok, kv_len - n_q + tok + 1, 0)
    # one folded scale: logits in the log2 domain straight out of the dot
    qk_scale = softmax_scale * 1.44269504  # 1/ln(2)
    if HAS_DESCALE:
        qk_scale = qk_scale * tl.load(k_descale_ptr)
    if QK_FP8 > 0:
        # per-row e4m3 quantisation of Q; its scale joins the folded scale
        q_amax = tl.max(tl.abs(q.to(tl.float32)), axis=1)
        q_s = tl.where(q_amax > 0, q_amax / 448.0, 1.0)
        q_f = q.to(tl.float32) / q_s[:, None]
        q8 = _narrow(q_f, tl.float8e4nv, EMULATE_LOWP)
        # e4m3 rounds to within 1/16 of a value: the residual x 16 fits e4m3 again
        q_lo = _narrow((q_f - q8.to(tl.float32)) * 16.0, tl.float8e4nv, EMULATE_LOWP)
        return q8, q_lo, q_s * qk_scale, limit
    elif SCALE_Q:
        q_amax = tl.max(tl.abs(q.to(tl.float32)), axis=1)
        q_s = tl.where(q_amax > 32768.0, q_amax / 32768.0, 1.0)
        q16 = (q.to(tl.float32) / q_s[:, None]).to(CDT)
        return q16, q16, q_s * qk_scale, limit
    else:
        q16 = _narrow(q, CDT, EMULATE_LOWP)  # fp16 Q meets bf16 KV as bf16
        return q16, q16, tl.full([QR_PAD], 1.0, tl.float32) * qk_scale, limit


@triton.jit
def _page_index(s, pos, j_page, PAGE: tl.constexpr, HOIST_ROWS: tl.constexpr):
    """Page-table column of each row of the tile that starts at s (pos = s + row)."""
    if HOIST_ROWS:  # s is a multiple of PAGE: one scalar division per tile
        return s // PAGE + j_page
    else:
        return pos // PAGE


@triton.jit
def _store_partial(o_part_ptr, stride_ow, stride_oh, stride_or, lse_part_ptr, stride_lw, stride_lh,
                   part, h, acc, m_i, l_i, v_descale_ptr,
                   QROWS: tl.constexpr, QR_PAD: tl.constexpr, D: tl.constexpr, HAS_DESCALE: tl.constexpr,
                   ACC_T: tl.constexpr):
    """Normalise and write one partial: O = acc / l (x v_descale), lse2 = m + log2(l);
    a row that saw no key writes (O 0, lse -inf). acc is [QR_PAD, D], or [D, QR_PAD] when ACC_T."""
    rows = tl.arange(0, QR_PAD)
    d = tl.arange(0, D)
    has = l_i > 0.0
    o_scale = tl.where(has, 1.0 / tl.where(has, l_i, 1.0), 0.0)
    if HAS_DESCALE:
        o_scale = o_scale * tl.load(v_descale_ptr)
    lse2 = tl.where(has, m_i + tl.math.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    store_ok = rows < QROWS
    o_base = o_part_ptr + part * stride_ow + h * stride_oh
    if ACC_T:
        out = acc * o_scale[None, :]
        tl.store(o_base + rows[None, :] * stride_or + d[:, None], out, mask=store_ok[None, :])
    else:
        out = acc * o_scale[:, None]
        tl.store(o_base + rows[:, None] * stride_or + d[None, :], out, mask=store_ok[:, None])
    tl.store(lse_part_ptr + part * stride_lw + h * stride_lh + rows, lse2, mask=store_ok)


@triton.jit
def _kv_tile(s, end, acc, m_i, l_i, page_next, q, q_lo, q_t, q_lo_t, row_scale, limit, d, j_page, k_rows, v_rows,
             k_ptr, v_ptr, bt_row, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, h,
             PAGE: tl.constexpr, BLOCK_N: tl.constexpr, CDT: tl.constexpr, QK_FP8: tl.constexpr,
             PREFETCH_PAGES: tl.constexpr, KMAJOR: tl.constexpr, HOIST_ROWS: tl.constexpr, MASKED: tl.constexpr,
             LAZY: tl.constexpr, EMULATE_LOWP: tl.constexpr):
    """One KV tile [s, s + BLOCK_N) of the piece: gather K/V through the page table, S = Q.K^T, online softmax,
    acc += P.V. MASKED: the tile may cross `end` or a causal limit (else every position is visible to every
    row). LAZY: rescale acc only when some row's running max grew by more than 2^8 (P then stays <= 256)."""
    # -- gather the K/V tile through the page table --
    pos = s + tl.arange(0, BLOCK_N)
    pos_ok = pos < end
    if PREFETCH_PAGES:
        # the K/V addresses then depend on a loop-carried value, not a load of this iteration
        page = page_next.to(tl.int64)
        ahead = pos + BLOCK_N
        page_next = tl.load(bt_row + _page_index(s + BLOCK_N, ahead, j_page, PAGE, HOIST_ROWS),
                            mask=ahead < end, other=0)
    else:
        page = tl.load(bt_row + _page_index(s, pos, j_page, PAGE, HOIST_ROWS), mask=pos_ok,
                       other=0).to(tl.int64)
    if HOIST_ROWS:
        k_off = page * stride_kp + k_rows
        v_off = page * stride_vp + v_rows
    else:
        in_page = pos % PAGE
        k_off = page * stride_kp + in_page * stride_ks + h * stride_kh
        v_off = page * stride_vp + in_page * stride_vs + h * stride_vh
    if MASKED:
        k = tl.load(k_ptr + k_off[:, None] + d[None, :], mask=pos_ok[:, None], other=0.0)
    else:
        k = tl.load(k_ptr + k_off[:, None] + d[None, :])
    # the score tile in the layout of the dots: [QR_PAD, BLOCK_N], or its transpose when K-major
    AX: tl.constexpr = 0 if KMAJOR else 1
    if KMAJOR:
        # -- S^T [BLOCK_N, QR_PAD]: keys on the M side --
        if QK_FP8 == 2:
            sc = _dot(k, q_lo_t, None, EMULATE_LOWP) * 0.0625
            sc = _dot(k, q_t, sc, EMULATE_LOWP)
        elif QK_FP8 == 1:
            sc = _dot(k, q_t, None, EMULATE_LOWP)
        else:
            sc = _dot(k.to(CDT), q_t, None, EMULATE_LOWP)
        sc = sc * row_scale[None, :]
        if MASKED:
            sc = tl.where((pos[:, None] < limit[None, :]) & pos_ok[:, None], sc, float("-inf"))
    else:
        # -- S [QR_PAD, BLOCK_N] --
        if QK_FP8 == 2:
            k_t = tl.trans(k)
            sc = _dot(q_lo, k_t, None, EMULATE_LOWP) * 0.0625
            sc = _dot(q, k_t, sc, EMULATE_LOWP)
        elif QK_FP8 == 1:
            sc = _dot(q, tl.trans(k), None, EMULATE_LOWP)
        else:
            sc = _dot(q, tl.trans(k.to(CDT)), None, EMULATE_LOWP)
        sc = sc * row_scale[:, None]
        if MASKED:
            sc = tl.where((pos[None, :] < limit[:, None]) & pos_ok[None, :], sc, float("-inf"))
    # -- online softmax; a fully masked row keeps m = -inf and p = 0, never NaN --
    m_new = tl.maximum(m_i, tl.max(sc, axis=AX))
    if LAZY:
        grow = tl.max(tl.where(m_new > m_i, m_new - m_i, 0.0), axis=0)
        if grow > 8.0:
            alpha = tl.math.exp2(m_i - tl.where(m_new == float("-inf"), 0.0, m_new))
            if KMAJOR:
                acc = acc * alpha[None, :]
            else:
                acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_new
        m_ref = tl.where(m_i == float("-inf"), 0.0, m_i)
    else:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_ref)
    if KMAJOR:
        p = tl.math.exp2(sc - m_ref[None, :])  # P^T
    else:
        p = tl.math.exp2(sc - m_ref[:, None])
    if LAZY:
        l_i = l_i + tl.sum(p, axis=AX)
    else:
        l_i = l_i * alpha + tl.sum(p, axis=AX)
    if MASKED:
        v = tl.load(v_ptr + v_off[:, None] + d[None, :], mask=pos_ok[:, None], other=0.0)
    else:
        v = tl.load(v_ptr + v_off[:, None] + d[None, :])
    # P rounds to the operand type (fp16, or bf16 with bf16 KV); V widens exactly
    if KMAJOR:
        if LAZY:
            acc = _dot(tl.trans(v).to(CDT), _narrow(p, CDT, EMULATE_LOWP), acc, EMULATE_LOWP)
        else:
            acc = _dot(tl.trans(v).to(CDT), _narrow(p, CDT, EMULATE_LOWP), acc * alpha[None, :], EMULATE_LOWP)
    else:
        if LAZY:
            acc = _dot(_narrow(p, CDT, EMULATE_LOWP), v.to(CDT), acc, EMULATE_LOWP)
        else:
            acc = acc * alpha[:, None] + _dot(_narrow(p, CDT, EMULATE_LOWP), v.to(CDT), None, EMULATE_LOWP)
    if not LAZY:
        m_i = m_new
    return acc, m_i, l_i, page_next


@triton.jit
def _attn_main_kernel(
    # [T, Hq, D]
    q_ptr, stride_qt, stride_qh,
    # [num_pages, PAGE, Hkv, D]
    k_ptr, stride_kp, stride_ks, stride_kh,
    # [num_pages, PAGE, Hkv, D]
    v_ptr, stride_vp, stride_vs, stride_vh,
    # [B, max_pages] int32
    bt_ptr, stride_bt,
    # [B] int32, [B+1] int32
    seq_lens_ptr, cu_q_ptr,
    # [1] fp32 each (read only when HAS_DESCALE)
    k_descale_ptr, v_descale_ptr, softmax_scale,
    # [W] int32 each: the plan
    work_seq_ptr, work_start_ptr, work_end_ptr, work_part_ptr, work_order_ptr,
    # [W, Hkv, QROWS, D] fp32
    o_part_ptr, stride_ow, stride_oh, stride_or,
    # [W, Hkv, QROWS] fp32
    lse_part_ptr, stride_lw, stride_lh,
    G: tl.constexpr, QROWS: tl.constexpr, QR_PAD: tl.constexpr, D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, HAS_DESCALE: tl.constexpr,
    CDT: tl.constexpr, SCALE_Q: tl.constexpr, QK_FP8: tl.constexpr, PREFETCH_PAGES: tl.constexpr,
    KMAJOR: tl.constexpr, HOIST_ROWS: tl.constexpr, SPLIT_TAIL: tl.constexpr, LAZY_RESCALE: tl.constexpr,
    EMULATE_LOWP: tl.constexpr,
):
    # CDT: the matrix operand dtype. fp8 KV widens to fp16 (one cvt per two values on sm_89+;
    # to bf16 it takes several), and fp16 keeps more bits than bf16. SCALE_Q: bf16 Q into fp16
    # is scaled per row so no value can overflow; the scale joins the folded softmax scale.
    tl.static_assert(QR_PAD >= QROWS)
    tl.static_assert(QR_PAD >= 16)  # tl.dot needs M >= 16
    h = tl.program_id(0)
    w = tl.load(work_order_ptr + tl.program_id(1))  # the plan's launch order (balanced: split pieces first)
    if w < 0:  # idle item: fixed-size plans pad with these
        return
    seq = tl.load(work_seq_ptr + w)
    start = tl.load(work_start_ptr + w)
    end = tl.load(work_end_ptr + w)
    part = tl.load(work_part_ptr + w).to(tl.int64)
    kv_len = tl.load(seq_lens_ptr + seq)
    q0 = tl.load(cu_q_ptr + seq)
    n_q = tl.load(cu_q_ptr + seq + 1) - q0
    q, q_lo, row_scale, limit = _q_tile(q_ptr, stride_qt, stride_qh, k_descale_ptr, softmax_scale, q0, n_q,
                                        kv_len, h, G, QROWS, QR_PAD, D, HAS_DESCALE, CDT, SCALE_Q, QK_FP8,
                                        EMULATE_LOWP)
    d = tl.arange(0, D)
    m_i = tl.full([QR_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([QR_PAD], tl.float32)
    if KMAJOR:
        acc = tl.zeros([D, QR_PAD], tl.float32)  # O^T
        q_t = tl.trans(q)
        q_lo_t = tl.trans(q_lo)
    else:
        acc = tl.zeros([QR_PAD, D], tl.float32)
        q_t, q_lo_t = q, q_lo  # unused
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    if HOIST_ROWS:
        tl.static_assert(BLOCK_N % PAGE == 0)
        j = tl.arange(0, BLOCK_N)
        k_rows = ((j % PAGE) * stride_ks + h * stride_kh).to(tl.int64)
        v_rows = ((j % PAGE) * stride_vs + h * stride_vh).to(tl.int64)
        j_page = j // PAGE
    else:
        j_page, k_rows, v_rows = 0, 0, 0  # unused
    if PREFETCH_PAGES:
        first = start + tl.arange(0, BLOCK_N)
        page_next = tl.load(bt_row + _page_index(start, first, j_page, PAGE, HOIST_ROWS), mask=first < end,
                            other=0)
    else:
        page_next = 0  # unused
    body_end = start
    if SPLIT_TAIL:
        # tiles wholly inside [start, end) and before the first query token's causal limit need no mask
        body_end = start + tl.maximum(tl.minimum(end, kv_len - n_q + 1) - start, 0) // BLOCK_N * BLOCK_N
        for s in range(start, body_end, BLOCK_N):
            acc, m_i, l_i, page_next = _kv_tile(
                s, end, acc, m_i, l_i, page_next, q, q_lo, q_t, q_lo_t, row_scale, limit, d, j_page, k_rows,
                v_rows, k_ptr, v_ptr, bt_row, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, h,
                PAGE, BLOCK_N, CDT, QK_FP8, PREFETCH_PAGES, KMAJOR, HOIST_ROWS, False, LAZY_RESCALE, EMULATE_LOWP)
    for s in range(body_end, end, BLOCK_N):
        acc, m_i, l_i, page_next = _kv_tile(
            s, end, acc, m_i, l_i, page_next, q, q_lo, q_t, q_lo_t, row_scale, limit, d, j_page, k_rows, v_rows,
            k_ptr, v_ptr, bt_row, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, h,
            PAGE, BLOCK_N, CDT, QK_FP8, PREFETCH_PAGES, KMAJOR, HOIST_ROWS, True, LAZY_RESCALE, EMULATE_LOWP)
    if SPLIT_TAIL:  # rows past the sequence's tokens (ragged q_len) saw the unmasked tiles: keep them neutral
        l_i = tl.where(limit > 0, l_i, 0.0)

    # -- epilogue: normalise, v_descale once, neutral rows as (O 0, lse -inf) --
    _store_partial(o_part_ptr, stride_ow, stride_oh, stride_or, lse_part_ptr, stride_lw, stride_lh,
                   part, h, acc, m_i, l_i, v_descale_ptr, QROWS, QR_PAD, D, HAS_DESCALE, KMAJOR)


def _pad_rows(qrows: int) -> int:
    return max(16, triton.next_power_of_2(qrows))


def _is(torch_dtype, name: str) -> bool:
    return str(torch_dtype) == f"torch.{name}"


def _compute_dtype(q_dtype, kv_dtype):
    """fp8 or fp16 KV -> fp16 operands; bf16 KV -> bf16 (no K/V conversion at all); fp32 (the
    interpreter tests' exact operands) stays fp32."""
    if _is(kv_dtype, "float32"):
        return tl.float32
    return tl.bfloat16 if _is(kv_dtype, "bfloat16") else tl.float16


# positions in main_launch_args' args of the tensors that change between calls (vattn.api's bindings):
# q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q and the two descales (seq_lens without them)
MAIN_LIVE = (0, 3, 7, 11, 13, 14, 15, 16)


def main_launch_args(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                     softmax_scale, plan_tensors, o_part, lse_part, *, gqa: int, max_q_len: int,
                     config: MainConfig):
    """Positional args and constexpr kwargs of the main kernel (shared by launch and warmup)."""
    page = k_cache.shape[1]
    head_dim = q.shape[2]
    has_descale = k_descale is not None
    kd = k_descale if has_descale else seq_lens  # placeholder pointer, never read
    vd = v_descale if has_descale else seq_lens
    args = (
        q, q.stride(0), q.stride(1),
        k_cache, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache, v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables, block_tables.stride(0),
        seq_lens, cu_seqlens_q, kd, vd, float(softmax_scale),
        plan_tensors["work_seq"], plan_tensors["work_start"], plan_tensors["work_end"],
        plan_tensors["work_part"], plan_tensors["work_order"],
        o_part, o_part.stride(0), o_part.stride(1), o_part.stride(2),
        lse_part, lse_part.stride(0), lse_part.stride(1),
    )
    emulate = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")  # the CPU interpreter only
    return args, dict(_main_constexprs(gqa, max_q_len, config, q.dtype, k_cache.dtype, page, head_dim,
                                       has_descale, emulate))  # a copy: callers may pop from it


@functools.lru_cache(maxsize=64)
def _main_constexprs(gqa, max_q_len, config, q_dtype, kv_dtype, page, head_dim, has_descale, emulate) -> dict:
    """The main kernel's constexpr kwargs: fixed per model config, so built once, not on every eager call."""
    qrows = max_q_len * gqa
    cdt = _compute_dtype(q_dtype, kv_dtype)
    return dict(
        G=gqa, QROWS=qrows, QR_PAD=_pad_rows(qrows), D=head_dim, PAGE=page, BLOCK_N=config.block_n,
        HAS_DESCALE=has_descale, CDT=cdt, SCALE_Q=_is(q_dtype, "bfloat16") and cdt == tl.float16,
        QK_FP8=int(config.qk_fp8), PREFETCH_PAGES=config.prefetch_pages,
        KMAJOR=config.kmajor, HOIST_ROWS=config.hoist_rows and config.block_n % page == 0,
        SPLIT_TAIL=config.split_tail, LAZY_RESCALE=config.lazy_rescale, EMULATE_LOWP=emulate,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


def launch_main(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
                softmax_scale, plan_tensors, o_part, lse_part, *, gqa: int, max_q_len: int,
                config: MainConfig) -> None:
    """Grid (Hkv, W): one program per (KV head, work item); idle items return at once. The heads are the
    fast axis, so programs launch item by item in the plan's work_order for every head at once: with more
    items than slots (balanced packs short sequences) each head's split pieces start in the first wave."""
    num_items = plan_tensors["work_seq"].shape[0]
    args, kwargs = main_launch_args(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
                                    k_descale, v_descale, softmax_scale, plan_tensors, o_part,
                                    lse_part, gqa=gqa, max_q_len=max_q_len, config=config)
    launcher.kernel(_attn_main_kernel).launch((k_cache.shape[2], num_items, 1), args, kwargs)


@triton.jit
def _reduce_kernel(
    # [W, Hkv, QROWS, D] fp32, or bf16 (a Backend's partial_dtype)
    o_part_ptr, stride_ow, stride_oh, stride_or,
    # [W, Hkv, QROWS] fp32
    lse_part_ptr, stride_lw, stride_lh,
    # [B+1] int32 each
    seq_part_start_ptr, cu_q_ptr,
    # [T, Hq, D]
    out_ptr, stride_ot, stride_oh_out,
    batch,
    G: tl.constexpr, D: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr, SKIP_WHOLE: tl.constexpr,
    BLOCK_B: tl.constexpr = 1, PDL: tl.constexpr = False, INDICES_AFTER_WAIT: tl.constexpr = False,
    LET_NEXT_LAUNCH: tl.constexpr = False,
):
    ND: tl.constexpr = D // BLOCK_D
    if LET_NEXT_LAUNCH:
        gdc_launch_dependents()
    if PDL and INDICES_AFTER_WAIT:  # the main kernel wrote seq_part_start (a build that plans itself)
        gdc_wait()
    hq = tl.program_id(0) // ND
    d = (tl.program_id(0) % ND) * BLOCK_D + tl.arange(0, BLOCK_D)
    j = tl.program_id(1)
    # the program's BLOCK_B sequences: their index loads in one memory latency, before any merge
    bs = tl.program_id(2) * BLOCK_B + tl.arange(0, BLOCK_B)
    in_batch = bs < batch
    q0s = tl.load(cu_q_ptr + bs, mask=in_batch, other=0)
    n_qs = tl.load(cu_q_ptr + bs + 1, mask=in_batch, other=0) - q0s
    p_firsts = tl.load(seq_part_start_ptr + bs, mask=in_batch, other=0)
    p_lasts = tl.load(seq_part_start_ptr + bs + 1, mask=in_batch, other=0)
    if PDL:  # launched before the main kernel ends: its first program waits for it whatever it has to do, so
        # that the reduce (which later work waits on) cannot end first
        if tl.program_id(0) + tl.program_id(1) + tl.program_id(2) == 0:
            gdc_wait()
    merge = j < n_qs
    if SKIP_WHOLE:  # a sequence of one piece: the main kernel wrote its rows
        merge = merge & (p_lasts - p_firsts != 1)
    h = hq // G
    row = j * G + hq % G
    for i in tl.static_range(BLOCK_B):
        pick = tl.arange(0, BLOCK_B) == i
        if tl.sum(tl.where(pick, merge, 0)) > 0:
            if PDL:  # the partials are the main kernel's: wait for it (the indices above are the plan's)
                gdc_wait()
            q0 = tl.sum(tl.where(pick, q0s, 0))
            p_first = tl.sum(tl.where(pick, p_firsts, 0))
            p_last = tl.sum(tl.where(pick, p_lasts, 0))
            m_i = tl.full([], float("-inf"), tl.float32)
            l_i = tl.full([], 0.0, tl.float32)
            acc = tl.zeros([BLOCK_D], tl.float32)
            # not software-pipelined: two stages measured slower on every shape (benchmarks/NOTES.md P14e)
            for c in tl.range(p_first, p_last, BLOCK_P, num_stages=1):
                parts = c + tl.arange(0, BLOCK_P)
                ok = parts < p_last
                # -- load a chunk's lse and O together: neither address nor mask depends on the other load, so
                # the loop waits one memory latency per chunk, not two (a long sequence has hundreds of pieces) --
                lse = tl.load(lse_part_ptr + parts.to(tl.int64) * stride_lw + h * stride_lh + row,
                              mask=ok, other=float("-inf"))
                o_off = parts.to(tl.int64)[:, None] * stride_ow + h * stride_oh + row * stride_or + d[None, :]
                o = tl.load(o_part_ptr + o_off, mask=ok[:, None], other=0.0)
                m_new = tl.maximum(m_i, tl.max(lse, axis=0))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.math.exp2(m_i - m_safe)
                wgt = tl.math.exp2(lse - m_safe)
                # neutral partials (lse -inf) weigh 0 and are selected away, so even a non-finite O cannot leak in
                acc = acc * alpha + tl.sum(tl.where((wgt > 0)[:, None], wgt[:, None] * o, 0.0), axis=0)
                l_i = l_i * alpha + tl.sum(wgt, axis=0)
                m_i = m_new
            res = tl.where(l_i > 0.0, acc / tl.where(l_i > 0.0, l_i, 1.0), 0.0)
            out_off = (q0 + j).to(tl.int64) * stride_ot + hq * stride_oh_out + d
            tl.store(out_ptr + out_off, res.to(out_ptr.dtype.element_ty))


def launch_reduce(o_part, lse_part, seq_part_start, cu_seqlens_q, out, *, gqa: int, max_q_len: int,
                  block_p: int = 16, block_d: int | None = None, num_warps: int | None = None,
                  skip_whole: bool = False, pdl: bool = False, block_b: int | None = None,
                  indices_after_wait: bool = False, let_next_launch: bool = False) -> None:
    """Grid (Hq x D / block_d, max_q_len, B / block_b): one program per (output row, D chunk of block_d) of
    block_b sequences, merged one after the other; absent tokens are skipped. A token whose sequence has no
    pieces (L = 0) gets O = 0. skip_whole: the main kernel wrote the rows of every sequence of one piece
    itself (a Backend's writes_whole), so those sequences' programs skip them once they know.

    The reduce is bound by memory latency and by how fast the GPU starts programs, not by bytes: a program
    waits one round trip for its indices and one per chunk of block_p partials. Either default keeps [16, 64]
    fp32 a warp (32 values a thread, ~62 registers). Without skip_whole: a quarter row (block_d 64) on one
    warp, 32 programs an SM, so that many programs overlap their round trips. With it: a whole row
    (block_d = D) on D / 64 warps, a quarter of the programs, since most may return at once and the GPU
    starts programs only so fast. Measured on an H200 (2026-12-01, benchmarks/NOTES.md P14), whole row
    against quarter row with skip_whole: 64 sequences of 24 tokens 3.4 against 10.8 us, a 100k-token
    sequence in 120 pieces among 63 one-piece ones 7.7 against 11.9, 16x35k 5.8 against 5.8; without it the
    whole row was slower (long-among-short 18.2 against 13.8, 16x35k 6.3 against 5.7). The batch is the
    slowest grid axis, so a long first sequence's programs start first instead of being spread over the
    launch.

    Partials in bf16 (a Backend's partial_dtype) are merged on block_d / 128 warps: with skip_whole a whole row
    from PAIR_SEQUENCES_FROM sequences x KV heads, a quarter row on one warp below it. On an H200
    (benchmarks/NOTES.md P84-P87, plan + main + reduce with pdl) a whole row of bf16 on 4 warps took 16x35k to
    98.8 us, in quarter rows 88.2-88.7 (fp32 partials, a whole row on 4 warps: 90.4); 64 sequences of 24 tokens
    took 11.9 us on 2 warps against 15.6 in quarter rows (fp32 11.9).

    block_b (default: PAIR_SEQUENCES_FROM's rule): with skip_whole on a batch of many sequences, two
    sequences a program halve the programs that most often return at once. On an H200 (NOTES.md P39, plan
    + main + reduce with pdl) 64 sequences of 24 tokens took 12.5 us against 13.5; 16x35k 99.6 against
    97.5, 4x35k 41.4 against 38.9 (each program merges both sequences' pieces in turn), and a 100k-token
    sequence among 63 one-piece ones 64.1 against 63.1.

    pdl: allowed to launch as a programmatic dependent of the main kernel (Hopper's griddepcontrol), which
    lets it launch near its end: the reduce's programs then start before the main kernel ends, and those with
    nothing to merge (absent tokens; one-piece sequences with skip_whole) finish without waiting for it. The
    main kernel must not write what they read (cu_seqlens_q, seq_part_start). Taken only for batches of at
    least PDL_MIN_SEQUENCES (sequences x KV heads): on an H200 (benchmarks/NOTES.md P19) it saved 3.4 us of
    18.9 on 64 x 24 tokens and 1.4 of 101.5 on 16x35k, but cost 3.6 us on 4x35k, whose programs each merge
    33 pieces. Only on a CUDA device of sm_90 or later, not under the interpreter.

    With pdl, two measurement switches (benchmarks/NOTES.md P102): indices_after_wait, every program waits for
    the main kernel before it reads seq_part_start (a main kernel built with IN_KERNEL_PLAN writes it);
    let_next_launch, the programs let the next kernel launch at their start."""
    launch = reduce_launch_args(o_part, lse_part, seq_part_start, cu_seqlens_q, out, gqa=gqa, max_q_len=max_q_len,
                                block_p=block_p, block_d=block_d, num_warps=num_warps, skip_whole=skip_whole,
                                pdl=pdl, block_b=block_b, indices_after_wait=indices_after_wait,
                                let_next_launch=let_next_launch)
    if launch is not None:
        launcher.kernel(_reduce_kernel).launch(*launch)


PDL_MIN_SEQUENCES = 16  # launch_reduce's pdl: the smallest batch (sequences x KV heads) it is taken for
PAIR_SEQUENCES_FROM = 32  # launch_reduce's block_b 2 (with skip_whole): the smallest batch (sequences x KV heads)

# positions in reduce_launch_args' args of the tensors that change between calls (vattn.api's bindings)
REDUCE_LIVE = (8, 9)  # cu_seqlens_q, out


def reduce_launch_args(o_part, lse_part, seq_part_start, cu_seqlens_q, out, *, gqa: int, max_q_len: int,
                       block_p: int = 16, block_d: int | None = None, num_warps: int | None = None,
                       skip_whole: bool = False, pdl: bool = False, block_b: int | None = None,
                       indices_after_wait: bool = False, let_next_launch: bool = False):
    """(grid, args, kwargs) of the reduce kernel (launch_reduce's), or None when there is nothing to launch."""
    batch = cu_seqlens_q.shape[0] - 1
    if batch == 0 or out.shape[0] == 0:  # nothing to write (and a zero grid is not launchable)
        return None
    head_dim = out.shape[2]
    pdl = pdl and batch * o_part.shape[1] >= PDL_MIN_SEQUENCES
    many = batch * o_part.shape[1] >= PAIR_SEQUENCES_FROM
    narrow = o_part.element_size() < 4  # bf16 partials (launch_reduce's docstring)
    block_d = min(block_d or (head_dim if skip_whole and (many or not narrow) else 64), head_dim)
    num_warps = num_warps or max(1, block_d // (128 if narrow else 64))
    block_b = block_b or (2 if skip_whole and many else 1)
    return (out.shape[1] * (head_dim // block_d), max_q_len, -(-batch // block_b)), (
        o_part, o_part.stride(0), o_part.stride(1), o_part.stride(2),
        lse_part, lse_part.stride(0), lse_part.stride(1),
        seq_part_start, cu_seqlens_q,
        out, out.stride(0), out.stride(1), batch,
    ), dict(G=gqa, D=head_dim, BLOCK_P=block_p, BLOCK_D=block_d, SKIP_WHOLE=skip_whole, BLOCK_B=block_b,
            num_warps=num_warps) | (dict(PDL=True, launch_pdl=True) if pdl else {}) | (
        dict(INDICES_AFTER_WAIT=True) if pdl and indices_after_wait else {}) | (
        dict(LET_NEXT_LAUNCH=True) if pdl and let_next_launch else {})
