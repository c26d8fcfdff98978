"""`pipeline report` logic end to end on run directories built from real aiperf exports."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from analysis_records import write_jsonl

from analysis.accuracy import EMULATOR_NOTE
from analysis.load import read_jsonl
from analysis.report import ReportError, cli_report, write_report

FIXTURE = Path(__file__).parent / "data" / "run_small"
N_BOOT = 300  # the committed fixture is small; fewer replicates keep the suite fast
PLOTS = ("tpot_cdf.png", "matched_tpot_delta.png", "tpot_over_time.png")


@pytest.fixture
def run(tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(FIXTURE, dst)
    return dst


def assert_image(path: Path) -> None:
    """A PNG that opens, has pixels, and is not one flat colour."""
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert float(np.ptp(img[..., :3])) > 0.2, f"{path} is blank"


def section(md: str, title: str) -> str:
    body = md.split(f"## {title}\n", 1)[1]
    return body.split("\n## ", 1)[0]


def check_report(md: str, a: str, b: str) -> None:
    assert md.startswith("# A/B report")
    assert "**Verdict:**" in md.splitlines()[2]
    per_arm = section(md, "Per-arm metrics")
    # latency rows over matched requests, each arm's all-request value beside them for context
    assert (f"| metric | requests | {a} | {b} | delta [95% CI] | A/A noise floor | all requests: {a} / {b} |"
            in per_arm)
    for label in ("TPOT p50 (ms)", "TPOT mean (ms)", "TPOT p90 (ms)", "Interactivity at TPOT p50",
                  "Interactivity at TPOT p90", "TTFT p50 (ms)", "E2E latency p90 (ms)", "Output throughput",
                  "Requests completed"):
        assert f"| {label}" in per_arm
    assert "1000 / TPOT[ms]" in per_arm
    matched = section(md, "Matched requests")
    for label in ("Decode time per token (ms)", "Request latency (ms)", "TTFT (ms)"):
        assert f"| {label} |" in matched
    assert "| arm run | profiling requests | completed | failed | cancelled |" in section(md, "Load")
    for s in ("Server-side metrics", "Plots", "Accuracy", "Provenance"):
        assert f"## {s}\n" in md


def test_report_on_real_fixture(run):
    out = write_report(run, n_boot=N_BOOT)
    assert out == run / "report.md"
    md = out.read_text()
    check_report(md, "off", "on")
    # The fixture's "on" server is 25% faster per token: the verdict must say faster, CI off zero.
    assert "faster; the 95% CI excludes 0" in md.splitlines()[2]
    tpot_row = next(l for l in section(md, "Matched requests").splitlines() if l.startswith("| Decode time"))
    assert "| 33 | " in tpot_row and "| 33 / 0 |" in tpot_row
    # off ran twice (off, off.2): the A/A noise floor is filled in.
    assert "no repeat" not in section(md, "Per-arm metrics")
    assert "| off.2 | 36 | 33 | 3 | 0 | 0 | 2 |" in section(md, "Load")
    assert "sglang:spec_accept_length" in section(md, "Server-side metrics")
    assert section(md, "Accuracy").strip() == "Accuracy: not run."
    assert "`recipe.load.seed` = 7" in section(md, "Provenance")
    for name in PLOTS:
        assert f"(plots/{name})" in md
        assert_image(run / "plots" / name)


def test_requests_aiperf_cancelled_without_a_record_are_counted_from_its_log(run):
    # aiperf 0.13 exports no record of a request it cancelled at the window's end; its log's phase summary
    # (this line's form, from a real run) is the only count, and the Load table must not say 0.
    before = section(write_report(run, n_boot=N_BOOT).read_text(), "Load")
    row = next(line for line in before.splitlines() if line.startswith("| on |"))
    cells = row.split(" | ")
    (run / "arms/on/aiperf.log").write_text(
        "17:48:24.974 NOTICE   Phase profiling (profiling) complete | completed=100, cancelled=2, errors=0 | "
        "sessions: completed=16, cancelled=2 | elapsed=80.00s | grace_period_timeout=True (runner.py:1226)\n")
    after = section(write_report(run, n_boot=N_BOOT).read_text(), "Load")
    row2 = next(line for line in after.splitlines() if line.startswith("| on |")).split(" | ")
    assert cells[4] == "0" and row2[4] == "2"                 # cancelled
    assert int(row2[1]) == int(cells[1]) + 2 and row2[2] == cells[2]  # profiling requests include them


def test_report_out_file_keeps_its_plots_beside_it(run, tmp_path):
    run.chmod(0o555)  # a run dir one may read but not write
    try:
        out = write_report(run, tmp_path / "elsewhere" / "r.md", n_boot=N_BOOT)
    finally:
        run.chmod(0o755)
    assert "(plots/run_tpot_cdf.png)" in out.read_text()
    assert_image(tmp_path / "elsewhere" / "plots" / "run_tpot_cdf.png")
    assert not (run / "plots").exists()


def test_compare_two_runs_on_arms(run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(FIXTURE, other)
    out = write_report(run, compare=other, n_boot=N_BOOT)
    assert out == other / "compare_run.md"
    md = out.read_text()
    check_report(md, "run:on", "other:on")
    assert "### run:on:" in md and "### other:on:" in md
    # the title names the sides in the verdict's order; the load rows and the delta's definition name the runs
    assert md.startswith("# A/B report: other:on vs run:on\n") and "**Verdict:** other:on vs run:on" in md
    assert "\n| run:on | " in md and "\n| other:on | " in md and "Delta = (other:on - run:on) / run:on." in md
    # Same exports on both sides: every matched delta is exactly zero.
    assert "| Decode time per token (ms) | 33 | 5.87 | 5.87 | +0.0% [no spread]" in md
    assert "no change detected" in md.splitlines()[2]
    for name in PLOTS:
        assert_image(other / "plots" / f"compare_run_{name}")
    # same recipes: no note; a changed load is named under the verdict
    assert "differ in more than the compared arms" not in md
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["recipe"]["load"]["concurrency"] = 32
    (other / "manifest.json").write_text(json.dumps(manifest))
    again = write_report(run, compare=other, n_boot=N_BOOT).read_text()
    assert "- the two runs differ in more than the compared arms (run:on / other:on): load.concurrency: `" in again
    before = sorted(p.name for p in (other / "plots").iterdir())
    named = write_report(run, tmp_path / "elsewhere" / "named.md", compare=other, arms=("off", "on"), n_boot=N_BOOT)
    assert "run:off" in named.read_text().splitlines()[0]
    # an --out report keeps its plots beside it and adds nothing to either run
    assert "(plots/compare_run_tpot_cdf.png)" in named.read_text()
    assert_image(tmp_path / "elsewhere" / "plots" / "compare_run_tpot_cdf.png")
    assert sorted(p.name for p in (other / "plots").iterdir()) == before


def test_accuracy_table_and_emulator_label(run):
    for arm, correct in (("off", [1, 1, 0, 1]), ("on", [1, 0, 0, 1])):
        rows = [{"id": f"q{i}", "repeat": 0, "prompt_hash": "h", "output": f"x{c}", "extracted": str(c),
                 "gold": "1", "correct": bool(c), "extracted_strict": str(c), "correct_strict": bool(c),
                 "latency_s": 0.1, "finish_reason": "stop", "retried": False, "failed": False}
                for i, c in enumerate(correct)]
        write_jsonl(run / "arms" / arm / "accuracy" / "gsm8k.jsonl", rows)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["recipe"]["engine"] = "emulator"
    (run / "manifest.json").write_text(json.dumps(manifest))
    md = write_report(run, n_boot=N_BOOT).read_text()
    acc = section(md, "Accuracy")
    assert EMULATOR_NOTE in acc and "accuracy is not meaningful" in acc
    assert "| gsm8k | 75.0% (strict 75.0%) | 50.0% (strict 50.0%) | -25.0 [-69.9, +36.2] | 4 / 4 | 0 / 0 | " \
           "-; - | 75.0% (strict 75.0%) / 50.0% (strict 50.0%) | McNemar exact p=1 " \
           "(off-only 1, on-only 0, n=4); strict p=1; outputs differ 1/4 |" in acc
    assert "Discordant questions, gsm8k (off -> on):\n- q1 (repeat 0): right -> wrong" in acc
    # Output x1 became x0: one answer of four differs, at its first (and only) word.
    assert ("Outputs, gsm8k (off vs on): identical in 3/4 answers (75%); the others first differ at word 0 "
            "(earliest), 0 (median):\n- q1 (repeat 0): first differs at word 0 of 1 / 1") in acc
    # --arms on off: the discordance is named by the arm it favours, whichever side it is on
    swapped = section(write_report(run, run / "swapped.md", arms=("on", "off"), n_boot=N_BOOT).read_text(), "Accuracy")
    assert "| gsm8k | 50.0% (strict 50.0%) | 75.0% (strict 75.0%) | +25.0 [-36.2, +69.9] | 4 / 4 | 0 / 0 | " \
           "-; - | 50.0% (strict 50.0%) / 75.0% (strict 75.0%) | McNemar exact p=1 " \
           "(on-only 0, off-only 1, n=4)" in swapped
    # a torn line or a missing record file leaves the table, with the arm's summary, and names the file
    records = run / "arms" / "on" / "accuracy" / "gsm8k.jsonl"
    (run / "arms" / "on" / "accuracy" / "gsm8k.summary.json").write_text(json.dumps(
        {"accuracy": 0.5, "n_records": 4, "n_questions": 4, "repeats": 1, "n_failed": 0}))
    records.write_text(records.read_text()[:-40])
    torn = section(write_report(run, n_boot=N_BOOT).read_text(), "Accuracy")
    # ... and no paired headline or delta: a summary pairs no question
    assert (f"| gsm8k | - | - | - | 4 / 4 | 0 / 0 | -; - | 75.0% (strict 75.0%) / 50.0% | paired test not possible: "
            f"{records}:4: not valid JSON") in torn
    records.unlink()
    gone = section(write_report(run, n_boot=N_BOOT).read_text(), "Accuracy")
    assert (f"| gsm8k | - | - | - | 4 / 4 | 0 / 0 | -; - | 75.0% (strict 75.0%) / 50.0% | paired test not possible: "
            f"{records} missing |") in gone


def test_kernel_in_the_loop_section_from_cycle_log(run):
    for arm, step in (("off", 100.0), ("on", 80.0)):
        lines = [{"cycle": i, "batch": 4, "attn_us": step / 2, "step_us": step + i % 5, "prefill_tokens": i % 2,
                  **({"measured_attention_us": step / 2 + 1} if arm == "on" else {})} for i in range(50)]
        write_jsonl(run / "arms" / arm / "emulator_cycles.jsonl", lines)
    md = write_report(run, n_boot=N_BOOT).read_text()
    k = section(md, "Kernel in the loop")
    # step 100..104, ten cycles each: mean 102, p50 102, p90 at rank 44.1 of 0..49 -> 104; attn 50/102.
    # Decode-only (even i): steps 100, 102, 104, 101, 103 repeating -> p50 102.
    assert "| off | 50 | 102.0 | 102.0 | 104.0 | 102.0 | 49.0% |" in k
    assert_image(run / "plots" / "step_time.png")
    assert_image(run / "plots" / "attention_pred_vs_meas_on.png")


def test_no_cycle_log_means_no_section(run):
    md = write_report(run, n_boot=N_BOOT).read_text()
    assert "## Kernel in the loop" not in md and "## Emulator cycle log" not in md


@pytest.mark.parametrize("breakage, message", [
    ("drop_on", r"^error: run dir .*: arm 'on' has no aiperf export at arms/on/aiperf/profile_export\.jsonl, though "
                r"its load stage is recorded as done"),
    ("warmup_only", r"^error: .*arms/on/aiperf/profile_export\.jsonl: 0 profiling records \(2 warmup/other\)"),
    ("no_manifest", r"^error: .* is not a run directory \(no manifest\.json and no arms/\)"),
])
def test_cli_errors_are_one_line(run, capsys, breakage, message):
    export = run / "arms" / "on" / "aiperf" / "profile_export.jsonl"
    if breakage == "drop_on":
        shutil.rmtree(run / "arms" / "on")
    elif breakage == "warmup_only":
        write_jsonl(export, [x for x in read_jsonl(export) if x["metadata"]["benchmark_phase"] == "warmup"])
    else:
        (run / "manifest.json").unlink()
        shutil.rmtree(run / "arms")
    assert cli_report([str(run)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert __import__("re").search(message, err), err


def test_a_run_in_progress_or_stopped_in_its_load_says_so_not_that_it_measured_nothing(run, capsys):
    """Mid-load, aiperf's export holds the warm-up alone: the report must not blame the load for it."""
    from pipeline import dirlock

    manifest = json.loads((run / "manifest.json").read_text())
    manifest["finished"] = None
    manifest["stages"]["on"]["load"]["status"] = "running"
    (run / "manifest.json").write_text(json.dumps(manifest))
    export = run / "arms" / "on" / "aiperf" / "profile_export.jsonl"
    write_jsonl(export, [x for x in read_jsonl(export) if x["metadata"]["benchmark_phase"] == "warmup"])
    with dirlock.exclusive(run):  # as `pipeline run` holds it (a lock of its own: another open of the file)
        assert cli_report([str(run)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: run dir {run} is still in progress: pipeline process {__import__('os').getpid()} is "
                   f"running arm run `on`'s load stage; it writes report.md when the run finishes\n"), err
    assert cli_report([str(run)]) == 2  # the run was killed in that stage: nothing holds the dir
    err = capsys.readouterr().err
    assert err.startswith(f"error: run dir {run} is unfinished: it stopped during arm run `on`'s load stage, so "
                          f"that arm run's aiperf export is partial; finish it with `pipeline run --resume {run}`"), err
    assert "0 profiling records" not in err and not (run / "report.md").exists()


def test_cli_argument_errors(run, capsys):
    assert cli_report([str(run)], arms="off") == 2
    assert "--arms: expected two arm names like 'off on', got 'off'" in capsys.readouterr().err
    assert cli_report([str(run)], arms=["off", "on", "x"]) == 2
    assert "got ['off', 'on', 'x']" in capsys.readouterr().err
    assert cli_report([str(run), str(run), str(run)]) == 2
    capsys.readouterr()
    assert cli_report([str(run)], out=str(run)) == 2  # a folder given as --out: say so, write nothing
    assert f"--out: '{run}' is a directory; give the report's file path (e.g. {run / 'report.md'})" in (
        capsys.readouterr().err) and not (run / "report.md").exists()
    assert cli_report([str(run / "manifest.json")]) == 2
    assert "manifest.json: a file, not a run directory" in capsys.readouterr().err
    with pytest.raises(ReportError, match=r"no arm 'base' \(arms with exports: off, on\); pick one with --arms"):
        write_report(run, arms=("base", "on"), n_boot=N_BOOT)


def test_cli_success_prints_path(run, capsys):
    assert cli_report([str(run)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {run / 'report.md'}"
    assert cli_report([run, run], arms=["off", "on"]) == 0
    assert capsys.readouterr().out.strip() == f"report: {run / 'compare_run.md'}"
    assert cli_report([run, run]) == 2  # on against itself
    assert "are one run and --arms names 'on' twice: nothing to compare" in capsys.readouterr().err


def test_one_run_with_one_arm_twice_is_refused_and_writes_nothing(run, capsys):
    assert cli_report([str(run)]) == 0
    capsys.readouterr()
    report, plots = run / "report.md", {p.name: p.read_bytes() for p in (run / "plots").iterdir()}
    before = report.read_bytes()
    assert cli_report([str(run)], arms=["off", "off"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"error: --arms: names 'off' twice for the one run dir {run}: nothing to compare; name "
                           "two different arms of it (arms with exports: off, on), e.g. --arms off on, or give a "
                           "second run dir to compare 'off' across runs")
    assert report.read_bytes() == before  # the run's report and plots are left as they were
    assert {p.name: p.read_bytes() for p in (run / "plots").iterdir()} == plots
    with pytest.raises(ReportError, match=r"^--arms: names 'on' twice for the one run dir .*: nothing to compare"):
        write_report(run, out=run.parent / "elsewhere.md", arms=("on", "on"), n_boot=N_BOOT)
    assert not (run.parent / "elsewhere.md").exists() and not (run.parent / "plots").exists()


@pytest.fixture(scope="session")
def live_run(tmp_path_factory) -> Path:
    """A fresh run dir: real aiperf against two real local streaming servers (off 6 ms/token, on 4.5)."""
    from analysis_make_fixture import ARM_RUNS, build

    return build(tmp_path_factory.mktemp("live") / "run", arm_runs=ARM_RUNS[:2])


@pytest.mark.slow
def test_report_on_live_aiperf_run(live_run):
    md = write_report(live_run, n_boot=N_BOOT).read_text()
    check_report(md, "off", "on")
    assert "faster; the 95% CI excludes 0" in md.splitlines()[2]
    assert "| no repeat |" in section(md, "Per-arm metrics")     # no arm ran twice: no A/A floor
    for name in PLOTS:
        assert_image(live_run / "plots" / name)


def test_abba_pairs_kth_runs_and_takes_floor_from_both_arms(tmp_path):
    from analysis_records import make_run, record

    def arm(tpots):
        return [record(f"s{i}", 0, i, tpot=t) for i, t in enumerate(tpots)]

    off = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    run = make_run(tmp_path / "abba", {"off": arm(off), "on": arm([t * 0.8 for t in off]),
                                       "on.2": arm([t * 0.8 * 0.99 for t in off]), "off.2": arm([t * 1.01 for t in off])})
    md = write_report(run, n_boot=N_BOOT).read_text()
    assert [l.split(" | ")[0] for l in section(md, "Load").splitlines() if l.startswith("| o")] == \
        ["| off", "| off.2", "| on", "| on.2"]
    assert "A/A noise floor from: off vs off.2, on vs on.2." in md
    row = next(l for l in section(md, "Matched requests").splitlines() if l.startswith("| Decode time"))
    # Pairs off|on and off.2|on.2: mean after / mean before = 0.8 * (1 + 0.99) / (1 + 1.01) -> -20.8%.
    assert row.startswith("| Decode time per token (ms) | 12 | 12.56 | 9.95 | -20.8% [")
    assert "| 12 / 0 |" in row and "no repeat" not in row
    # The own-window throughput row has no CI (its window ends at one request's end), so no A/A floor either:
    # "n/a", not a floor of 0 from a missing CI.
    tput = next(l for l in section(md, "Per-arm metrics").splitlines() if l.startswith("| Output throughput, own window (context) (tok/s)"))
    assert "[no CI: its window ends at one request's end; see the equal-window row] | n/a | " in tput, tput


def test_too_few_sessions_gives_no_ci_and_no_conclusion(tmp_path):
    from analysis_records import make_run, record

    run = make_run(tmp_path / "tiny", {"off": [record("s0", 0, 0, tpot=10), record("s1", 0, 0, tpot=12)],
                                       "on": [record("s0", 0, 0, tpot=8), record("s1", 0, 0, tpot=9)]})
    md = write_report(run, n_boot=N_BOOT).read_text()
    assert "no conclusion: 2 session(s), fewer than the 5" in md.splitlines()[2]
    assert "| TPOT p50 (ms) | 2 matched | 11.00 | 8.50 | -22.7% [no CI: < 5 sessions] | no repeat | 11.00 / 8.50 |" in md


def test_pipeline_report_command(run):
    """The real console entry point, as a user runs it."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", "import sys; from pipeline.cli import main; sys.exit(main())",
                        "report", str(run)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert str(run / "report.md") in r.stdout
    check_report((run / "report.md").read_text(), "off", "on")
    r = subprocess.run([sys.executable, "-c", "import sys; from pipeline.cli import main; sys.exit(main())",
                        "report", str(run), str(shutil.copytree(FIXTURE, run.parent / "b")), "--arms", "off", "on"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    check_report((run.parent / "b" / "compare_run.md").read_text(), "run:off", "b:on")


def test_pipeline_report_command_error_is_one_line(run):
    import subprocess
    import sys

    shutil.rmtree(run / "arms" / "on")
    r = subprocess.run([sys.executable, "-c", "import sys; from pipeline.cli import main; sys.exit(main())",
                        "report", str(run)], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert "arm 'on' has no aiperf export" in r.stderr


QUICKSTART = Path(__file__).parent / "data" / "quickstart_run"

# aiperf's own summary (profile_export_aiperf.json) of the same two exports, before slimming:
# ITL p50 / mean / p90, TTFT p50, request latency p90 (ms), output token throughput (tok/s).
AIPERF_SUMMARY = {
    "off": (69.56876058051206, 102.78264890751524, 228.09562917024414, 20569.885049, 63130.869685599995, 105.689),
    "on": (71.95361609295774, 99.18624453590195, 248.23024924908702, 22057.081297, 64823.386480999994, 75.241),
}


def test_per_arm_figures_agree_with_aiperf_own_summary():
    from analysis.compare import pool
    from analysis.metrics import arm_deltas
    from analysis.rundir import load_run

    run = load_run(QUICKSTART)
    t = arm_deltas(pool(run.runs_of("off")), pool(run.runs_of("on")), n_boot=50).set_index("key")
    for col, arm in (("a", "off"), ("b", "on")):
        p50, mean, p90, ttft, e2e, tput = AIPERF_SUMMARY[arm]
        got = t[col]
        assert got["tpot_p50"] == pytest.approx(p50) and got["tpot_mean"] == pytest.approx(mean)
        assert got["tpot_p90"] == pytest.approx(p90) and got["ttft_p50"] == pytest.approx(ttft)
        assert got["e2e_p90"] == pytest.approx(e2e)
        # aiperf's window and token total differ from ours in the last digits (its own duration bookkeeping).
        assert got["throughput"] == pytest.approx(tput, rel=5e-3)


def test_report_on_quickstart_run_dir(tmp_path):
    """A real `pipeline run recipes/quickstart.yaml` run dir (emulator; slimmed by analysis_make_fixture)."""
    run = tmp_path / "qs"
    shutil.copytree(QUICKSTART, run)
    md = write_report(run, n_boot=N_BOOT).read_text()
    check_report(md, "off", "on")
    acc = section(md, "Accuracy")
    assert EMULATOR_NOTE in acc and "accuracy is not meaningful" in acc
    assert "| gsm8k |" in acc and "| gpqa_diamond |" in acc and "McNemar exact p=" in acc
    assert "| off | 100 |" in section(md, "Emulator cycle log")  # a CPU run: no kernel ran, every time is modelled
    assert "sglang:spec_accept_length" in section(md, "Server-side metrics")
    prov = section(md, "Provenance")
    assert "- engine: emulator" in prov and "VATTN" in prov and "off load: `" in prov and "| on | load | done |" in prov
    for name in (*PLOTS, "step_time.png"):
        assert_image(run / "plots" / name)


def test_an_arm_in_the_lossy_qk_mode_is_named_under_the_verdict(tmp_path):
    import json

    run = tmp_path / "qs"
    shutil.copytree(QUICKSTART, run)
    manifest = json.loads((run / "manifest.json").read_text())
    assert "Notes:" not in write_report(run, n_boot=N_BOOT).read_text()  # both arms accurate: no note
    manifest["recipe"]["arms"]["on"]["env"]["VATTN_QK"] = "e4m3"
    (run / "manifest.json").write_text(json.dumps(manifest))
    head = write_report(run, n_boot=N_BOOT).read_text().split("## Load")[0]
    assert "- arm `on` runs vattn's lossy fast mode (VATTN_QK=e4m3: Q rounded to e4m3 for Q.K^T" in head
    assert "arm `off`" not in head


def test_missing_repeat_is_noted_not_fatal(run):
    shutil.rmtree(run / "arms" / "off.2")
    md = write_report(run, n_boot=N_BOOT).read_text()
    assert "- arm run `off.2`: no aiperf export at " in md and "; left out" in md
    assert "| no repeat |" in section(md, "Per-arm metrics")


def test_verdict_within_aa_noise_floor(tmp_path):
    from analysis_records import make_run, record

    base = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0]
    wobble = [1.3, 0.7, 1.25, 0.8, 1.2, 0.75, 1.3, 0.7]     # off.2: the same config, very noisy
    run = make_run(tmp_path / "noisy", {
        "off": [record(f"s{i}", 0, i, tpot=t) for i, t in enumerate(base)],
        "on": [record(f"s{i}", 0, i, tpot=t * 0.97) for i, t in enumerate(base)],
        "off.2": [record(f"s{i}", 0, i, tpot=t * w) for i, (t, w) in enumerate(zip(base, wobble))]})
    line = write_report(run, n_boot=N_BOOT).read_text().splitlines()[2]
    # Every request is exactly 3% faster: the CI is only the launch drift, t(7) x sqrt(8/7) x sqrt(2) x 0.2%
    # = 0.72% in log units around -3.0%, and excludes 0 ...
    assert "decode time per token, 20% trimmed mean per-request change -3.0% [-3.7, -2.3] (n=8 matched" in line
    # ... but two runs of the same config differ by far more than that.
    assert ": faster, but within the A/A noise floor; CI half-width ±0.7% is narrower than the A/A floor ±" in line
    assert "launch drift, not request noise, limits what this run can claim" in line


def test_verdict_primary_is_robust_to_an_outlier_that_hides_the_mean(tmp_path):
    from analysis_records import make_run, record

    # Eleven requests 5% faster; the twelfth stalled behind another request's prefill in `on` only.
    off = [record(f"s{i}", 0, i, tpot=10.0) for i in range(12)]
    on = [record(f"s{i}", 0, i, tpot=100.0 if i == 11 else 9.5) for i in range(12)]
    md = write_report(make_run(tmp_path / "outlier", {"off": off, "on": on}), n_boot=N_BOOT).read_text()
    line = md.splitlines()[2]
    # Cutting 2 of 12 log-ratios at each end leaves eight log(0.95): the centre is -5.0%. A replicate moves
    # it only by drawing the outlier's session 3+ times in 12.
    assert "20% trimmed mean per-request change -5.0% [" in line
    assert "(n=12 matched requests, 12 sessions): faster; the 95% CI excludes 0" in line
    assert "no A/A floor (no arm ran twice)" in line
    # The ratio of matched means follows the outlier: (9.5 * 11 + 100) / (10 * 12) - 1 = +70.4%, CI over 0.
    row = next(x for x in md.splitlines() if x.startswith("| ratio of matched means"))
    assert "+70.4%" in row and row.endswith("| no |")


def test_requests_that_errored_in_one_arm_only_are_named_in_the_verdict(tmp_path):
    """The pairs leave out a request one arm failed: a kernel that fails its slow requests must not look faster."""
    from analysis_records import make_run, record

    off = [record(f"s{i}", 0, i, tpot=10.0 + i) for i in range(60)]
    # on is 5% faster on what it served; it failed the 20 slowest, and the window's end cancelled one more
    on = [record(f"s{i}", 0, i, error="ServerError") if i >= 40 else
          record(f"s{i}", 0, i, tpot=(10.0 + i) * 0.95) for i in range(60)]
    on[0] = record("s0", 0, 0, cancelled=True)
    line = write_report(make_run(tmp_path / "fails", {"off": off, "on": on}), n_boot=N_BOOT).read_text().splitlines()[2]
    assert "(n=39 matched requests, 39 sessions): no speed verdict: requests that errored (not cancelled) 20 in " \
           "on only, left out of the pairs, one arm more than the other by over 2% of the pairs" in line
    assert "faster" not in line
    # one error in 60 is named but leaves the verdict
    on = [record(f"s{i}", 0, i, error="ServerError") if i == 59 else
          record(f"s{i}", 0, i, tpot=(10.0 + i) * 0.95) for i in range(60)]
    line = write_report(make_run(tmp_path / "one", {"off": off, "on": on}), n_boot=N_BOOT).read_text().splitlines()[2]
    assert "(n=59 matched requests, 59 sessions); requests that errored (not cancelled) 1 in on only, left out of " \
           "the pairs: faster; the 95% CI excludes 0" in line


def test_report_says_what_the_run_could_have_seen(tmp_path):
    from analysis_records import make_run, record

    rng = __import__("numpy").random.default_rng(3)
    off = [record(f"s{i}", t, 1000.0 * t, tpot=10.0) for i in range(8) for t in range(3)]
    on = [record(f"s{i}", t, 1000.0 * t, tpot=10.0 * float(rng.uniform(0.9, 1.1))) for i in range(8) for t in range(3)]
    md = write_report(make_run(tmp_path / "see", {"off": off, "on": on}, recipe={"target_effect": 0.5}),
                      n_boot=N_BOOT).read_text()
    sec = md.split("## What this run could have seen")[1].split("\n## ")[0]
    assert "Smallest detectable effect: " in sec and "over 24 matched requests" in sec
    # One launch of each arm carries sqrt(2) x 0.2% of assumed drift, which no window shrinks: with a factor of
    # about 3.1 (t(7) x sqrt(8/7) + 0.84) nothing under ~0.9% is reachable without repeated arms.
    assert "- a 0.5% effect (the recipe's target_effect): no window suffices with one launch of each arm" in sec
    assert "- a 2% effect: about " in sec and "x this one) at this noise level" in sec


def test_server_metrics_zero_in_both_arms_are_named_not_tabled():
    import pandas as pd
    from types import SimpleNamespace

    from analysis.report import server_md

    def side(rows):
        return [SimpleNamespace(server=pd.DataFrame(rows, columns=["name", "kind", "value"]))]

    g = "gauge (avg)"
    c = SimpleNamespace(a_label="off", b_label="on",
                        a_runs=side([("sglang:gen_throughput", g, 860.2), ("sglang:mamba_usage", g, 0.0),
                                     ("sglang:num_queue_reqs", g, 0.04)]),
                        b_runs=side([("sglang:gen_throughput", g, 921.4), ("sglang:mamba_usage", g, 0.0),
                                     ("sglang:num_queue_reqs", g, 0.0), ("sglang:swa_usage", g, 0.0)]))
    md = "\n".join(server_md(c))
    assert "| sglang:gen_throughput | gauge (avg) | tok/s over the engine's last ~5 s, averaged over scrapes | 860.2 | 921.4 |" in md
    assert "| sglang:num_queue_reqs | gauge (avg) | requests waiting | 0.04 | 0 |" in md  # zero in one arm only: kept
    assert "| sglang:mamba_usage" not in md and "| sglang:swa_usage" not in md
    assert md.endswith("Zero or absent in both arms, left out of the table: sglang:mamba_usage, sglang:swa_usage.")


def test_server_metrics_of_another_engine_show_its_own_help_text():
    import pandas as pd
    from types import SimpleNamespace

    from analysis.report import server_md

    cols = ["name", "kind", "value", "description"]
    c = SimpleNamespace(a_label="off", b_label="on",
                        a_runs=[SimpleNamespace(server=pd.DataFrame(
                            [("vllm:num_requests_running", "gauge (avg)", 7.5, "Number of requests in model execution batches."),
                             ("vllm:prompt_tokens", "counter (rate/s)", 812.0, "Number of prefill tokens processed."),
                             ("vllm:mystery", "gauge (avg)", 1.0, "")], columns=cols))],
                        b_runs=[SimpleNamespace(server=pd.DataFrame(
                            [("vllm:num_requests_running", "gauge (avg)", 8.0, "Number of requests in model execution batches."),
                             ("vllm:spec_decode_num_accepted_tokens", "counter (rate/s)", 90.0, "Number of accepted tokens.")],
                            columns=cols))])
    md = "\n".join(server_md(c))
    assert ("| vllm:num_requests_running | gauge (avg) | Number of requests in model execution batches. (engine's help) "
            "| 7.50 | 8.00 |") in md
    assert "| vllm:prompt_tokens | counter (rate/s) | Number of prefill tokens processed., per s (engine's help) |" in md
    assert "| vllm:spec_decode_num_accepted_tokens | counter (rate/s) | Number of accepted tokens., per s" in md  # on only
    assert "| vllm:mystery | gauge (avg) | ? | 1.00 | n/a |" in md


def test_per_arm_latency_rows_pair_matched_requests_and_show_each_arms_own_beside(tmp_path):
    """The quickstart run with six fast requests only `on` sent (test_analysis_compare.with_fast_extras): its TTFT
    p50 over its own requests drops to 14016 ms, which the row shows only as context, beside the medians of the 9
    matched requests (off's own 20569.9 counts a tenth request on never sent)."""
    from test_analysis_compare import with_fast_extras

    md = write_report(with_fast_extras(tmp_path), n_boot=N_BOOT).read_text()
    per_arm = section(md, "Per-arm metrics")
    row = next(x for x in per_arm.splitlines() if x.startswith("| TTFT p50 (ms)"))
    assert row.startswith("| TTFT p50 (ms) | 9 matched | 16919.0 | 22057.1 | +30.4% [") and \
        row.endswith(" | no repeat | 20569.9 / 14016.1 |"), row
    assert "| Requests completed (per run) | all (10 / 15) | 10.00 | 15.00 | +50.0% [" in per_arm
    assert "6 request(s) were dispatched in on only and 1 in off only" in per_arm
