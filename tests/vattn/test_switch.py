"""The kernel switch (vattn/switch.py): one parser, one meaning of every value, unset included."""
from __future__ import annotations

import pytest

from vattn import switch
from vattn.planner import PLANNERS


@pytest.mark.parametrize("value, on", [(None, True), ("", True), ("1", True), ("true", True), (" On ", True),
                                       ("0", False), ("off", False), ("no", False)])
def test_vattn_values(value, on):
    assert switch.parse_vattn(value) is on
    env = {} if value is None else {"VATTN": value}
    assert switch.enabled(env) is on


def test_vattn_junk_is_refused_with_the_allowed_values():
    with pytest.raises(ValueError, match=r"VATTN: got 'maybe'; allowed: 0 or 1 .*unset means 1"):
        switch.enabled({"VATTN": "maybe"})


@pytest.mark.parametrize("value, plan", [(None, "balanced"), ("", "balanced"), ("fixed", "fixed"),
                                         ("length_aware", "length_aware")])
def test_plan_values(value, plan):
    assert switch.plan_mode({} if value is None else {"VATTN_PLAN": value}) == plan


def test_plan_junk_is_refused_with_vattns_planners():
    with pytest.raises(ValueError, match=r"VATTN_PLAN: got 'greedy'; allowed: fixed, length_aware, balanced"):
        switch.plan_mode({"VATTN_PLAN": "greedy"})
    assert switch.DEFAULT_PLAN in PLANNERS


def test_reads_the_process_env_by_default(monkeypatch):
    monkeypatch.delenv("VATTN", raising=False)
    monkeypatch.setenv("VATTN_PLAN", "fixed")
    assert switch.enabled() is True and switch.plan_mode() == "fixed"
    assert switch.switch_env() == {"VATTN_PLAN": "fixed"}


@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("1", True), (" Yes ", True),
                                       ("off", False)])
def test_hopper_values(value, on):
    assert switch.parse_hopper(value) is on
    assert switch.hopper({} if value is None else {"VATTN_HOPPER": value}) is on


def test_hopper_junk_is_refused_with_the_allowed_values():
    with pytest.raises(ValueError, match=r"VATTN_HOPPER: got 'sm90'; allowed: 0 or 1 .*unset means 0"):
        switch.hopper({"VATTN_HOPPER": "sm90"})


@pytest.mark.parametrize("value, mode", [(None, "split"), ("", "split"), ("split", "split"), (" E4M3 ", "e4m3")])
def test_qk_values(value, mode):
    assert switch.parse_qk(value) == mode
    assert switch.qk_mode({} if value is None else {"VATTN_QK": value}) == mode


def test_qk_junk_is_refused_naming_the_lossy_mode():
    with pytest.raises(ValueError, match=r"VATTN_QK: got 'fp8'; allowed: split, e4m3 "
                                         r"\(unset means split; e4m3 is lossy\)"):
        switch.qk_mode({"VATTN_QK": "fp8"})
    assert switch.VATTN_QK in switch.SWITCH_VARS


def test_vattn_off_takes_the_hopper_kernel_and_the_lossy_qk_out_of_effect():
    """VATTN=0 is the baseline arm: the Hopper kernel and VATTN_QK's lossy mode are vattn's, so off they are off,
    as the recipe validation and the emulator's arm already read them."""
    assert switch.hopper({"VATTN": "0", "VATTN_HOPPER": "1"}) is False
    assert switch.hopper({"VATTN": "1", "VATTN_HOPPER": "1"}) is True
    assert switch.qk_mode({"VATTN": "0", "VATTN_QK": "e4m3"}) == "split"
    assert switch.qk_mode({"VATTN_QK": "e4m3"}) == "e4m3"  # unset VATTN means on


@pytest.mark.parametrize("env, match", [
    ({"VATTN": "0", "VATTN_HOPPER": "sm90"}, r"^VATTN_HOPPER: got 'sm90'; allowed: 0 or 1"),
    ({"VATTN": "0", "VATTN_QK": "fp8"}, r"^VATTN_QK: got 'fp8'; allowed: split, e4m3"),
    ({"VATTN": "0", "VATTN_PLAN": "greedy"}, r"^VATTN_PLAN: got 'greedy'; allowed: fixed"),
    ({"VATTN": "maybe"}, r"^VATTN: got 'maybe'; allowed: 0 or 1"),
])
def test_a_bad_value_is_refused_even_in_the_off_arm(env, match):
    """Off means out of effect, not unread: every reader parses what is set (switch.check), so a typo in the
    baseline arm is named there."""
    with pytest.raises(ValueError, match=match):
        switch.check(env)
    if "VATTN_HOPPER" in env:
        with pytest.raises(ValueError, match=match):
            switch.hopper(env)
    if "VATTN_QK" in env:
        with pytest.raises(ValueError, match=match):
            switch.qk_mode(env)


def _in_a_fresh_process(code: str, **env) -> str:
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    base = {k: v for k, v in os.environ.items() if k not in switch.SWITCH_VARS}
    base["PYTHONPATH"] = os.pathsep.join([root, base.get("PYTHONPATH", "")])  # this tree's vattn
    proc = subprocess.run([sys.executable, "-c", code], env=base | env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_vattn_off_registers_no_hopper_kernel():
    code = "import vattn; print(','.join(b.name for b in vattn.api.BACKENDS))"
    assert _in_a_fresh_process(code, VATTN="0", VATTN_HOPPER="1") == "triton"


def test_a_bad_hopper_value_does_not_fail_the_import_and_the_first_workspace_names_it():
    """`import vattn` (its switch parser, its planner: the recipe validation's imports) must not die on the
    environment; the first workspace, where the kernel choice matters, raises the parser's ValueError."""
    code = ("import vattn, torch\n"
            "print(','.join(b.name for b in vattn.api.BACKENDS))\n"
            "try:\n"
            "    vattn.Workspace(head_dim=64, num_q_heads=2, num_kv_heads=1, kv_dtype=torch.float16, device='cpu')\n"
            "except ValueError as e:\n"
            "    print(e)\n")
    names, error = _in_a_fresh_process(code, VATTN_HOPPER="bogus").split("\n")
    assert names == "triton"
    assert error.startswith("VATTN_HOPPER: got 'bogus'; allowed: 0 or 1"), error
