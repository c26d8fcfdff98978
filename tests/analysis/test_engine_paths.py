"""analysis.engine_paths on two small server logs whose totals can be checked by hand.

on.server.log: scheduler 10 publishes three cumulative lines (only its last counts), scheduler 11
one line; sum: vattn target_verify 198 + 100 = 298, draft_extend 200 + 100 = 300; base
target_verify 2, extend 40 + 20 = 60, other 1. Verify share 298 / 300 = 99.3%.
off.server.log: one scheduler, every forward on the base (flashinfer, sglang's default).
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from analysis import engine_paths as ep
from pipeline.paths import RunPaths

LOGS = Path(__file__).parent / "data" / "sglang_logs"


def _run(tmp_path, engine: str | None, arms=("off", "on"), logs: dict | None = None,
         envs: dict | None = None) -> SimpleNamespace:
    """The part of analysis.rundir.Run the section reads: the manifest and each arm run's paths."""
    paths = RunPaths(tmp_path / "run")
    runs = []
    for order, name in enumerate(arms, 1):
        arm = paths.arm(name)
        arm.root.mkdir(parents=True)
        src = LOGS / (logs or {}).get(name, f"{name}.server.log")
        if src.is_file():
            shutil.copy(src, arm.server_log)
        runs.append(SimpleNamespace(name=name, arm=name.split(".")[0], order=order, paths=arm))
    manifest = {"recipe": {"engine": engine}} if engine else {}
    if envs:  # the server env the plan gave each arm run
        manifest["plan"] = {"arm_runs": [{"name": n, "env": envs[n.split(".")[0]]} for n in arms]}
    return SimpleNamespace(root=paths.root, manifest=manifest, arm_runs=runs)


def test_log_paths_sums_the_last_line_of_each_scheduler():
    p = ep.log_paths((LOGS / "on.server.log").read_text())
    assert p["vattn"] == {"target_verify": 298, "draft_extend": 300, "decode": 0, "extend": 0, "other": 0}
    assert p["base"] == {"target_verify": 2, "draft_extend": 0, "decode": 0, "extend": 60, "other": 1}
    assert (p["base_backend"], p["base_source"], p["processes"]) == ("fa3", "VATTN_BASE", 2)
    assert p["graphs"] == ["target verify", "draft decode"]
    assert p["verify_share"] == pytest.approx(298 / 300)
    assert ep.check(True, p) == "ok"


def test_off_arm_with_no_vattn_forward_passes_and_a_low_share_fails():
    off = ep.log_paths((LOGS / "off.server.log").read_text())
    assert (off["base_backend"], off["base_source"], off["verify_share"]) == ("flashinfer", "sglang default", 0.0)
    assert ep.check(False, off) == "ok"
    assert ep.check(True, off) == "below 99%"
    assert ep.check(False, ep.log_paths((LOGS / "on.server.log").read_text())) == "vattn served 598 forwards"


def test_a_log_without_counters_has_no_share():
    p = ep.log_paths("[t] The server is fired up and ready to roll!\n")
    assert p["processes"] == 0 and p["base_backend"] is None and p["graphs"] == []
    assert math.isnan(p["verify_share"])
    assert ep.check(True, p) == "no verify forward counted"


def test_section_rows_per_arm_run(tmp_path):
    lines = ep.engine_paths_md(_run(tmp_path, "sglang"))
    assert lines[0] == ("| arm run | base backend | CUDA graphs captured | target_verify vattn / base | "
                        "draft_extend vattn / base | extend vattn / base | other vattn / base | verify on vattn | check |")
    assert lines[2] == ("| off | flashinfer (sglang default) | target verify | 0 / 300 | 0 / 300 | 0 / 60 | 0 / 0 "
                        "| 0.0% | ok |")
    assert lines[3] == ("| on | fa3 (VATTN_BASE) | target verify, draft decode | 298 / 2 | 300 / 0 | 0 / 60 | 0 / 1 "
                        "| 99.3% | ok |")


def test_expected_paths_follow_each_arm_runs_env():
    plan = lambda **envs: {"plan": {"arm_runs": [{"name": n, "env": e} for n, e in envs.items()]}}
    both = plan(off={"VATTN": "1"}, on={"VATTN": "1", "VATTN_QK": "e4m3"})
    assert (ep.expects_vattn(both, "off", "off"), ep.expects_vattn(both, "on", "on")) == (True, True)
    turned_off = plan(off={"VATTN": "0"}, on={"VATTN": "1"})
    assert (ep.expects_vattn(turned_off, "off", "off"), ep.expects_vattn(turned_off, "on", "on")) == (False, True)
    assert (ep.expects_vattn({}, "off", "off"), ep.expects_vattn({}, "on", "on"),
            ep.expects_vattn({}, "b", "b")) == (False, True, None)
    assert ep.expects_vattn(plan(on={"VATTN": "maybe"}), "on", "on") is None


def test_an_ab_of_two_vattn_modes_holds_both_arms_to_the_on_bar(tmp_path):
    envs = {"off": {"VATTN": "1"}, "on": {"VATTN": "1", "VATTN_QK": "e4m3"}}
    lines = ep.engine_paths_md(_run(tmp_path, "sglang", logs={"off": "on.server.log"}, envs=envs))
    assert lines[2].startswith("| off | fa3 (VATTN_BASE) |") and lines[2].endswith("| 99.3% | ok |")
    assert lines[3].endswith("| 99.3% | ok |")
    flipped = ep.engine_paths_md(_run(tmp_path / "b", "sglang", envs=envs))  # off's log: all on the base
    assert flipped[2].endswith("| 0.0% | below 99% |")


def test_section_names_arm_runs_without_a_log(tmp_path):
    lines = ep.engine_paths_md(_run(tmp_path, "sglang", arms=("off", "on", "off.2")))
    assert lines[-1] == "No server.log for: off.2."


@pytest.mark.parametrize("engine", ["emulator", "vllm"])
def test_no_section_for_other_engines(tmp_path, engine):
    assert ep.engine_paths_md(_run(tmp_path, engine)) == []


def test_no_section_without_manifest_or_counters(tmp_path):
    run = _run(tmp_path, None, arms=("off.9",))  # no log at all
    assert ep.engine_paths_md(run) == []


def test_the_report_section_has_its_heading(tmp_path):
    lines = ep.section_md(_run(tmp_path, "sglang"))
    assert lines[:2] == ["## What served each attention call (sglang)", ""] and lines[-1] == ""
    assert ep.section_md(_run(tmp_path / "emu", "emulator")) == []
