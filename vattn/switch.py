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
    VATTN_QK     how Q.K^T rounds Q on the fp8-cache paths: split (unset or empty: Q as two e4m3 parts,
                 hi + lo/16, two fp8 dots; bf16-level accuracy, KERNEL.md's 2e-2) | e4m3 (Q rounded to e4m3
                 once, one fp8 dot, as XQA, FA3 and sglang's Triton kernels do: LOSSY, rel_err ~2.4e-2 to
                 3.5e-2 against the fp32 reference; BENCHMARKS.md "The lossy fast mode"). Paths that do not
                 split Q (16-bit caches, K widened to fp16) ignore it. Read when a workspace is made, and only
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
VATTN_QK = "VATTN_QK"
SWITCH_VARS = (VATTN, VATTN_PLAN, VATTN_HOPPER, VATTN_QK)
QK_MODES = ("split", "e4m3")  # the first is the default; "e4m3" is the lossy fast mode
LOSSY_QK = "e4m3"
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


def parse_qk(value: str | None) -> str:
    """The Q.K^T rounding one VATTN_QK value names; None or empty means split (the accurate default)."""
    mode = (value or "").strip().lower() or QK_MODES[0]
    if mode not in QK_MODES:
        raise ValueError(f"VATTN_QK: got {value!r}; allowed: {', '.join(QK_MODES)} (unset means {QK_MODES[0]}; "
                         f"{LOSSY_QK} is lossy)")
    return mode


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


def qk_mode(env: Mapping[str, str] | None = None) -> str:
    """How vattn's fp8-cache paths round Q for Q.K^T, read from `env` (default: this process's environment)."""
    env = os.environ if env is None else env
    return parse_qk(env.get(VATTN_QK))


def switch_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The switch variables that are set in `env`, for logs and server info."""
    env = os.environ if env is None else env
    return {k: env[k] for k in SWITCH_VARS if k in env}
