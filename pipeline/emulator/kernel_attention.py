"""Kernel-in-the-loop attention: run the arm's real vattn kernel on each call's batch and time it.

Each call the StepTimer makes (target verify q = draft+1, draft extend ragged 1..draft+1, draft decode
q = 1) runs `vattn.plan` + `vattn.attention` ONCE on a device KV pool and is timed with CUDA events; the
StepTimer multiplies that one layer by the layer count. Why one layer and not every layer: all attention
layers of the model have the same shape, so N launches would measure the same thing N times while the
cycle's Python work (which must fit inside the cycle's sleep) grew N-fold; and a single call reads its
pages cold from HBM, as each layer of a real step does (a layer's KV was last touched a whole step ago),
whereas N back-to-back calls over one pool would not be cold from the second on. The timed region is
plan + main + reduce, the span the cost model predicts (`predict_attention_us`), so the two compare
like for like (a real engine plans once per step, not per layer: a few us per layer overstated).

The pool: K and V pages `[num_pages, page_size, Hkv, D]` of random values, allocated once. Attention
time depends on the bytes read and the access pattern, not on the values, so a batch whose pages exceed
the pool reuses (aliases) pages round-robin: a reused page comes back only after the rest of the pool
has streamed through, and the pool is kept >= MIN_POOL_BYTES (many times the H200's 60 MB L2), so every
read is still an HBM read. Page ids walk a fixed random permutation of the pool (a long-running server's
pages are scattered) from an offset that advances by each call's pages, so consecutive calls read
different pages.

Timing without the host in it: a busy-wait kernel (`torch.cuda._sleep`) is queued before the start
event, so the plan, main and reduce launches are all queued before the GPU reaches them and the events
time the kernels back to back, as a CUDA graph would run them. If the host's enqueue took longer than
the wait, the GPU may have idled inside the timed region: the call is timed again (on fresh pages) and,
unless the slow enqueue was a late Triton compile, the wait doubles for the next calls.
"""
from __future__ import annotations

import math
import time
from typing import Any

from pipeline.config.emulator import ConfigError, EmulatorConfig
from pipeline.emulator.arm import Arm
from pipeline.emulator.cost_attention import CostModelAttention

GIB = 1 << 30
MIN_POOL_BYTES = 1 * GIB  # >> 60 MB L2: a page reused round-robin has long left the cache
SLEEP_CYCLES = 1_000_000   # ~0.5 ms at the H200's ~2 GHz: covers the Python launch path of 3 kernels
MAX_SLEEP_CYCLES = 4_000_000
COMPILE_US = 20_000        # an enqueue this slow was a (late) Triton compile, not the launch path
RETRIES = 3
KV_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "bf16": "bfloat16"}
ENV_HINT = ("for a kernel-in-the-loop A/B set arms.off.env to VATTN=1 VATTN_PLAN=fixed and arms.on.env to "
            "VATTN=1 VATTN_PLAN=balanced")


