"""The kernel switch: the environment variables that turn vattn on or off and pick its planner and kernel.

This is the whole set; an A/B recipe's arms may differ in these variables and in nothing else.

    VATTN        on (1, true, on, yes, or unset) | off (0, false, off, no).
                 Unset means ON: a server started with the vattn backend (or the emulator) is asked for
                 vattn, so `VATTN=0` is the one explicit way to get the baseline. A recipe must still set
                 it in both arms (pipeline/config/arms.py), so a run never depends on this default.
    VATTN_PLAN   vattn's split planner, one of vattn.planner.PLANNERS; unset or empty means balanced.
                 Read only while VATTN is on (the baseline has its own fixed split).
    VATTN_HOPPER 1 (or true/on/yes): vattn's Hopper kernel (vattn/hopper) serves the calls it covers on an
                 sm_90 GPU; unset, empty or 0: the Triton kernel. Read when vattn is imported, and only
                 while VATTN is on.

Every reader of the switch (the sglang gate, the emulator, the recipe validation) parses it here, so
one value means one thing everywhere. Pure Python: no torch, no triton, nothing outside vattn.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

from vattn.planner import PLANNERS

VATTN = "VATTN"
VATTN_PLAN = "VATTN_PLAN"
VATTN_HOPPER = "VATTN_HOPPER"
SWITCH_VARS = (VATTN, VATTN_PLAN, VATTN_HOPPER)
DEFAULT_PLAN = "balanced"
ON_VALUES = ("1", "true", "on", "yes")
OFF_VALUES = ("0", "false", "off", "no")


def parse_vattn(value: str | None) -> bool:
    """The meaning of one VATTN value: True = vattn serves, False = the baseline. None (unset) = on."""
    if value is None:
        return True
    flag = value.strip().lower()
    if flag in OFF_VALUES:
        return False
    if flag in ON_VALUES or flag == "":
        return True
    raise ValueError(f"VATTN: got {value!r}; allowed: 0 or 1 (also false/true, off/on, no/yes); "
                     f"unset means 1")


def parse_plan(value: str | None) -> str:
    """The planner one VATTN_PLAN value names; None or empty means DEFAULT_PLAN."""
    plan = (value or "").strip() or DEFAULT_PLAN
    if plan not in PLANNERS:
        raise ValueError(f"VATTN_PLAN: got {value!r}; allowed: {', '.join(PLANNERS)} "
                         f"(unset means {DEFAULT_PLAN})")
    return plan


def parse_hopper(value: str | None) -> bool:
    """The meaning of one VATTN_HOPPER value: True = the Hopper kernel where it applies. None or empty = off."""
    flag = (value or "").strip().lower()
    if flag in OFF_VALUES or flag == "":
        return False
    if flag in ON_VALUES:
        return True
    raise ValueError(f"VATTN_HOPPER: got {value!r}; allowed: 0 or 1 (also false/true, off/on, no/yes); "
                     f"unset means 0")


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether vattn serves, read from `env` (default: this process's environment)."""
    env = os.environ if env is None else env
    return parse_vattn(env.get(VATTN))


def plan_mode(env: Mapping[str, str] | None = None) -> str:
    """vattn's split planner, read from `env` (default: this process's environment)."""
    env = os.environ if env is None else env
    return parse_plan(env.get(VATTN_PLAN))


def hopper(env: Mapping[str, str] | None = None) -> bool:
    """Whether vattn's Hopper kernel is asked for, read from `env` (default: this process's environment)."""
    env = os.environ if env is None else env
    return parse_hopper(env.get(VATTN_HOPPER))


def switch_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The switch variables that are set in `env`, for logs and server info."""
    env = os.environ if env is None else env
    return {k: env[k] for k in SWITCH_VARS if k in env}
