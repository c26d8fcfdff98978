"""How long one engine cycle takes in model time: non-attention time + attention time of the batch.

A cycle (one speculative-decoding step, MTP / EAGLE) runs, for the decode sequences:
  target verify   attention_layers x one call, q_len = draft_tokens + 1 per sequence
  draft extend    draft_attention_layers x one call, q_len = tokens accepted this cycle (ragged 1..d+1)
  draft decode    draft_attention_layers x (draft_tokens - 1) calls, q_len 1
and prefills this cycle's chunks (chunked prefill, mixed into the same cycle). Decode attention time
comes from an AttentionBackend (pipeline/emulator/attention.py: vattn's cost model on any CPU, or the real
kernel timed on a GPU, which also carries the cost model so both are logged).
Prefill attention is a FLOP model: a chunk of c tokens over a cached prefix of p tokens costs
4 * q_heads * head_dim * c * (p + (c + 1) / 2) FLOPs (causal QK^T and PV) per layer, at
prefill_attention_tflops. Non-attention time = non_attn_base_us + non_attn_per_token_us * tokens
processed (prefill chunk tokens + (draft_tokens + 1) per decode sequence).
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.emulator import EmulatorConfig
from pipeline.emulator.attention import AttentionBackend


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
