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