class KernelTimer:
    """Times one vattn call (plan + main + reduce) per batch on a random paged KV pool.

    device: "cuda" (CUDA events) or "cpu" (only under TRITON_INTERPRET=1: perf_counter, for plumbing
    tests). kv_dtype, q_dtype: torch dtypes. pool_pages: pages in each of the K and V pools.
    """

    def __init__(self, *, num_kv_heads: int, gqa: int, head_dim: int, page_size: int, kv_dtype, q_dtype,
                 max_batch: int, max_q_len: int, planner: str, pool_pages: int, device: str = "cuda",
                 seed: int = 0, qk: str = "split"):
        import torch

        import vattn

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.planner, self.page_size = planner, page_size
        self.num_kv_heads, self.max_batch, self.max_q_len = num_kv_heads, max_batch, max_q_len
        self.ws = vattn.Workspace(head_dim=head_dim, num_q_heads=num_kv_heads * gqa, num_kv_heads=num_kv_heads,
                                  kv_dtype=kv_dtype, q_dtype=q_dtype, page_size=page_size, max_q_len=max_q_len,
                                  max_batch=max_batch, device=self.device, qk=qk)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        shape = (pool_pages, page_size, num_kv_heads, head_dim)
        self.k_cache = _random_pool(shape, kv_dtype, self.device, gen)
        self.v_cache = _random_pool(shape, kv_dtype, self.device, gen)
        self.pool_pages = pool_pages
        # a long-running server's pages are scattered over its pool
        self.perm = torch.randperm(pool_pages, generator=gen, device=self.device).to(torch.int32)
        self.offset = 0
        hq = num_kv_heads * gqa
        self.q = (torch.randn(max_batch * max_q_len, hq, head_dim, generator=gen, device=self.device)
                  .to(q_dtype))
        self.out = torch.empty_like(self.q)
        fp8 = kv_dtype == torch.float8_e4m3fn
        one = torch.ones(1, dtype=torch.float32, device=self.device)
        self.k_descale, self.v_descale = (one, one.clone()) if fp8 else (None, None)
        self.sleep_cycles = SLEEP_CYCLES
        self.calls = 0
        self.host_bound = 0  # calls whose enqueue outlasted the wait (their time may include host gaps)

    @property
    def pool_bytes(self) -> int:
        return 2 * self.k_cache.numel() * self.k_cache.element_size()

    def _inputs(self, seq_lens: list[int], q_lens: list[int]):
        import torch

        p = self.page_size
        pages = [max(1, -(-n // p)) for n in seq_lens]
        starts, acc = [], self.offset
        for n in pages:
            starts.append(acc)
            acc += n
        self.offset = acc % self.pool_pages
        cu = [0]
        for q in q_lens:
            cu.append(cu[-1] + q)
        i32 = dict(dtype=torch.int32, device=self.device)
        lens = torch.tensor(seq_lens, **i32)
        cu_q = torch.tensor(cu, **i32)
        # block_tables [B, max_pages]: page j of sequence b is perm[(start_b + j) % pool_pages]
        idx = torch.tensor(starts, dtype=torch.int64, device=self.device)[:, None] + \
            torch.arange(max(pages), dtype=torch.int64, device=self.device)[None, :]
        block_tables = self.perm[idx % self.pool_pages].contiguous()
        return lens, cu_q, block_tables, cu[-1]

    def _run(self, lens, cu_q, block_tables, tokens: int) -> None:
        import vattn

        plan = vattn.plan(lens, cu_q, num_kv_heads=self.num_kv_heads, page_size=self.page_size,
                          mode=self.planner, workspace=self.ws)
        vattn.attention(self.q[:tokens], self.k_cache, self.v_cache, block_tables, lens, cu_q,
                        self.k_descale, self.v_descale, None, plan=plan, out=self.out[:tokens])

    def time_us(self, seq_lens: list[int], q_lens: list[int]) -> float:
        """Time (us) of one layer's call: plan + main + reduce on this batch."""
        if not seq_lens:
            return 0.0
        if len(seq_lens) > self.max_batch or max(q_lens) > self.max_q_len:
            raise ValueError(f"batch: {len(seq_lens)} sequences, q_len up to {max(q_lens)}; this timer was sized "
                             f"for max_batch={self.max_batch}, max_q_len={self.max_q_len}")
        self.calls += 1
        if not self.cuda:
            inputs = self._inputs(seq_lens, q_lens)
            t = time.perf_counter()
            self._run(*inputs)
            return (time.perf_counter() - t) * 1e6
        for _ in range(RETRIES):  # a host-bound timing (a late compile, a slow launch) is taken again
            us, clean = self._time_cuda(*self._inputs(seq_lens, q_lens))
            if clean:
                break
        return us

    def _time_cuda(self, lens, cu_q, block_tables, tokens: int) -> tuple[float, bool]:
        """(us, clean): clean = the GPU had every launch queued before it reached them."""
        import torch

        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        ev[0].record()
        torch.cuda._sleep(self.sleep_cycles)
        ev[1].record()
        t = time.perf_counter()
        self._run(lens, cu_q, block_tables, tokens)
        enqueue_us = (time.perf_counter() - t) * 1e6
        ev[2].record()
        ev[2].synchronize()
        clean = enqueue_us < ev[0].elapsed_time(ev[1]) * 1e3
        if not clean:
            self.host_bound += 1
            if enqueue_us < COMPILE_US:  # the launch path outran the wait: wait longer from now on
                self.sleep_cycles = min(2 * self.sleep_cycles, MAX_SLEEP_CYCLES)
        return ev[1].elapsed_time(ev[2]) * 1e3, clean

    def warmup(self, q_patterns: list[list[int]], batches: list[int]) -> None:
        """Compile every kernel variant the run will launch before serving: Triton compiles per constexpr
        set and specialises int arguments (== 1, % 16 == 0), so sweep batch sizes and page counts."""
        p = self.page_size
        for b in batches:
            for pages in (1, 16, 17):
                for pattern in q_patterns:
                    qs = [pattern[i % len(pattern)] for i in range(b)]
                    self.time_us([max(q, pages * p - i % p) for i, q in enumerate(qs)], qs)
        self.host_bound = 0

    def info(self) -> dict[str, Any]:
        return {"workspace": self.ws.describe(), "pool_pages": self.pool_pages,
                "pool_gib": round(self.pool_bytes / GIB, 3), "calls": self.calls, "host_bound_calls": self.host_bound,
                "sleep_cycles": self.sleep_cycles}


def _random_pool(shape, dtype, device, gen):
    """Random K or V pages, filled in chunks so a many-GiB fp8 pool needs no bf16 copy of itself."""
    import torch

    pool = torch.empty(shape, dtype=dtype, device=device)
    flat = pool.view(-1)
    chunk = 1 << 26
    for i in range(0, flat.numel(), chunk):
        part = flat[i:i + chunk]
        part.copy_(torch.randn(part.numel(), generator=gen, device=device, dtype=torch.float32))
    return pool


def warmup_batches(max_batch: int) -> list[int]:
    """Batch sizes that reach every specialisation: every size up to 17 (Triton specialises the planner's
    int arguments — batch, work-list width — on == 1 and % 16 == 0, and the width varies with the batch),
    then each power of two (the planner's BLOCK_B) and max_batch."""
    sizes = set(range(1, 18)) | {max_batch}
    b = 32
    while b <= max_batch:
        sizes.add(b)
        b *= 2
    return sorted(s for s in sizes if 1 <= s <= max_batch)


def pool_pages_for(cfg: EmulatorConfig) -> int:
    """Pages of the K (and of the V) pool: enough for max_running_requests full contexts, at most
    kernel_pool_gib for K and V together, at least MIN_POOL_BYTES (so reuse stays out of L2)."""
    elt = 1 if cfg.kv_dtype == "fp8_e4m3" else 2
    page_bytes = 2 * cfg.page_size * cfg.num_kv_heads * cfg.head_dim * elt  # K + V
    need = cfg.max_running_requests * math.ceil(cfg.max_context_tokens / cfg.page_size)
    cap = int(cfg.kernel_pool_gib * GIB) // page_bytes
    floor = MIN_POOL_BYTES // page_bytes
    return max(1, min(cap, max(need, floor)))


class KernelAttention:
    """AttentionBackend that runs the arm's vattn kernel on a CUDA GPU; `predictor` is the cost model for
    the same calls (StepTimer logs both)."""

    name = "kernel"

    def __init__(self, cfg: EmulatorConfig, arm: Arm, *, device: str | None = None, kv_dtype=None, q_dtype=None,
                 pool_pages: int | None = None):
        """device/kv_dtype/q_dtype/pool_pages: tests only (a CPU run under TRITON_INTERPRET=1 with fp16)."""
        import torch

        if device is None and not torch.cuda.is_available():
            raise ConfigError("attention: kernel needs a CUDA GPU; use attention: model on CPU")
        if not arm.vattn:
            raise ConfigError("attention: kernel runs the arm's kernel for real, and VATTN=0 asks for the baseline "
                              "kernel (FlashInfer), which the emulator cannot run (no peer kernel is wired in); "
                              + ENV_HINT)
        self.cfg, self.arm = cfg, arm
        try:  # a shape the kernel does not support (e.g. gqa > 16, draft_tokens + 1 > 8) is a config error
            self.timer = KernelTimer(
                num_kv_heads=cfg.num_kv_heads, gqa=cfg.gqa, head_dim=cfg.head_dim, page_size=cfg.page_size,
                kv_dtype=kv_dtype or getattr(torch, KV_DTYPES[cfg.kv_dtype]), q_dtype=q_dtype or torch.bfloat16,
                max_batch=cfg.max_running_requests, max_q_len=cfg.draft_tokens + 1, planner=arm.planner,
                pool_pages=pool_pages or pool_pages_for(cfg), device=device or "cuda", seed=cfg.seed, qk=arm.qk)
        except ValueError as e:
            raise ConfigError(f"attention: kernel: vattn refuses this model shape (gqa={cfg.gqa}, q_len = "
                              f"draft_tokens + 1 = {cfg.draft_tokens + 1}, head_dim={cfg.head_dim}): {e}") from None
        self.predictor = CostModelAttention(cfg, arm)
        self._match_slots()
        d = cfg.draft_tokens
        patterns = [[d + 1], list(range(1, d + 2))] + ([[1]] if d else [])
        self.timer.warmup(patterns, warmup_batches(cfg.max_running_requests))

    def _match_slots(self) -> None:
        """The prediction must plan the batch as the kernel does: with the device's SMs and the
        compiled kernel's occupancy (read by the workspace), not the profile's estimate."""
        import dataclasses

        import torch

        ws = self.timer.ws
        if ws.programs_per_sm and self.timer.cuda:
            sms = torch.cuda.get_device_properties(ws.device).multi_processor_count
            self.predictor.profile = dataclasses.replace(self.predictor.profile, sms=sms,
                                                         slots_per_sm=ws.programs_per_sm)
            self.predictor._kw["profile"] = self.predictor.profile

    def layer_us(self, seq_lens: list[int], q_lens: list[int]) -> float:
        return self.timer.time_us(seq_lens, q_lens)

    def info(self) -> dict[str, Any]:
        return {"attention": self.name, "kernel": {"impl": self.arm.impl, "planner": self.arm.planner,
                                                   "qk": self.arm.qk,
                                                   **self.timer.info()},
                **{k: v for k, v in self.predictor.info().items() if k != "attention"}}
