"""How long one engine cycle takes in model time: non-attention time + attention time of the batch.

A cycle (one speculative-decoding step, MTP / EAGLE) runs, for the decode sequences:
  target verify   attention_layers x one call, q_len = draft_tokens + 1 per sequence
  draft extend    draft_attention_layers x one call, q_len = tokens accepted this cycle (ragged 1..d+1)
  draft decode    draft_attention_layers x (draft_tokens - 1) calls, q_len 1
and prefills this cycle's chunks (chunked prefill, mixed into the same cycle). Decode attention time
comes from an AttentionBackend (the strategy: vattn's cost model on any CPU, or the real kernel timed on
a GPU: pipeline/emulator/kernel_attention.py, which also carries the cost model so both are logged).
Prefill attention is a FLOP model: a chunk of c tokens over a cached prefix of p tokens costs
4 * q_heads * head_dim * c * (p + (c + 1) / 2) FLOPs (causal QK^T and PV) per layer, at
prefill_attention_tflops. Non-attention time = non_attn_base_us + non_attn_per_token_us * tokens
processed (prefill chunk tokens + (draft_tokens + 1) per decode sequence).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from pipeline.emulator.config import ConfigError, EmulatorConfig
from pipeline.paths import HARDWARE_PROFILES_DIR
from vattn.planner import PLANNERS


@dataclass(frozen=True)
class Arm:
    """The kernel settings an engine reads from its environment (the A/B switch)."""

    vattn: bool
    impl: str       # "vattn" | "baseline"
    planner: str    # split planner used by `impl`

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Arm":
        env = os.environ if env is None else env
        flag = env.get("VATTN", "0")
        if flag not in ("0", "1"):
            raise ConfigError(f"env VATTN: {flag!r} is not allowed; set VATTN=0 (baseline) or VATTN=1 (vattn)")
        plan = env.get("VATTN_PLAN", "balanced")
        if plan not in PLANNERS:
            raise ConfigError(f"env VATTN_PLAN: {plan!r} is not allowed; allowed: {', '.join(PLANNERS)}")
        if flag == "0":
            return cls(vattn=False, impl="baseline", planner="fixed")
        return cls(vattn=True, impl="vattn", planner=plan)

    def info(self) -> dict[str, Any]:
        env = {k: os.environ[k] for k in ("VATTN", "VATTN_PLAN") if k in os.environ}
        return {**dataclasses.asdict(self), "env": env}


class AttentionBackend(Protocol):
    """Time of ONE attention-layer call on this batch, in microseconds."""

    name: str

    def layer_us(self, seq_lens: list[int], q_lens: list[int]) -> float: ...

    def info(self) -> dict[str, Any]: ...


class CostModelAttention:
    """vattn's cost model (plan + main + reduce makespan) on a hardware profile; runs on any CPU."""

    name = "model"

    def __init__(self, cfg: EmulatorConfig, arm: Arm):
        from vattn import cost

        self._predict = cost.predict_attention_us
        try:
            self.profile = cost.load_profile(cfg.hardware, HARDWARE_PROFILES_DIR)
        except (ValueError, OSError) as e:
            raise ConfigError(f"hardware: {cfg.hardware!r}: {e}") from None
        self._kw = dict(impl=arm.impl, planner=arm.planner, profile=self.profile, num_kv_heads=cfg.num_kv_heads,
                        head_dim=cfg.head_dim, gqa=cfg.gqa, kv_dtype=cfg.kv_dtype, page_size=cfg.page_size)

    def layer_us(self, seq_lens: list[int], q_lens: list[int]) -> float:
        return self._predict(seq_lens, q_lens, **self._kw)

    def info(self) -> dict[str, Any]:
        p = self.profile
        profile = dataclasses.asdict(p) if dataclasses.is_dataclass(p) else dict(vars(p))
        return {"attention": self.name, "hardware": profile}


def make_attention(cfg: EmulatorConfig, arm: Arm) -> AttentionBackend:
    if cfg.attention == "kernel":  # torch and vattn load only when the kernel runs
        from pipeline.emulator.kernel_attention import KernelAttention

        return KernelAttention(cfg, arm)
    return CostModelAttention(cfg, arm)


@dataclass(frozen=True)
class CycleTime:
    verify_us: float        # target-model attention, all layers
    draft_us: float         # draft-model attention (extend + decodes), all layers
    prefill_attn_us: float  # prefill-chunk attention, all layers (target + draft)
    non_attn_us: float
    # kernel in the loop only: the cost model's verify + draft for the same calls (all layers), and one
    # verify layer's time, measured and predicted
    predicted_us: float | None = None
    verify_layer_us: float | None = None
    predicted_verify_layer_us: float | None = None

    @property
    def attn_us(self) -> float:
        return self.verify_us + self.draft_us + self.prefill_attn_us

    @property
    def step_us(self) -> float:
        return self.attn_us + self.non_attn_us


class StepTimer:
    def __init__(self, cfg: EmulatorConfig, attention: AttentionBackend):
        self.cfg = cfg
        self.attention = attention
        # a measuring backend (the kernel) carries the cost model for the same calls: logged, not slept
        self.predictor: AttentionBackend | None = getattr(attention, "predictor", None)
        self._q_heads = cfg.num_kv_heads * cfg.gqa

    def cycle(self, ctx_lens: list[int], accepted: list[int], prefill: list[tuple[int, int]]) -> CycleTime:
        """ctx_lens: tokens in each decode sequence's KV before this cycle; accepted: tokens it emits;
        prefill: (cached prefix, chunk) of each prefill chunk."""
        cfg = self.cfg
        verify_layer, verify, draft = self._decode_attention(self.attention, ctx_lens, accepted)
        extra = {}
        if self.predictor is not None:
            p_layer, p_verify, p_draft = self._decode_attention(self.predictor, ctx_lens, accepted)
            extra = dict(predicted_us=p_verify + p_draft, verify_layer_us=verify_layer,
                         predicted_verify_layer_us=p_layer)
        flops = sum(4.0 * self._q_heads * cfg.head_dim * c * (p + (c + 1) / 2) for p, c in prefill)
        prefill_us = flops / (cfg.prefill_attention_tflops * 1e6) * (cfg.attention_layers + cfg.draft_attention_layers)
        tokens = sum(c for _, c in prefill) + len(ctx_lens) * (cfg.draft_tokens + 1)
        non_attn = cfg.non_attn_base_us + cfg.non_attn_per_token_us * tokens
        return CycleTime(verify, draft, prefill_us, non_attn, **extra)

    def _decode_attention(self, att: AttentionBackend, ctx_lens: list[int],
                          accepted: list[int]) -> tuple[float, float, float]:
        """(one verify layer, verify all layers, draft all layers) of the decode sequences, in us."""
        cfg, d = self.cfg, self.cfg.draft_tokens
        if not ctx_lens:
            return 0.0, 0.0, 0.0
        q = d + 1
        layer = att.layer_us([n + q - 1 for n in ctx_lens], [q] * len(ctx_lens))
        draft = 0.0
        if d and cfg.draft_attention_layers:
            ext = att.layer_us([n + a - 1 for n, a in zip(ctx_lens, accepted)], accepted)
            dec = att.layer_us([n + a for n, a in zip(ctx_lens, accepted)], [1] * len(ctx_lens)) if d > 1 else 0.0
            draft = cfg.draft_attention_layers * (ext + (d - 1) * dec)
        return layer, cfg.attention_layers * layer, draft
