"""Peer kernels for `python -m vattn.bench --peers ...`: the same batches, the same method, the same records.

Each peer is an adapter over a library's public API, imported only when installed (no code of theirs here):
- flashinfer / flashinfer_fa3: FlashInfer 0.7.x `BatchPrefillWithPagedKVCacheWrapper` (causal, q_len per
  request; backend fa2 / fa3) on vattn's NHD paged cache with the same k/v descales; q_len 1 everywhere uses
  `BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)`;
- flashinfer_bf16: the same on a dequantised bf16 copy of the cache (twice the bytes; KERNEL.md: faster in time);
- fa3: FlashAttention-3's `flash_attn_with_kvcache` with a page table (fp8 Q quantised per tensor for fp8 KV);
- sglang_triton: sglang 0.5.23's Triton kernels on its token pool (page 1, the cache viewed as slots), as its
  Triton backend runs them on an H200: `decode_attention_fwd` for q_len 1, else `extend_attention_fwd` (prefix
  from the pool, new tokens as extend K/V); sglang_triton_splitkv: its `verify_splitkv_fwd`, which sglang
  dispatches on gfx95 only (same arguments);
- sdpa: torch SDPA per sequence on a gathered, dequantised copy (the gather is outside the timed region): a
  floor reference, the only peer that also runs on a CPU.
Everything a serving engine does once per batch (plan, page lists, gathers) happens before timing; FlashInfer
is also timed with plan() inside (impl "<name>+plan", host-timed, as plan() syncs). Every peer's output is
compared with vattn.reference first: one outside KERNEL.md's tolerance is recorded as wrong and not timed.
"""

from __future__ import annotations

import statistics
import sys
import time

PEERS = ("flashinfer", "flashinfer_bf16", "flashinfer_fa3", "fa3", "sglang_triton", "sglang_triton_splitkv", "sdpa")
FLASHINFER_WORKSPACE_BYTES = 256 << 20


class PeerUnavailable(Exception):
    """The peer cannot run here (not installed) or not on this shape; the message says which."""


def parse_peers(text: str) -> list[str]:
    names = [p.strip() for p in (text or "").split(",") if p.strip()]
    for p in names:
        if p not in PEERS:
            raise ValueError(f"--peers: got {p!r}; allowed: {', '.join(PEERS)}")
    return names


def tolerance(kv_dtype: str) -> float:
    """KERNEL.md: relative Frobenius error vs the fp32 reference, fp8 operands 2e-2, 16-bit 5e-3."""
    return 2e-2 if kv_dtype == "fp8" else 5e-3


# A peer that rounds Q (and P) to e4m3 by design (Prepared.info["lossy"] says how) lands at 3-4e-2 on an fp8
# cache: over KERNEL.md's 2e-2, so it could not replace vattn, yet it is the kernel an engine runs, and its time
# is the baseline. It is timed and marked; above this bound an output is broken, not lossy.
LOSSY_FP8_LIMIT = 0.1


class Prepared:
    """A peer ready to launch: run(r) computes replica r into `out` (no host sync, graph-capturable);
    plan(r), where given, redoes the per-batch planning of replica r (for the plan-inside variant)."""

    def __init__(self, run, out, kv_dtype: str, kv_bytes: int, plan=None, info: dict | None = None):
        self.run, self.out, self.kv_dtype, self.kv_bytes, self.plan = run, out, kv_dtype, kv_bytes, plan
        self.info = info or {}


# -- page lists shared by the adapters --------------------------------------------------------------------

