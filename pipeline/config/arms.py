"""The recipe's `arms:` block and its one rule: the arms differ in the kernel switch and in nothing else.

The switch is vattn's fixed set of variables (vattn/switch.py: VATTN, VATTN_PLAN, VATTN_HOPPER, VATTN_QK), parsed
by the same function the sglang backend and the emulator use, so a recipe that validates means the same on every
engine. Both arms must set VATTN themselves: an unset VATTN means on, and a run must not hinge on a
default that a reader of the recipe cannot see.
"""
from __future__ import annotations

from typing import Mapping

from pydantic import Field

from pipeline.config.base import Strict
from pipeline.config.placement import PLACEMENT_VARS
from pipeline.config.server import EngineArgs, ServerSpec, args_to_argv
from vattn import switch

ARM_NAMES = ("off", "on")
SWITCH_HINT = "e.g. off: {VATTN: '0'}, on: {VATTN: '1'}"


class ArmSpec(Strict):
    env: dict[str, str] = Field(default_factory=dict,
                                description=f"the kernel switch ({', '.join(switch.SWITCH_VARS)}); "
                                            "VATTN is required, e.g. {VATTN: '1'}")
    server_args: EngineArgs | None = Field(
        None, description="engine flags added after server.args; must be the same in both arms "
                          "(shared flags are clearer under server.args)")


def check_switch_vars(names: list[str]) -> list[str]:
    """`switch_vars` may narrow the switch to part of vattn's fixed set, never widen it (the message
    goes under the field's own name, switch_vars)."""
    for name in names:
        if name not in switch.SWITCH_VARS:
            raise ValueError(f"{name!r} is not a kernel switch variable; allowed: "
                             f"{', '.join(switch.SWITCH_VARS)} (vattn/switch.py). Env that both arms need "
                             f"goes under server.env; anything else must be equal in both arms")
    return names


def _effect(env: Mapping[str, str]) -> tuple[bool, str | None, bool | None, str | None]:
    """What an arm's switch asks for: (vattn on, its planner, its Hopper kernel, its Q.K^T rounding); the last
    three take effect only when on (_check_switch_values parses them in both arms)."""
    on = switch.enabled(env)
    if not on:
        return False, None, None, None
    return True, switch.plan_mode(env), switch.hopper(env), switch.qk_mode(env)


def _check_switch_values(arm_name: str, env: Mapping[str, str]) -> None:
    if switch.VATTN not in env:
        raise ValueError(f"arms.{arm_name}.env: VATTN is not set (found {dict(env)}); set it in both arms, "
                         f"{SWITCH_HINT}. An unset VATTN means on, so the arm would not say which kernel it runs")
    for var, parse in ((switch.VATTN, switch.parse_vattn), (switch.VATTN_PLAN, switch.parse_plan),
                       (switch.VATTN_HOPPER, switch.parse_hopper), (switch.VATTN_QK, switch.parse_qk)):
        if var in env:
            try:
                parse(env[var])
            except ValueError as e:
                raise ValueError(f"arms.{arm_name}.env.{e}") from None


def check_arms(arms: dict[str, ArmSpec], server: ServerSpec, switch_vars: list[str]) -> None:
    """The arms differ only in the switch variables named by `switch_vars`, and differ in effect."""
    off, on = arms["off"], arms["on"]
    if off.server_args != on.server_args:
        raise ValueError("arms.on.server_args: differs from arms.off.server_args; arms may differ only in the "
                         "kernel switch (env). Put shared flags under server.args")
    in_server_env = [v for v in switch.SWITCH_VARS if v in server.env]
    if in_server_env:
        raise ValueError(f"server.env: sets {', '.join(in_server_env)}; the kernel switch belongs in "
                         f"arms.<arm>.env, {SWITCH_HINT}")
    for arm_name, arm in arms.items():
        for var in PLACEMENT_VARS:
            if var in arm.env:
                raise ValueError(f"arms.{arm_name}.env: sets {var}; placement assigns GPUs "
                                 f"(placement.gpus_per_arm, hosts.<host>.gpus)")
        _check_switch_values(arm_name, arm.env)
    differing = sorted(k for k in set(off.env) | set(on.env) if off.env.get(k) != on.env.get(k))
    extra = [k for k in differing if k not in switch_vars]
    if extra:
        raise ValueError(f"arms.on.env: differs from arms.off in {', '.join(extra)}; arms may differ only in "
                         f"the kernel switch {switch_vars} (set shared env under server.env)")
    if _effect(off.env) == _effect(on.env):
        raise ValueError(f"arms.on.env: {on.env} asks for the same kernel as arms.off.env {off.env}; the arms "
                         f"must differ in the kernel switch {switch_vars}, {SWITCH_HINT}")


def arm_server_args(server: ServerSpec, arm: ArmSpec) -> EngineArgs:
    """The engine flags one arm runs with: server.args, then the arm's own server_args.

    Two mappings merge key by key (the arm's value wins); otherwise the arm's argv follows
    server.args' argv, so a flag set on both arms reaches the command line either way.
    """
    extra = arm.server_args
    if not extra:
        return server.args
    if isinstance(server.args, dict) and isinstance(extra, dict):
        return {**server.args, **extra}
    return args_to_argv(server.args) + args_to_argv(extra)
