"""The arms' rule: they differ in the kernel switch (vattn/switch.py) and in nothing else."""
from __future__ import annotations

import pytest

from pipeline.config.base import RecipeError
from pipeline.config.recipe import load_recipe
from pipeline.plan import build_plan


def _arms(off: dict, on: dict, **extra) -> dict:
    return {"off": {"env": off, **extra}, "on": {"env": on, **extra}}


# -- guarantee: the switch is set explicitly in both arms (an unset VATTN means on, vattn/switch.py)

@pytest.mark.parametrize("off, on, arm", [({}, {"VATTN": "1"}, "off"),
                                          ({"VATTN_PLAN": "fixed"}, {"VATTN": "1"}, "off"),
                                          ({"VATTN": "0"}, {"VATTN_PLAN": "balanced"}, "on")])
def test_each_arm_must_set_vattn(write_recipe, off, on, arm):
    # Before: an off arm with an empty env passed, and under sglang (unset = on) both arms ran vattn.
    found = {"off": off, "on": on}[arm]
    with pytest.raises(RecipeError, match=rf"arms\.{arm}\.env: VATTN is not set \(found {found}\); set it in "
                                          r"both arms, e\.g\. off: \{VATTN: '0'\}, on: \{VATTN: '1'\}"):
        load_recipe(write_recipe(arms=_arms(off, on)))


def test_switch_values_are_parsed_as_the_engines_parse_them(write_recipe):
    with pytest.raises(RecipeError, match=r"arms\.on\.env\.VATTN: got 'maybe'; allowed: 0 or 1"):
        load_recipe(write_recipe(arms=_arms({"VATTN": "0"}, {"VATTN": "maybe"})))
    with pytest.raises(RecipeError, match=r"arms\.on\.env\.VATTN_PLAN: got 'greedy'; allowed: fixed, length_aware, "
                                          r"balanced"):
        load_recipe(write_recipe(arms=_arms({"VATTN": "0"}, {"VATTN": "1", "VATTN_PLAN": "greedy"})))


@pytest.mark.parametrize("off, on", [({"VATTN": "1"}, {"VATTN": "1"}),
                                     ({"VATTN": "1"}, {"VATTN": "true", "VATTN_PLAN": "balanced"}),
                                     ({"VATTN": "0", "VATTN_PLAN": "fixed"}, {"VATTN": "0", "VATTN_PLAN": "balanced"})])
def test_arms_must_ask_for_different_kernels(write_recipe, off, on):
    # spelled differently is not enough: the baseline ignores VATTN_PLAN, and 1 == true
    with pytest.raises(RecipeError, match=r"arms\.on\.env: .* asks for the same kernel as arms\.off\.env"):
        load_recipe(write_recipe(arms=_arms(off, on)))


def test_planner_ab_with_vattn_on_in_both_arms_is_valid(write_recipe):
    # the kernel-in-the-loop recipes compare vattn's fixed split with its balanced planner
    r = load_recipe(write_recipe(arms=_arms({"VATTN": "1", "VATTN_PLAN": "fixed"},
                                            {"VATTN": "1", "VATTN_PLAN": "balanced"})))
    assert r.arms["off"].env["VATTN_PLAN"] == "fixed"


def test_a_kernel_ab_triton_against_hopper_is_valid_and_its_values_are_checked(write_recipe):
    r = load_recipe(write_recipe(arms=_arms({"VATTN": "1"}, {"VATTN": "1", "VATTN_HOPPER": "1"})))
    assert r.arms["on"].env["VATTN_HOPPER"] == "1"
    with pytest.raises(RecipeError, match=r"arms\.on\.env\.VATTN_HOPPER: got 'sm90'; allowed: 0 or 1"):
        load_recipe(write_recipe(arms=_arms({"VATTN": "1"}, {"VATTN": "1", "VATTN_HOPPER": "sm90"})))
    # the baseline reads neither the planner nor the kernel choice: off with and without VATTN_HOPPER is one kernel
    with pytest.raises(RecipeError, match=r"asks for the same kernel"):
        load_recipe(write_recipe(arms=_arms({"VATTN": "0"}, {"VATTN": "0", "VATTN_HOPPER": "1"})))