def _pages(shape, table):
    """Per-sequence page ids of one replica's table -> (indptr [B+1], indices [sum pages], last_page_len [B])."""
    import torch

    p, dev = shape.page_size, table.device
    counts = [-(-n // p) for n in shape.seq_lens]
    indices = torch.cat([table[b, :c] for b, c in enumerate(counts)] or [table[:0, 0]]).to(torch.int32)
    indptr = torch.tensor([0] + [sum(counts[:b + 1]) for b in range(len(counts))], dtype=torch.int32, device=dev)
    last = torch.tensor([n - (c - 1) * p if c else 0 for n, c in zip(shape.seq_lens, counts)],
                        dtype=torch.int32, device=dev)
    return indptr, indices, last


def _slots(shape, table, new_tokens=None):
    """Token-pool slot ids (page * P + offset) of each sequence's positions, concatenated, and their indptr:
    sglang's kv_indices / kv_indptr on the page-P pool viewed as [slots, Hkv, D]. new_tokens: per sequence,
    the last positions to leave out (the prefix only, as sglang's extend kernels take it)."""
    import torch

    p, dev = shape.page_size, table.device
    parts, indptr = [], [0]
    for b, n in enumerate(shape.seq_lens):
        pos = torch.arange(0, n - (new_tokens[b] if new_tokens else 0), device=dev)
        parts.append((table[b, pos // p].long() * p + pos % p).to(torch.int32))
        indptr.append(indptr[-1] + parts[-1].numel())
    return torch.cat(parts), torch.tensor(indptr, dtype=torch.int32, device=dev)


def _dequant(cache, descale, dtype):
    return cache.to(dtype) if descale is None else (cache.float() * float(descale)).to(dtype)


def _kv_bytes(shape, elem_bytes: int) -> int:
    return shape.total_kv_tokens * shape.num_kv_heads * shape.head_dim * 2 * elem_bytes


# -- adapters: (shape, batch) -> Prepared ------------------------------------------------------------------

def _import(module: str, peer: str):
    import importlib

    try:
        return importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken install (missing CUDA libs): either way not usable
        raise PeerUnavailable(f"{peer}: not installed ({module}: {type(exc).__name__}: {exc})") from exc


def _flashinfer(shape, b, backend: str, bf16: bool, name: str) -> Prepared:
    fi = _import("flashinfer", name)
    import torch

    if b.q.device.type != "cuda":
        raise PeerUnavailable(f"{name}: needs a CUDA device")
    k, v, ks, vs = b.k, b.v, b.k_descale, b.v_descale
    if bf16:  # the dequantised copy is made once, like a bf16 cache an engine would hold
        k, v, ks, vs = _dequant(k, ks, torch.bfloat16), _dequant(v, vs, torch.bfloat16), None, None
    kscale = None if ks is None else float(ks)
    vscale = None if vs is None else float(vs)
    ws = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=b.q.device)
    decode = all(n == 1 for n in shape.q_lens)
    if decode and backend != "fa2":
        raise PeerUnavailable(f"{name}: q_len 1 runs FlashInfer's decode wrapper, which has no {backend} backend")
    q, q_scale = b.q, None
    if backend == "fa3" and k.dtype == torch.float8_e4m3fn:
        # its sm90 kernel has no bf16 x e4m3 matrix op (nvcc: "No eligible GMMA operator"): an fp8 cache
        # needs e4m3 Q too, quantised per tensor once here, as an engine quantises Q before the call
        q_scale = float(b.q.abs().amax().float().clamp_min(1e-12)) / 448.0
        q = (b.q.float() / q_scale).to(torch.float8_e4m3fn)
    qo = b.cu.to(torch.int32)
    lists = [_pages(shape, t) for t in b.tables]
    wrappers = []
    for _ in b.tables:
        if decode:
            wrappers.append(fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True))
        else:
            wrappers.append(fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend=backend))

    def plan(r):
        indptr, indices, last = lists[r]
        common = dict(q_data_type=q.dtype, kv_data_type=k.dtype, sm_scale=b.scale)
        if q.dtype != b.q.dtype:
            common["o_data_type"] = b.q.dtype
        if decode:
            wrappers[r].plan(indptr, indices, last, shape.num_q_heads, shape.num_kv_heads, shape.head_dim,
                             shape.page_size, **common)
        else:
            wrappers[r].plan(qo, indptr, indices, last, shape.num_q_heads, shape.num_kv_heads, shape.head_dim,
                             shape.page_size, causal=True, **common)

    out = torch.empty_like(b.q)

    def run(r):
        wrappers[r].run(q, (k, v), q_scale=q_scale, k_scale=kscale, v_scale=vscale, out=out)

    for r in range(len(b.tables)):
        plan(r)
    wrapper = "BatchDecodeWithPagedKVCacheWrapper(tensor cores)" if decode else \
        f"BatchPrefillWithPagedKVCacheWrapper({backend})"
    info = dict(api=f"flashinfer {getattr(fi, '__version__', '?')} {wrapper}")
    if q_scale is not None:
        info["lossy"] = "e4m3 Q, one scale per tensor (its sm90 kernel takes Q and KV of one dtype)"
    return Prepared(run, out, "bf16" if bf16 else shape.kv_dtype, _kv_bytes(shape, k.element_size()), plan, info)


def _fa3_module():
    """The first FlashAttention-3-class API installed: FA3's `flash_attn_with_kvcache` (flash_attn_interface,
    flash_attn_3, sgl_kernel) or FA4's CuTe-DSL `flash_attn.cute.flash_attn_varlen_func` (flash-attn-4)."""
    errors = []
    for name, fn in (("flash_attn_interface", "flash_attn_with_kvcache"),
                     ("flash_attn_3.flash_attn_interface", "flash_attn_with_kvcache"),
                     ("sgl_kernel.flash_attn", "flash_attn_with_kvcache"),
                     ("flash_attn.cute", "flash_attn_varlen_func")):
        try:
            mod = _import(name, "fa3")
        except PeerUnavailable as exc:
            errors.append(str(exc).removeprefix("fa3: not installed (").removesuffix(")"))
            continue
        if hasattr(mod, fn):
            return mod, fn
        errors.append(f"{name}: no {fn}")
    raise PeerUnavailable("fa3: not installed (" + "; ".join(errors) + ")")


def _fa3(shape, b) -> Prepared:
    import torch

    mod, fn = _fa3_module()
    q, k, v, extra, kv_dtype = b.q, b.k, b.v, {}, shape.kv_dtype
    if fn == "flash_attn_varlen_func":
        # FA4 on sm90 asserts fp8 is SM100-only: it reads a dequantised bf16 copy, made once like flashinfer_bf16
        if kv_dtype == "fp8" and torch.cuda.get_device_capability(b.q.device)[0] < 10:
            k, v, kv_dtype = _dequant(k, b.k_descale, torch.bfloat16), _dequant(v, b.v_descale, torch.bfloat16), "bf16"

        def call(r):
            return mod.flash_attn_varlen_func(
                q, k, v, cu_seqlens_q=b.cu, max_seqlen_q=max(shape.q_lens), seqused_k=b.seq_lens,
                page_table=b.tables[r], softmax_scale=b.scale, causal=True)[0]
    else:
        if kv_dtype == "fp8":  # FA3's fp8 path wants Q in e4m3 too: per-tensor scale, as engines quantise it
            q_scale = (b.q.float().abs().amax() / 448.0).clamp_min(1e-12)
            q = (b.q.float() / q_scale).to(torch.float8_e4m3fn)
            per = lambda s: s.float().reshape(1, 1).expand(shape.batch, shape.num_kv_heads).contiguous()
            extra = dict(q_descale=per(q_scale), k_descale=per(b.k_descale), v_descale=per(b.v_descale))

        def call(r):
            return mod.flash_attn_with_kvcache(
                q, k, v, cache_seqlens=b.seq_lens, page_table=b.tables[r], cu_seqlens_q=b.cu,
                max_seqlen_q=max(shape.q_lens), causal=True, softmax_scale=b.scale, **extra)

    call(0)  # first call compiles (FA4: CuTe DSL JIT) outside the timed region
    out = torch.empty_like(b.q)

    def run_into(r):
        out.copy_(call(r).reshape(out.shape))

    return Prepared(run_into, out, kv_dtype, _kv_bytes(shape, k.element_size()),
                    info=dict(api=f"{mod.__name__}.{fn}"))


# decode (q_len 1), the extend kernel sglang's Triton backend runs target-verify with on NVIDIA, and the split-KV
# verify kernel it runs only on gfx95 (TritonAttnBackend.use_verify_splitkv needs is_gfx95_supported())
SGLANG_KERNELS = ("sglang.kernels.ops.attention.decode_attention", "sglang.kernels.ops.attention.extend_attention",
                  "sglang.kernels.ops.attention.verify_splitkv")


def sglang_importable() -> str | None:
    """None when sglang's Triton attention kernels import here, else why not (one line)."""
    import importlib

    for module in SGLANG_KERNELS:
        try:
            importlib.import_module(module)
        except Exception as exc:  # ImportError, or a broken install: either way no baseline
            return f"{module}: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


def _sglang(shape, b, split_kv: bool) -> Prepared:
    """sglang_triton: what sglang's Triton backend runs on an H200 (decode_attention_fwd for q_len 1, else
    extend_attention_fwd: new tokens as extend K/V, the prefix from the pool); sglang_triton_splitkv: its
    split-KV verify kernel, which sglang dispatches on gfx95 only, run here for comparison."""
    import torch

    name = "sglang_triton_splitkv" if split_kv else "sglang_triton"
    if b.q.device.type != "cuda":
        raise PeerUnavailable(f"{name}: needs a CUDA device (Triton kernels)")
    hkv, d = shape.num_kv_heads, shape.head_dim
    k_pool, v_pool = b.k.view(-1, hkv, d), b.v.view(-1, hkv, d)  # page-P NHD pool = token pool, free
    if k_pool.numel() >= 2**31:  # seen on bs20-agentic: an illegal address that takes the CUDA context down
        raise PeerUnavailable(f"{name}: its kernels index the token pool with int32 offsets; this bench's "
                              f"pool ({len(b.tables)} replicas) has {k_pool.numel()} elements >= 2^31")
    info = {}
    if shape.kv_dtype == "fp8":
        info["lossy"] = "Q and P cast to the cache's e4m3 (its kernels' design)"
    ks = 1.0 if b.k_descale is None else float(b.k_descale)
    vs = 1.0 if b.v_descale is None else float(b.v_descale)
    out = torch.empty_like(b.q)
    if all(n == 1 for n in shape.q_lens):
        if split_kv:
            raise PeerUnavailable(f"{name}: q_len 1 is decode, which sglang runs with decode_attention_fwd "
                                  "(sglang_triton)")
        dec = _import(SGLANG_KERNELS[0], name)
        splits = 16  # every sequence split 16 ways (sglang's backend picks <= its max per sequence)
        lists = [_slots(shape, t) for t in b.tables]
        logits = torch.empty(shape.batch, shape.num_q_heads, splits, d, dtype=torch.float32, device=b.q.device)
        lse = torch.empty(shape.batch, shape.num_q_heads, splits, dtype=torch.float32, device=b.q.device)
        nsplit = torch.full((shape.batch,), splits, dtype=torch.int32, device=b.q.device)

        def run(r):
            idx, indptr = lists[r]
            dec.decode_attention_fwd(b.q, k_pool, v_pool, out, indptr, idx, logits, lse, nsplit, splits, b.scale,
                                     ks, vs)

        return Prepared(run, out, shape.kv_dtype, shape.kv_bytes, info=dict(info, api="sglang decode_attention_fwd"))
    if split_kv and len(set(shape.q_lens)) != 1:
        raise PeerUnavailable(f"{name}: verify_splitkv_fwd takes one q_len per batch")
    module = _import(SGLANG_KERNELS[2 if split_kv else 1], name)
    kernel = module.verify_splitkv_fwd if split_kv else module.extend_attention_fwd
    # the new tokens' K/V enter as extend tensors (dequantised, as the engine holds them before the cache write)
    news = list(shape.q_lens)
    ext = []
    for t in b.tables:
        idx, _ = _slots(shape, t)
        keep = torch.cat([torch.arange(e - n, e, device=b.q.device) for e, n in zip(_ends(shape), news)])
        ext.append((_dequant(k_pool[idx[keep].long()], b.k_descale, b.q.dtype),
                    _dequant(v_pool[idx[keep].long()], b.v_descale, b.q.dtype), _slots(shape, t, new_tokens=news)))

    def run(r):
        ke, ve, (idx, indptr) = ext[r]
        # the same positional arguments for both (verify_splitkv_fwd mirrors extend_attention_fwd's)
        ran = kernel(b.q, ke, ve, out, k_pool, v_pool, b.cu, indptr, idx, None, True, None, max(news), ks, vs,
                     sm_scale=b.scale)
        if ran is False:
            raise PeerUnavailable(f"{name}: verify_splitkv_fwd declined this shape (can_handle False)")

    api = "sglang verify_splitkv_fwd" if split_kv else "sglang extend_attention_fwd"
    return Prepared(run, out, shape.kv_dtype, shape.kv_bytes, info=dict(info, api=api))


def _ends(shape):
    """End offset of each sequence in the concatenated full-length slot list."""
    ends, acc = [], 0
    for n in shape.seq_lens:
        acc += n
        ends.append(acc)
    return ends


def _sdpa(shape, b) -> Prepared:
    import torch
    import torch.nn.functional as F

    dtype = b.q.dtype if b.q.device.type == "cuda" else torch.float32  # CPU SDPA: fp32
    q = b.q.to(dtype)
    copies = []  # one gathered copy per replica that cold L2 needs (a copy >= 4 x L2 needs only one)
    for r, t in enumerate(b.tables[:_copies_needed(shape, b, torch.tensor([], dtype=dtype).element_size())]):
        idx, indptr = _slots(shape, t)
        k = _dequant(b.k.view(-1, shape.num_kv_heads, shape.head_dim)[idx.long()], b.k_descale, dtype)
        v = _dequant(b.v.view(-1, shape.num_kv_heads, shape.head_dim)[idx.long()], b.v_descale, dtype)
        copies.append((k, v, indptr.tolist()))
    cu = b.cu.tolist()
    masks = []
    for n, L in zip(shape.q_lens, shape.seq_lens):  # token j sees KV 0 .. L-n+j (bottom-right causal)
        j = torch.arange(n, device=b.q.device).view(n, 1)
        masks.append(torch.arange(L, device=b.q.device).view(1, L) <= L - n + j)
    out = torch.zeros_like(b.q)

    def run(r):
        k, v, ip = copies[r % len(copies)]
        for s, (n, L) in enumerate(zip(shape.q_lens, shape.seq_lens)):
            if n == 0 or L == 0:
                continue
            qs = q[cu[s]:cu[s + 1]].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
            ks = k[ip[s]:ip[s + 1]].transpose(0, 1).unsqueeze(0)  # [1, Hkv, L, D]
            vs = v[ip[s]:ip[s + 1]].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=masks[s], scale=b.scale, enable_gqa=True)
            out[cu[s]:cu[s + 1]] = o[0].transpose(0, 1).to(out.dtype)

    elem = torch.tensor([], dtype=dtype).element_size()
    return Prepared(run, out, {2: "bf16", 4: "fp32"}.get(elem, str(dtype)), _kv_bytes(shape, elem),
                    info=dict(api="torch SDPA on a gathered dequantised copy", gathered_copies=len(copies)))


def _copies_needed(shape, b, elem_bytes: int) -> int:
    from vattn.bench import L2_BYTES

    one = max(1, _kv_bytes(shape, elem_bytes))
    return max(1, min(len(b.tables), -(-int(4 * L2_BYTES) // one)))


FACTORIES = {
    "flashinfer": lambda s, b: _flashinfer(s, b, "fa2", False, "flashinfer"),
    "flashinfer_bf16": lambda s, b: _flashinfer(s, b, "fa2", True, "flashinfer_bf16"),
    "flashinfer_fa3": lambda s, b: _flashinfer(s, b, "fa3", False, "flashinfer_fa3"),
    "fa3": _fa3,
    "sglang_triton": lambda s, b: _sglang(s, b, split_kv=False),
    "sglang_triton_splitkv": lambda s, b: _sglang(s, b, split_kv=True),
    "sdpa": _sdpa,
}


# -- check, then time -----------------------------------------------------------------------------------------

def bench_peers(shape, b, names, *, replays: int, timed_graph, ref=None, skipped: dict | None = None) -> list[dict]:
    """Records (vattn.bench's format, impl = peer name) of every peer in `names` on one shape.

    b: vattn.bench.Batch; timed_graph(fn, replays) -> us of one replay of fn (vattn.bench._timed_graph);
    ref: vattn.reference's output for replica 0 (computed here if None). A peer not installed is printed once
    (skipped[name] remembers why) and yields no record; one that fails or is wrong yields an "error" record."""
    skipped = {} if skipped is None else skipped
    if ref is None:
        import vattn

        ref = vattn.reference(b.q, b.k, b.v, b.tables[0], b.seq_lens, b.cu, b.k_descale, b.v_descale, b.scale)
    records = []
    for name in names:
        if name in skipped:
            continue
        try:
            prep = FACTORIES[name](shape, b)
        except PeerUnavailable as exc:
            if "not installed" in str(exc):
                skipped[name] = str(exc)
                print(f"peer {exc}; skipped", file=sys.stderr, flush=True)
                continue
            records.append(_error(shape, name, f"skipped: {exc}"))
            continue
        except Exception as exc:  # a peer that breaks on this shape must not lose the run
            records.append(_error(shape, name, f"setup failed: {type(exc).__name__}: {exc}"))
            continue
        records += _check_and_time(shape, b, name, prep, ref, replays, timed_graph)
    return records


def _check_and_time(shape, b, name, prep, ref, replays, timed_graph) -> list[dict]:
    try:
        prep.run(0)
        out = prep.out.float()
    except Exception as exc:
        return [_error(shape, name, f"run failed: {type(exc).__name__}: {exc}")]
    nan = bool(out.isnan().any().item())
    rel_err = float((out - ref).norm() / ref.norm().clamp_min(1e-30))
    tol = tolerance(shape.kv_dtype)
    limit = LOSSY_FP8_LIMIT if prep.info.get("lossy") and shape.kv_dtype == "fp8" else tol
    if nan or not rel_err <= limit:
        why = "NaN in output" if nan else f"rel_err {rel_err:.2e} > {limit:g}"
        return [dict(_error(shape, name, f"wrong output: {why} (not timed)"), rel_err=rel_err, nan=nan)]
    reps = len(b.tables)
    all_runs = lambda: [prep.run(r) for r in range(reps)]
    try:
        us, graph = timed_graph(all_runs, replays) / reps, True
    except Exception as exc:  # capture refused (a host sync inside): time eagerly instead, and say so
        print(f"peer {name}: graph capture failed ({type(exc).__name__}: {exc}); timing eagerly", file=sys.stderr)
        try:
            us, graph = _eager_us(all_runs, replays) / reps, False
        except Exception as exc2:
            return [dict(_error(shape, name, f"timing failed: {type(exc2).__name__}: {exc2}"), rel_err=rel_err)]
    rec = dict(_record(shape, name, prep, b, us, 0.0, rel_err, nan, graph), within_tolerance=rel_err <= tol)
    records = [rec]
    if prep.plan is not None:  # the same calls with plan() inside, host-timed (plan() syncs)
        plan_us = _host_us(lambda: [prep.plan(r) for r in range(reps)], replays) / reps
        both = _host_us(lambda: [(prep.plan(r), prep.run(r)) for r in range(reps)], replays) / reps
        records.append(dict(_record(shape, name + "+plan", prep, b, both, plan_us, rel_err, nan, False),
                            planned_inside=True, within_tolerance=rel_err <= tol))
    return records


def _host_us(fn, replays: int) -> float:
    """Median wall time of fn (device work included: synchronised before and after), in us."""
    import torch

    cuda = torch.cuda.is_available()
    fn()  # warm-up
    times = []
    for _ in range(max(1, replays)):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def _eager_us(fn, replays: int) -> float:
    import torch

    if not torch.cuda.is_available():
        return _host_us(fn, replays)
    fn()
    times = []
    for _ in range(max(1, replays)):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        e.record()
        e.synchronize()
        times.append(a.elapsed_time(e) * 1e3)
    return statistics.median(times)


def _base(shape, impl: str) -> dict:
    return dict(shape=shape.name, batch=shape.batch, total_kv_tokens=shape.total_kv_tokens, head_dim=shape.head_dim,
                gqa=shape.gqa, num_kv_heads=shape.num_kv_heads, q_len=shape.q_label, page_size=shape.page_size,
                kv_dtype=shape.kv_dtype, impl=impl, planner="-")


def _error(shape, impl: str, message: str) -> dict:
    return dict(_base(shape, impl), error=message)


def _record(shape, impl, prep, b, us, plan_us, rel_err, nan, graph) -> dict:
    """vattn.bench's record: tbps counts the bytes this peer's cache holds (bf16 copies read twice fp8's)."""
    return dict(_base(shape, impl), kv_dtype=prep.kv_dtype, shape_kv_dtype=shape.kv_dtype, us=us, plan_us=plan_us,
                main_us=us - plan_us, reduce_us=0.0, tbps=prep.kv_bytes / us / 1e6, kv_bytes=prep.kv_bytes,
                replicas=len(b.tables), l2_cold=b.l2_cold, rel_err=rel_err, nan=nan, graph=graph,
                page_size=1 if impl.startswith("sglang") else shape.page_size, **prep.info)


# -- FlashInfer's JIT: build every configuration a run needs at once, before timing anything -----------------

def prewarm(shapes, names, timeout_s: int = 420) -> None:
    """FlashInfer JIT-builds each (backend, dtypes, head_dim) module at first use, 35-40 s each on the H200's
    nvcc; built one by one inside the sweep they would eat most of a 10-minute call. One child process per
    distinct configuration builds them side by side (16 cores) into FLASHINFER_WORKSPACE_BASE's cache."""
    import os
    import subprocess

    fi = [n for n in names if n.startswith("flashinfer")]
    if not fi or importlib_find("flashinfer") is None:
        return
    jobs = {}  # one job per module: backend, decode or prefill, the cache's dtype, head_dim (G is a runtime value)
    for n in fi:
        for s in shapes:
            q1 = int(all(q == 1 for q in s.q_lens))
            kv = "bf16" if n == "flashinfer_bf16" else s.kv_dtype
            if not (q1 and n == "flashinfer_fa3"):
                jobs.setdefault((n == "flashinfer_fa3", q1, kv, s.head_dim),
                                (n, s.head_dim, s.num_q_heads, s.num_kv_heads, s.kv_dtype, q1))
    jobs = sorted(jobs.values())
    env = os.environ.copy()
    # ninja's default -j (cores + 2) in every child would start ~18 nvcc per module at once: out of memory
    env.setdefault("MAX_JOBS", str(max(2, (os.cpu_count() or 16) // len(jobs) + 1)))
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", "vattn.peers", "--warm", *map(str, j)], env=env) for j in jobs]
    for j, p in zip(jobs, procs):
        try:
            rc = p.wait(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
        if rc != 0:
            print(f"peer prewarm {j}: exit {rc} (the bench builds it at first use instead)", file=sys.stderr)
    print(f"peer prewarm: {len(jobs)} FlashInfer configurations in {time.perf_counter() - t0:.0f} s", flush=True)


def importlib_find(module: str):
    import importlib.util

    return importlib.util.find_spec(module)


def _warm_one(name: str, head_dim: int, hq: int, hkv: int, kv_dtype: str, q1: int) -> None:
    from vattn import bench
    from vattn.bench_shapes import Shape

    q = 1 if q1 else 4
    shape = Shape("warm", (100, 37), (q, q), head_dim=head_dim, num_q_heads=hq, num_kv_heads=hkv, kv_dtype=kv_dtype)
    b = bench.Batch(shape)
    b.tables = b.tables[:1]  # a tiny batch gets 256 replicas for cold L2; one wrapper is all a build needs
    try:
        prep = FACTORIES[name](shape, b)
    except PeerUnavailable as exc:
        print(f"peer prewarm: {exc}", file=sys.stderr)
        return
    prep.run(0)
    import torch

    torch.cuda.synchronize()


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "--warm":
        n, *rest = sys.argv[2:]
        _warm_one(n, *(int(x) if x.isdigit() else x for x in rest))
    else:
        sys.exit("usage: python -m vattn.peers --warm NAME HEAD_DIM HQ HKV KV_DTYPE Q1")


def peer_table(records: list[dict]) -> str:
    """Issue 8's markdown table: per shape, vattn's fastest planner and each peer: us (TB/s, % of the run's read
    ceiling), or why it has no time (wrong output, skipped, failed); then vattn / best peer in time."""
    shapes = list(dict.fromkeys(r["shape"] for r in records))
    impls = [p + v for p in PEERS for v in ("", "+plan") if any(r.get("impl") == p + v for r in records)]
    head = ["shape", "vattn (best planner)", *impls, "best peer", "vattn / best peer"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in shapes:
        rows = {r["impl"]: r for r in records if r["shape"] == s and "impl" in r}
        mine = [r for r in records if r["shape"] == s and r.get("impl") == "vattn" and "error" not in r]
        best_v = min(mine, key=lambda r: r["us"]) if mine else None
        timed = [rows[i] for i in impls if i in rows and "error" not in rows[i] and not i.endswith("+plan")
                 and rows[i].get("within_tolerance", True)]  # the best peer is one that could replace vattn
        best_p = min(timed, key=lambda r: r["us"]) if timed else None
        cells = [s, _cell(best_v) + (f" {best_v['planner']}" if best_v else "")]
        cells += [_cell(rows.get(i)) for i in impls]
        cells.append(f"{best_p['impl']} ({best_p['kv_dtype']})" if best_p else "-")
        cells.append(f"{best_p['us'] / best_v['us']:.2f}x" if best_p and best_v else "-")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _cell(r: dict | None) -> str:
    if r is None:
        return "-"
    if "error" in r:
        e = r["error"]
        return "**wrong** " + e.split("(")[0].removeprefix("wrong output: ").strip() if e.startswith("wrong") else \
            e.split(":")[0]
    ceil = r.get("read_ceiling_tbps")
    pct = f", {100 * r['tbps'] / ceil:.0f}%" if ceil else ""
    over = "" if r.get("within_tolerance", True) else " **over tolerance**"
    return f"{r['us']:.1f} ({r['tbps']:.2f}{pct}; err {r['rel_err']:.0e}{over})"
