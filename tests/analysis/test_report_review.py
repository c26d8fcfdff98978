"""What a go/no-go reader needs beside each figure of the one-run report, pinned on the quickstart fixture
(an emulator run, one launch an arm)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from analysis.report import write_report

QUICKSTART = Path(__file__).parent / "data" / "quickstart_run"
N_BOOT = 200


def section(md: str, title: str) -> str:
    return md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


@pytest.fixture(scope="module")
def qs(tmp_path_factory) -> tuple[Path, str]:
    run = tmp_path_factory.mktemp("review") / "qs"
    shutil.copytree(QUICKSTART, run)
    for arm in ("off", "on"):  # as the load stage now records them: 8 of the trace's 10 sessions primed
        p = run / "arms" / arm / "load_result.json"
        p.write_text(json.dumps({**json.loads(p.read_text()), "warmup_primed": 8, "trace_sessions": 10}))
    return run, write_report(run, n_boot=N_BOOT).read_text()


def test_emulator_timings_are_said_modelled_right_under_the_verdict(qs):
    lines = qs[1].splitlines()
    assert lines[2].startswith("**Verdict:**")
    assert lines[3] == "" and lines[4] == ("Timings are the emulator's: its cost model (hardware profile `h200`, fitted to kernel runs "
                        "on that GPU), not a hardware measurement.")


def test_emulator_identity_is_said_to_hold_by_construction(qs):
    acc = section(qs[1], "Accuracy")
    assert "exact kernel" not in acc
    assert ("identical by construction unless numerics are perturbed (EMULATOR_PERTURB_NUMERICS): it tests the "
            "plumbing, not the kernel") in acc


def test_accuracy_table_shows_invalid_and_truncated_shares_and_warns(qs):
    acc = section(qs[1], "Accuracy")
    assert "| invalid / truncated (off; on) |" in acc
    assert "| 100% / 100%; 100% / 100% |" in acc
    assert ("**gsm8k: 100% of off's and 100% of on's answers had no parseable answer (over 20%): the score measures "
            "the parser or the token budget (100% / 100% truncated), not the kernel.**") in acc
    # the smallest change each task's sample could show, from the CI the table gives
    assert "- gsm8k: with 20 paired answers the 95% CI spans ±16.1 pts: a smaller accuracy change would not show." in acc
    # the same situation (no question differs) is tagged alike for both tasks
    rows = [x for x in acc.splitlines() if x.startswith(("| gsm8k |", "| gpqa_diamond |"))]
    assert len(rows) == 2 and all("(no question differs)" in x for x in rows)


def test_one_launch_verdict_says_the_ci_assumes_a_launch_drift(qs):
    v = qs[1].splitlines()[2]
    assert ("no A/A floor (no arm ran twice): the CI assumes a launch drift of 0.2% a launch (fitted on the "
            "emulator); repeating arms (ABBA) measures it") in v


def test_per_arm_table_says_why_percentile_cis_are_wider_than_the_verdicts(qs):
    per_arm = section(qs[1], "Per-arm metrics")
    assert ("A percentile row's CI can include 0 where the verdict's excludes it: the verdict is the trimmed mean of "
            "per-request log-ratios over matched requests, which pairs each request with itself") in per_arm


def test_equal_window_throughput_heads_and_own_window_follows(qs):
    per_arm = section(qs[1], "Per-arm metrics")
    eq = per_arm.index("| Output throughput, equal 60 s window (tok/s)")
    own = per_arm.index("| Output throughput, own window (context) (tok/s)")
    assert per_arm.index("| Requests completed") > eq and own > eq
    assert "aiperf's own summary divides by the window plus its grace period" in per_arm
    server = section(qs[1], "Server-side metrics")
    assert "| server metric | kind | unit |" in server
    assert "| sglang:gen_throughput | gauge (avg) | tok/s over the engine's last ~5 s, averaged over scrapes |" in server
    assert "averages and rates over aiperf's profiling phase" in server


def test_cycle_section_is_named_for_a_cost_model_run_and_gives_decode_only_share(qs):
    md = qs[1]
    assert "## Kernel in the loop" not in md
    cyc = section(md, "Emulator cycle log")
    assert "| decode attention share |" in cyc
    assert "decode cycles only (no prefill in the step)" in cyc


def test_load_section_counts_primed_and_cold_sessions(qs):
    load = section(qs[1], "Load")
    assert ("Warm-up primed the first call of 8 of the trace's 10 sessions (off), 8 of 10 (on); the other 2 start "
            "cold in the window") in load


def test_floor_clause_says_both_widths_in_one_unit_and_what_they_mean():
    from analysis.estimate import Estimate
    from analysis.verdict import _floor_clause

    e = Estimate("trimmed_mean", -9.2, -11.1, -7.1, 0.01, 200, 10, 2)
    assert _floor_clause(e, 0.8) == ("CI half-width ±2.0% is wider than the A/A floor ±0.8%: this run's request "
                                     "noise, more than launch drift, sets it")


def test_the_perturbation_hook_named_is_the_emulators():
    from analysis.accuracy import PERTURB_ENV
    from pipeline.emulator.arm import PERTURB_ENV as emulators

    assert PERTURB_ENV == emulators


def test_attention_share_counts_decode_cycles_only():
    from analysis.cycles import cycle_summary, cycles_frame

    # two decode cycles (10 us of 100) and one prefill cycle of 900 us, whose prefill attention attn_us leaves out
    df = cycles_frame([{"step_us": 100, "attn_us": 10, "prefill_tokens": 0}] * 2
                      + [{"step_us": 900, "attn_us": 0, "prefill_tokens": 8192}])
    assert cycle_summary(df)["attn_share"] == 0.1   # over all cycles it would read 20 / 1100 = 1.8%
