"""The arm an emulator serves, read from the kernel switch in its environment (vattn/switch.py)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from pipeline.config.emulator import ConfigError
from vattn import switch


@dataclass(frozen=True)
class Arm:
    """The kernel settings an engine reads from its environment (the A/B switch)."""

    vattn: bool
    impl: str       # "vattn" | "baseline"
    planner: str    # split planner used by `impl`

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Arm":
        """VATTN off: the baseline kernel with its fixed split (VATTN_PLAN is not read); on (unset
        included, as in sglang): vattn with VATTN_PLAN's planner."""
        try:
            if not switch.enabled(env):
                return cls(vattn=False, impl="baseline", planner="fixed")
            return cls(vattn=True, impl="vattn", planner=switch.plan_mode(env))
        except ValueError as e:
            raise ConfigError(f"env {e}") from None

    def info(self, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "env": switch.switch_env(env)}