def test_an_ab_of_the_lossy_qk_mode_is_valid_and_its_values_are_checked(write_recipe):
    # the A/B that shows whether one-pass Q.K^T changes answers: vattn accurate against vattn lossy
    r = load_recipe(write_recipe(arms=_arms({"VATTN": "1"}, {"VATTN": "1", "VATTN_QK": "e4m3"})))
    assert r.arms["on"].env["VATTN_QK"] == "e4m3"
    with pytest.raises(RecipeError, match=r"arms\.on\.env\.VATTN_QK: got 'fp8'; allowed: split, e4m3"):
        load_recipe(write_recipe(arms=_arms({"VATTN": "1"}, {"VATTN": "1", "VATTN_QK": "fp8"})))
    # VATTN=0 reads no VATTN_QK, and split is the default: neither pair asks for two kernels
    for off, on in (({"VATTN": "0"}, {"VATTN": "0", "VATTN_QK": "e4m3"}),
                    ({"VATTN": "1"}, {"VATTN": "1", "VATTN_QK": "split"})):
        with pytest.raises(RecipeError, match=r"asks for the same kernel"):
            load_recipe(write_recipe(arms=_arms(off, on)))


def test_the_switch_does_not_belong_in_server_env(write_recipe):
    with pytest.raises(RecipeError, match=r"server\.env: sets VATTN; the kernel switch belongs in arms\.<arm>\.env"):
        load_recipe(write_recipe(server={"env": {"VATTN": "1"}}))


# -- guarantee: the switch is vattn's fixed set; switch_vars may only narrow it

def test_switch_vars_cannot_name_other_variables(write_recipe):
    # Before: switch_vars [VATTN, NCCL_ALGO] let the arms differ in NCCL_ALGO as "the kernel switch".
    arms = _arms({"VATTN": "0", "NCCL_ALGO": "ring"}, {"VATTN": "1", "NCCL_ALGO": "tree"})
    with pytest.raises(RecipeError, match=r"switch_vars: 'NCCL_ALGO' is not a kernel switch variable; "
                                          r"allowed: VATTN, VATTN_PLAN, VATTN_HOPPER, VATTN_QK \(vattn/switch\.py\)\..* \(found "
                                          r"\['VATTN', 'NCCL_ALGO'\]\)"):
        load_recipe(write_recipe(arms=arms, switch_vars=["VATTN", "NCCL_ALGO"]))


def test_switch_vars_may_narrow_the_switch(write_recipe):
    arms = _arms({"VATTN": "1", "VATTN_PLAN": "fixed"}, {"VATTN": "1", "VATTN_PLAN": "balanced"})
    with pytest.raises(RecipeError, match=r"arms\.on\.env: differs from arms\.off in VATTN_PLAN; arms may differ "
                                          r"only in the kernel switch \['VATTN'\]"):
        load_recipe(write_recipe(arms=arms, switch_vars=["VATTN"]))


def test_arms_may_differ_only_in_the_switch(write_recipe):
    arms = _arms({"VATTN": "0", "NCCL_ALGO": "ring"}, {"VATTN": "1", "NCCL_ALGO": "tree"})
    with pytest.raises(RecipeError, match=r"arms.on.env: differs from arms.off in NCCL_ALGO; arms may differ only "
                                          r"in the kernel switch \['VATTN', 'VATTN_PLAN', 'VATTN_HOPPER', 'VATTN_QK'\]"):
        load_recipe(write_recipe(arms=arms))
    arms = {"off": {"env": {"VATTN": "0"}, "server_args": {"tp": 2}}, "on": {"env": {"VATTN": "1"}}}
    with pytest.raises(RecipeError, match=r"arms.on.server_args: differs from arms.off.server_args; arms may differ "
                                          r"only in the kernel switch"):
        load_recipe(write_recipe(arms=arms))
    arms = _arms({"VATTN": "0", "CUDA_VISIBLE_DEVICES": "0"}, {"VATTN": "1"})
    with pytest.raises(RecipeError, match=r"arms.off.env: sets CUDA_VISIBLE_DEVICES; placement assigns GPUs"):
        load_recipe(write_recipe(arms=arms))
    with pytest.raises(RecipeError, match=r"arms: .*found arms \['baseline', 'on'\]"):
        load_recipe(write_recipe(arms={"baseline": {}, "on": {"env": {"VATTN": "1"}}}))


# -- guarantee: server_args set (equally) on both arms reach the command line

@pytest.mark.parametrize("server_args", [{}, {"max_running_requests": 8}, ["--max-running-requests", "8"]])
def test_equal_arm_server_args_reach_argv(write_recipe, tmp_path, server_args):
    # Before: {attention_backend: triton} on both arms was validated, then dropped from argv.
    arms = _arms({"VATTN": "0"}, {"VATTN": "1"}, server_args={"attention_backend": "triton"})
    recipe = write_recipe(engine="sglang", arms=arms, server={"args": server_args})
    plan = build_plan(load_recipe(recipe), tmp_path / "run")
    for a in plan.arm_runs:
        i = a.argv.index("--attention-backend")
        assert a.argv[i + 1] == "triton", a.argv
        if server_args:  # server.args are still there, before the arm's flags
            assert a.argv.index("--max-running-requests") < i
