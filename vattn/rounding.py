"""The main kernel's rounding steps, modelled in torch fp32: the oracle for its fp8 and bf16 numerics.

vattn.reference says what attention should be; this says what the kernel computes, rounding for
rounding: each cast to e4m3, fp16 or bf16 that vattn.kernel makes, at the same place and on the same
operands, over the same tiles (the plan's pieces cut into BLOCK_N-token tiles, an online softmax per
piece whose running max sets the scale at which P is rounded, then the reduce over pieces). What is
left between the two is the order of fp32 sums (and on a GPU ex2.approx and div.full, a few ulp).

The rounding choices of one kernel path are a `Steps`; tests swap one field for another value (a
mutation: Q not quantised, P kept in fp32, ...) and check that the kernel is then far from the model.
"""

from __future__ import annotations

from dataclasses import dataclass

LOG2E = 1.44269504  # as vattn.kernel folds it, rounded to fp32 there and here
E4M3_MAX = 448.0  # largest finite e4m3fn value


@dataclass(frozen=True)
class Steps:
    """How the kernel rounds its matrix operands on one path (the defaults: the split-Q fp8 path).

    q: "split_e4m3" (Q / (row amax / q_max) to e4m3, plus the residual x 16 to e4m3: two fp8 dots),
       "e4m3" (the first half only), "fp16_scaled" (bf16 Q into fp16, scaled per row only past 32768),
       "fp16" / "bf16" / "fp32" (Q cast to that type).
    p: the type P is cast to before P.V: "fp16" (fp8 and fp16 KV), "bf16" (bf16 KV) or "fp32".
    q_scale: "row" (one amax per query row, as the kernel) or "tensor" (a mutation).
    l_of_rounded_p: the softmax sum adds P after its rounding (a mutation; the kernel sums P before).
    """

    q: str = "split_e4m3"
    p: str = "fp16"
    q_max: float = E4M3_MAX
    q_scale: str = "row"
    l_of_rounded_p: bool = False


