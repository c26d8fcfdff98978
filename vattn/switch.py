"""The kernel switch: the environment variables that turn vattn on or off and pick its planner and kernel.

This is the whole set; an A/B recipe's arms may differ in these variables and in nothing else.

    VATTN        on (1, true, on, yes, or unset) | off (0, false, off, no).
                 Unset means ON: a server started with the vattn backend (or the emulator) is asked for
                 vattn, so `VATTN=0` is the one explicit way to get the baseline. A recipe must still set
                 it in both arms (pipeline/config/arms.py), so a run never depends on this default.
                 Read by the engines' gates (vattn.sglang's backend, the emulator's arm, the recipe
                 validation), and by hopper() and qk_mode() below: a direct vattn.attention() call always
                 runs vattn, on Triton where VATTN is off.
    VATTN_PLAN   vattn's split planner in an engine, one of vattn.planner.PLANNERS; unset or empty means
                 balanced. Read by vattn.sglang's backend (when it is made), the emulator's arm and the
                 recipe validation; it takes effect only while VATTN is on (the baseline has its own fixed
                 split). vattn.plan() never reads it: its mode= argument says (default balanced).
    VATTN_HOPPER 1 (or true/on/yes): vattn's Hopper kernel (vattn/hopper) serves the calls it covers on an
                 sm_90 GPU; unset, empty or 0: the Triton kernel. Read when vattn is imported (the backend
                 is registered then), and in effect only while VATTN is on: VATTN=0 registers no Hopper
                 kernel. A bad value (or a bad VATTN) does not fail `import vattn`: no Hopper kernel is
                 registered, and the first vattn.Workspace raises the ValueError.
    VATTN_QK     how Q.K^T rounds Q on the fp8-cache paths: split (unset or empty: Q as two e4m3 parts,
                 hi + lo/16, two fp8 dots; bf16-level accuracy, KERNEL.md's 2e-2) | e4m3 (Q rounded to e4m3
                 once, one fp8 dot, as XQA, FA3 and sglang's Triton kernels do: LOSSY, rel_err ~2.4e-2 to
                 3.5e-2 against the fp32 reference; BENCHMARKS.md "The lossy fast mode"). Paths that do not
                 split Q (16-bit caches, K widened to fp16) ignore it. Read when a workspace is made without
                 qk= (and by vattn.sglang's backend, the emulator's arm, the recipe validation); in effect
                 only while VATTN is on (off: split).

Off means the other three take no effect, not that they go unread: every reader parses each variable
that is set, whatever VATTN says, and refuses a bad value with a ValueError naming it (as the recipe
validation does for both arms), so a typo in the baseline arm is reported there, not carried silently
into the arm that reads it. Every reader of the switch (the sglang gate, the emulator, the recipe
validation, vattn's import and workspaces) parses it here, so one value means one thing everywhere.
Pure Python: no torch, no triton, nothing outside vattn.
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
    """Whether vattn's Hopper kernel is asked for (VATTN_HOPPER on while VATTN is on), read from `env` (default:
    this process's environment). Both values are parsed, whatever the other says."""
    env = os.environ if env is None else env
    on = parse_vattn(env.get(VATTN))
    return parse_hopper(env.get(VATTN_HOPPER)) and on


def qk_mode(env: Mapping[str, str] | None = None) -> str:
    """How vattn's fp8-cache paths round Q for Q.K^T (VATTN_QK while VATTN is on, else split), read from `env`
    (default: this process's environment). Both values are parsed, whatever the other says."""
    env = os.environ if env is None else env
    on = parse_vattn(env.get(VATTN))
    mode = parse_qk(env.get(VATTN_QK))
    return mode if on else QK_MODES[0]


def check(env: Mapping[str, str] | None = None) -> None:
    """Parse every switch variable set in `env` (default: this process's environment), whatever VATTN says:
    a bad value raises the ValueError of its parser."""
    env = os.environ if env is None else env
    for var, parse in ((VATTN, parse_vattn), (VATTN_PLAN, parse_plan), (VATTN_HOPPER, parse_hopper),
                       (VATTN_QK, parse_qk)):
        if var in env:
            parse(env[var])


def switch_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The switch variables that are set in `env`, for logs and server info."""
    env = os.environ if env is None else env
    return {k: env[k] for k in SWITCH_VARS if k in env}
