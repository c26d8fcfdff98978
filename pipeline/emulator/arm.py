"""The arm an emulator serves, read from the kernel switch in its environment (vattn/switch.py)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from pipeline.config.emulator import ConfigError
from vattn import switch

# Test hook, not a kernel switch: the probability per output word that the emulated vattn kernel's numerics
# move the argmax. It goes in server.env (both arms alike, so the arms still differ only in the switch) and
# acts only where vattn serves; it shows what the report says when a kernel changes answers.
PERTURB_ENV = "EMULATOR_PERTURB_NUMERICS"


@dataclass(frozen=True)
class Arm:
    """The kernel settings an engine reads from its environment (the A/B switch)."""

    vattn: bool
    impl: str       # "vattn" | "vattn_hopper" (VATTN_HOPPER=1: vattn.cost's Hopper model) | "baseline"
    planner: str    # split planner used by `impl`
    flip_rate: float = 0.0   # PERTURB_ENV's value while vattn serves, else 0
    qk: str = "split"        # VATTN_QK while vattn serves ("e4m3": the lossy one-pass Q.K^T, timed by its own
                             # kernel paths; the emulator's answers do not model its numerics)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Arm":
        """VATTN off: the baseline kernel with its fixed split (VATTN_PLAN, VATTN_HOPPER and VATTN_QK take no effect,
        but a bad value of any is refused, as by every reader of the switch); on (unset included, as in sglang):
        vattn with VATTN_PLAN's planner, on its Hopper kernels with VATTN_HOPPER=1, rounding Q as VATTN_QK says."""
        try:
            switch.check(env)
            if not switch.enabled(env):
                return cls(vattn=False, impl="baseline", planner="fixed")
            impl = "vattn_hopper" if switch.hopper(env) else "vattn"
            return cls(vattn=True, impl=impl, planner=switch.plan_mode(env), flip_rate=perturb_rate(env),
                       qk=switch.qk_mode(env))
        except ValueError as e:
            raise ConfigError(f"env {e}") from None

    def info(self, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "env": switch.switch_env(env)}


def perturb_rate(env: Mapping[str, str] | None = None) -> float:
    """PERTURB_ENV as a probability in [0, 1); unset or empty is 0."""
    import os

    raw = ((os.environ if env is None else env).get(PERTURB_ENV) or "").strip()
    if not raw:
        return 0.0
    try:
        rate = float(raw)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"{PERTURB_ENV}: got {raw!r}; allowed: a probability per output word in [0, 1), "
                         f"e.g. 0.02; unset it for an exact kernel")
    return rate
