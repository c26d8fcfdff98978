"""Attention time from vattn's cost model (plan + main + reduce makespan) on a hardware profile.

The emulator's default attention model, and the prediction the kernel-in-the-loop model logs beside
each measurement (pipeline/emulator/kernel_attention.py); pipeline/emulator/attention.py picks one.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.config.emulator import ConfigError, EmulatorConfig
from pipeline.emulator.arm import Arm
from pipeline.paths import HARDWARE_PROFILES_DIR


class CostModelAttention:
    """vattn's cost model on a hardware profile; runs on any CPU."""

    name = "model"

    def __init__(self, cfg: EmulatorConfig, arm: Arm):
        from vattn import cost  # numpy-heavy; the emulator's --help does not need it

        self._predict = cost.predict_attention_us
        try:
            self.profile = cost.load_profile(cfg.hardware, HARDWARE_PROFILES_DIR)
        except (ValueError, OSError) as e:
            raise ConfigError(f"hardware: {cfg.hardware!r}: {e}") from None
        self._kw = dict(impl=arm.impl, planner=arm.planner, profile=self.profile, num_kv_heads=cfg.num_kv_heads,
                        head_dim=cfg.head_dim, gqa=cfg.gqa, kv_dtype=cfg.kv_dtype, page_size=cfg.page_size,
                        qk=arm.qk)
        try:  # a kernel path the profile has no figures for fails here, at start, not at the first request
            self.layer_us([1024], [cfg.draft_tokens + 1])
        except ValueError as e:
            raise ConfigError(f"hardware: {cfg.hardware!r} cannot time arm {arm.impl} (VATTN_QK={arm.qk}): "
                              f"{e}") from None

    def layer_us(self, seq_lens: list[int], q_lens: list[int]) -> float:
        return self._predict(seq_lens, q_lens, **self._kw)

    def info(self) -> dict[str, Any]:
        p = self.profile
        profile = dataclasses.asdict(p) if dataclasses.is_dataclass(p) else dict(vars(p))
        return {"attention": self.name, "hardware": profile}
