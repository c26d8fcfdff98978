"""The cycle-log section ("Emulator cycle log" where no kernel ran) reads one server lifetime's cycle log: the one that ran the load."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from analysis_records import write_jsonl

from analysis.report import write_report

FIXTURE = Path(__file__).parent / "data" / "run_small"


def cycles(n: int, step_us: float) -> list[dict]:
    return [{"cycle": i + 1, "batch": 4, "attn_us": step_us / 2, "step_us": step_us, "prefill_tokens": 0}
            for i in range(n)]


@pytest.fixture
def run(tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(FIXTURE, dst)
    # off: the load ran in lifetime 1; a resume then started lifetime 2 for a stage after the load.
    write_jsonl(dst / "arms/off/emulator_cycles/lifetime-1.jsonl", cycles(40, 100.0))
    write_jsonl(dst / "arms/off/emulator_cycles/lifetime-2.jsonl", cycles(7, 900.0))
    write_jsonl(dst / "arms/on/emulator_cycles/lifetime-1.jsonl", cycles(30, 80.0))
    return dst


def set_load_lifetime(run: Path, arm_run: str, lifetime: int | None) -> None:
    manifest = json.loads((run / "manifest.json").read_text())
    load = manifest["stages"][arm_run]["load"]
    load.pop("cycle_log_lifetime", None)
    if lifetime is not None:
        load["cycle_log_lifetime"] = lifetime
    (run / "manifest.json").write_text(json.dumps(manifest))


def kernel_section(run: Path) -> str:
    md = write_report(run, n_boot=200).read_text()
    assert "## Emulator cycle log\n" in md, "no cycle-log section"  # these logs hold no measured attention
    return md.split("## Emulator cycle log\n", 1)[1].split("\n## ", 1)[0]


def test_the_lifetime_that_ran_the_load_is_read_alone(run):
    set_load_lifetime(run, "off", 1)
    sec = kernel_section(run)
    # 40 cycles of 100 us: lifetime 2's 900 us cycles are neither counted nor averaged in.
    assert "| off | 40 | 100.0 | 100.0 | 100.0 | 100.0 | 50.0% |" in sec
    assert "| on | 30 | 80.0 | 80.0 | 80.0 | 80.0 | 50.0% |" in sec
    assert "Cycle log: off: server lifetime 1 of 2 (the one that ran the load)." in sec


def test_without_a_record_the_report_says_which_lifetime_it_shows(run):
    set_load_lifetime(run, "off", None)
    sec = kernel_section(run)
    assert "| off | 7 | 900.0 |" in sec
    assert "Cycle log: off: 2 server lifetimes and no record of which ran the load; showing the last (2)." in sec


def test_a_missing_lifetime_log_is_left_out_and_said(run):
    set_load_lifetime(run, "off", 3)
    sec = kernel_section(run)
    assert "| off |" not in sec and "| on | 30 |" in sec
    assert "off: the load ran in server lifetime 3, whose cycle log is missing (have [1, 2]); left out" in sec