def steps_for(q_dtype, kv_dtype, config) -> Steps:
    """The steps vattn.kernel takes for these dtypes and MainConfig (its _compute_dtype and SCALE_Q)."""
    import torch

    cdt = {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(kv_dtype, "fp16")
    if kv_dtype == torch.float8_e4m3fn and config.qk_fp8:
        return Steps(q="split_e4m3" if config.qk_fp8 == 2 else "e4m3", p=cdt)
    if q_dtype == torch.bfloat16 and cdt == "fp16":
        return Steps(q="fp16_scaled", p=cdt)
    return Steps(q=cdt, p=cdt)


def e4m3(x):
    """Round to e4m3fn, ties to even, saturating at +-448 (the GPU's cvt.rn.satfinite); back as fp32."""
    import torch

    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def cast(x, kind: str):
    """Round fp32 x to fp16, bf16 or e4m3 (round to nearest even), back as fp32; "fp32" leaves it."""
    import torch

    if kind == "e4m3":
        return e4m3(x)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[kind]
    return x.to(dtype).float()


def quantise_q(q, steps: Steps):
    """q [R, D] fp32 (Q's stored values) -> (hi [R, D], lo [R, D] or None, scale [R]) with
    q ~= (hi + lo / 16) * scale; the scale joins the folded logit scale, as in the kernel."""
    import torch

    if steps.q in ("split_e4m3", "e4m3"):
        amax = q.abs().amax(dim=1) if steps.q_scale == "row" else q.abs().amax().expand(q.shape[0])
        scale = torch.where(amax > 0, amax / steps.q_max, 1.0)
        q_f = q / scale[:, None]
        hi = e4m3(q_f)
        # e4m3 keeps a value to within 1/16 of itself: the residual x 16 is again in e4m3's range
        lo = e4m3((q_f - hi) * 16.0) if steps.q == "split_e4m3" else None
        return hi, lo, scale
    if steps.q == "fp16_scaled":  # bf16 reaches 3e38, fp16 only 65504
        amax = q.abs().amax(dim=1)
        scale = torch.where(amax > 32768.0, amax / 32768.0, 1.0)
        return cast(q / scale[:, None], "fp16"), None, scale
    return cast(q, steps.q), None, torch.ones(q.shape[0])


def scores(hi, lo, k):
    """hi, lo [R, D], k [N, D] (K's stored values) -> [R, N]: the two fp8 dots, lo's at 1/16."""
    s = hi @ k.T
    return s if lo is None else s + (lo @ k.T) * 0.0625


def piece(hi, lo, row_scale, limit, k, v, start: int, end: int, steps: Steps, block_n: int):
    """One work item of the main kernel for one KV head: KV positions [start, end) in block_n-token tiles.

    hi, lo [R, D]: Q's operands; row_scale [R]: the folded scale (log2 domain); limit [R]: row r sees
    positions < limit[r]; k, v [L, D]: the sequence's stored K/V for this head (fp32, not descaled).
    Returns (acc / l [R, D], m [R], l [R]): the partial before v_descale, running max, softmax sum.
    """
    import torch

    rows, dim = hi.shape
    acc = torch.zeros(rows, dim)
    m = torch.full((rows,), float("-inf"))
    l = torch.zeros(rows)
    for s in range(start, end, block_n):
        pos = torch.arange(s, min(s + block_n, end))  # [N]
        sc = scores(hi, lo, k[pos]) * row_scale[:, None]  # [R, N], log2 domain
        sc = sc.masked_fill(pos[None, :] >= limit[:, None], float("-inf"))
        m_new = torch.maximum(m, sc.amax(dim=1))
        m_ref = torch.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw nothing stays at p = 0
        alpha = torch.exp2(m - m_ref)
        p = torch.exp2(sc - m_ref[:, None])  # <= 1: rounded at the running max of this tile
        p_op = cast(p, steps.p)  # P.V's operand
        l = l * alpha + (p_op if steps.l_of_rounded_p else p).sum(dim=1)  # the kernel sums P before rounding
        acc = acc * alpha[:, None] + p_op @ v[pos]
        m = m_new
    return acc, m, l


def _partial(acc, m, l, v_descale: float):
    """The epilogue: (O = acc / l * v_descale [R, D], lse2 [R]); a row that saw no key: (0, -inf)."""
    import torch

    has = l > 0
    o_scale = torch.where(has, 1.0 / torch.where(has, l, 1.0), 0.0) * v_descale
    lse2 = torch.where(has, m + torch.log2(torch.where(has, l, 1.0)), float("-inf"))
    return acc * o_scale[:, None], lse2


def merge_partials(partials):
    """The reduce: partials [(O [R, D], lse2 [R])] of one sequence -> [R, D], weighted by 2^lse2."""
    import torch

    o = torch.stack([p[0] for p in partials])  # [P, R, D]
    lse = torch.stack([p[1] for p in partials])  # [P, R]
    top = lse.amax(dim=0)
    w = torch.exp2(lse - torch.where(top == float("-inf"), 0.0, top))  # [P, R], 0 for neutral partials
    num = (w[:, :, None] * torch.where(w[:, :, None] > 0, o, 0.0)).sum(dim=0)
    den = w.sum(dim=0)
    return torch.where(den[:, None] > 0, num / torch.where(den > 0, den, 1.0)[:, None], 0.0)


def attention(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale,
              softmax_scale: float, *, pieces, steps: Steps, block_n: int = 64):
    """The main kernel plus the reduce, as vattn.kernel rounds them; arguments as vattn.reference's.

    pieces: the plan's real work items [(seq, start, end)] (each runs once per KV head).
    Returns out [T, Hq, D] fp32 (before the cast to q's dtype).
    """
    import torch

    f32 = dict(dtype=torch.float32)
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    group = q.shape[1] // num_kv_heads
    # the folded logit scale, in the kernel's order of fp32 products
    qk_scale = torch.tensor(softmax_scale, **f32) * torch.tensor(LOG2E, **f32)
    if k_descale is not None:
        qk_scale = qk_scale * k_descale.float().cpu().reshape(())
    v_scale = 1.0 if v_descale is None else v_descale.float().cpu().reshape(())
    out = torch.zeros(q.shape, **f32)
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    for b, seq_len in enumerate(lens):
        n = cu[b + 1] - cu[b]
        mine = [(s, e) for seq, s, e in pieces if seq == b]
        if n == 0 or not mine:  # L = 0: no pieces, its tokens read nothing
            continue
        page = k_cache.shape[1]
        used = block_tables[b, : -(-seq_len // page)].long()
        k_seq = k_cache[used].float().reshape(-1, num_kv_heads, head_dim)[:seq_len]  # [L, Hkv, D] as stored
        v_seq = v_cache[used].float().reshape(-1, num_kv_heads, head_dim)[:seq_len]
        limit = seq_len - n + torch.arange(n * group) // group + 1  # [n*G]: causal over the last n
        for h in range(num_kv_heads):
            # [n*G, D]: row r = token * G + head_in_group, the kernel's packing
            q_rows = q[cu[b]:cu[b + 1], h * group:(h + 1) * group].float().reshape(n * group, head_dim)
            hi, lo, scale = quantise_q(q_rows, steps)
            row_scale = scale * qk_scale
            parts = [_partial(*piece(hi, lo, row_scale, limit, k_seq[:, h], v_seq[:, h], s, e, steps, block_n),
                              v_scale) for s, e in mine]
            out[cu[b]:cu[b + 1], h * group:(h + 1) * group] = merge_partials(parts).reshape(n, group, head_dim)
    return out


def plan_pieces(plan_tensors) -> list[tuple[int, int, int]]:
    """A plan's real work items as (seq, start, end), from its work_* tensors."""
    seqs, starts, ends = (plan_tensors[f].tolist() for f in ("work_seq", "work_start", "work_end"))
    return [(q, s, e) for q, s, e in zip(seqs, starts, ends) if q >= 0]
