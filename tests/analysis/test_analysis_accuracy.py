"""analysis.accuracy: per-arm accuracy from per-question records, summary fallback, "not run"."""
from __future__ import annotations

import json
from pathlib import Path

from analysis_records import write_jsonl

from analysis.accuracy import DUMMY_WEIGHTS_NOTE, accuracy_md, arm_accuracy, dummy_weights, tasks_of
from pipeline.paths import ArmPaths


def q(i, correct, failed=False, strict=None, repeat=0):
    r = {"id": f"q{i}", "repeat": repeat, "correct": correct, "failed": failed}
    if strict is not None:
        r["correct_strict"] = strict
    return r


def test_records_failed_count_as_wrong_and_strict(tmp_path):
    arm = ArmPaths(tmp_path / "off")
    write_jsonl(arm.accuracy_records("gsm8k"), [q(0, True, strict=True), q(1, True, strict=False),
                                                 q(2, False, failed=True, strict=False), q(3, False, strict=False)])
    got = arm_accuracy(arm, "gsm8k")
    assert got["accuracy"] == 0.5 and got["strict"] == 0.25 and got["failed"] == 1 and got["n"] == 4


def test_repeats_and_summary_fallback(tmp_path):
    arm = ArmPaths(tmp_path / "on")
    write_jsonl(arm.accuracy_records("gpqa"), [q(0, True, repeat=0), q(0, False, repeat=1), q(1, True, repeat=0),
                                                q(1, True, repeat=1)])
    assert arm_accuracy(arm, "gpqa") | {} == {"accuracy": 0.75, "n": 4, "questions": 2, "repeats": 2, "failed": 0,
                                              "source": "records"}
    arm.accuracy_summary("other").write_text(json.dumps({"accuracy": 0.4, "n_records": 10, "n_failed": 1,
                                                         "n_questions": 5, "repeats": 2}))
    assert tasks_of(arm) == ["gpqa", "other"]
    assert arm_accuracy(arm, "other")["accuracy"] == 0.4 and arm_accuracy(arm, "other")["source"] == "summary"


def test_table_not_run_and_one_sided(tmp_path):
    a, b = ArmPaths(tmp_path / "off"), ArmPaths(tmp_path / "on")
    assert accuracy_md(a, b, "off", "on", "sglang") == ["Accuracy: not run."]
    write_jsonl(b.accuracy_records("gsm8k"), [q(0, True, strict=True), q(1, False, strict=False)])
    lines = accuracy_md(a, b, "off", "on", "sglang")
    # one arm alone pairs nothing: its accuracy over every record, and no paired headline
    assert _row(lines, "gsm8k") == "| gsm8k | not run | - | - | - / 2 | - / 0 | -; - | not run / 50.0% (strict 50.0%) | - |"
    assert not any("not meaningful" in line for line in lines)


def test_paired_test_failure_is_reported_in_the_cell_not_raised(tmp_path):
    a, b = ArmPaths(tmp_path / "off"), ArmPaths(tmp_path / "on")
    for arm in (a, b):   # gsm8k records without the strict fields the paired McNemar needs
        write_jsonl(arm.accuracy_records("gsm8k"), [dict(q(0, True), output="x"), dict(q(1, False), output="y")])
    row = accuracy_md(a, b, "off", "on", "sglang")[2]
    assert row.startswith("| gsm8k | - | - | - | 2 / 2 | 0 / 0 | -; - | 50.0% / 50.0% | paired test failed: KeyError")


def test_identity_beside_the_aa_baseline(tmp_path):
    """off vs on first, then each arm against its repeat, labelled as the A/A baseline; a divergence in
    the repeat is reported with its position like any other."""
    off, on, off2 = (ArmPaths(tmp_path / n) for n in ("off", "on", "off.2"))
    same = [dict(q(i, False, strict=False), output=f"a b c {i}") for i in range(3)]
    for arm in (off, on):
        write_jsonl(arm.accuracy_records("gsm8k"), same)
    write_jsonl(off2.accuracy_records("gsm8k"), same[:2] + [dict(same[2], output="a b x 2")])
    lines = accuracy_md(off, on, "off", "on", "sglang", [(off, off2, "off", "off.2")])
    assert "Outputs, gsm8k (off vs on): identical in 3/3 answers (100%)." in lines
    assert ("Outputs, gsm8k (off vs off.2), A/A baseline: identical in 2/3 answers (67%); the others first "
            "differ at word 2 (earliest), 2 (median):") in lines
    assert lines.index("Outputs, gsm8k (off vs on): identical in 3/3 answers (100%).") < len(lines) - 2


def test_dummy_weights_are_said_above_the_table(tmp_path):
    """A real engine on dummy weights (the H200 sglang recipes) answers no question right in either arm: the
    table says why, and that output identity is the check."""
    a, b = ArmPaths(tmp_path / "off"), ArmPaths(tmp_path / "on")
    for arm in (a, b):
        write_jsonl(arm.accuracy_records("gsm8k"), [q(0, False, strict=False)])
    assert accuracy_md(a, b, "off", "on", "sglang", dummy=True)[0] == f"**{DUMMY_WEIGHTS_NOTE}**"
    assert not any("dummy weights" in line for line in accuracy_md(a, b, "off", "on", "sglang"))
    assert dummy_weights({"server": {"args": {"load_format": "dummy"}}})
    assert not dummy_weights({"server": {"args": {"load_format": "auto"}}}) and not dummy_weights({})
    assert not dummy_weights({"server": {"args": None}})


def test_arms_that_answer_every_question_alike_are_named_once_per_task(tmp_path):
    """sglang's own dummy weights answered 40 different questions with one output in every arm (H100 and H200,
    2026-12-05/06): identity then holds whatever the kernel does, and the report says so once, naming the arms.
    An arm whose answers differ between questions is not named, nor is a task of a single question."""
    off, on, off2 = (ArmPaths(tmp_path / n) for n in ("off", "on", "off.2"))
    blind = [dict(q(i, False, strict=False), output="ertif control") for i in range(3)]
    for arm in (off, on):
        write_jsonl(arm.accuracy_records("gsm8k"), blind)
    write_jsonl(off2.accuracy_records("gsm8k"), [dict(r, output=f"answer {i}") for i, r in enumerate(blind)])
    lines = accuracy_md(off, on, "off", "on", "sglang", [(off, off2, "off", "off.2")])
    warnings = [line for line in lines if "got the same answer" in line]
    assert warnings == ["**off, on: every one of the 3 gsm8k questions got the same answer, so the model ignores "
                        "its prompt and these comparisons cannot show a kernel change.** With dummy weights, "
                        "`--vattn-dummy-init scaled` in server.args gives answers that depend on the prompt "
                        "(vattn.sglang.dummy_init)."]
    for arm in (off, on):
        write_jsonl(arm.accuracy_records("gpqa"), blind[:1])
    assert sum("gpqa questions got the same answer" in line for line in accuracy_md(off, on, "off", "on", "x")) == 0


QUICKSTART_ARMS = Path(__file__).parent / "data" / "quickstart_run" / "arms"


def _quickstart_gsm8k(tmp_path, edit_off, edit_on) -> tuple[ArmPaths, ArmPaths]:
    """The quickstart run's own gsm8k records (20 questions, emulator outputs, which differ between its arms)
    with `correct` and `failed` rewritten per arm: real record files, ids and outputs as the stage wrote them."""
    arms = []
    for name, edit in (("off", edit_off), ("on", edit_on)):
        arm = ArmPaths(tmp_path / name)
        rows = [json.loads(line) for line in
                (QUICKSTART_ARMS / name / "accuracy" / "gsm8k.jsonl").read_text().splitlines()]
        write_jsonl(arm.accuracy_records("gsm8k"), edit(rows))
        arms.append(arm)
    return arms[0], arms[1]


def _right_where(pred):
    def edit(rows):
        return [dict(r, correct=pred(i), correct_strict=pred(i)) for i, r in enumerate(rows)]
    return edit


def _row(lines, task):
    return next(line for line in lines if line.startswith(f"| {task} |"))


def test_failed_answers_move_neither_the_headline_nor_the_delta(tmp_path):
    """Repro A: the same answers in both arms, on's first 6 requests failed. The paired test leaves those 6
    out; so must the accuracies and the delta beside it (over every record they read 60% vs 30%, -30 pp,
    from timeouts alone). Every record's accuracy and the failures stay in the table."""
    from analysis.accuracy import TABLE_NOTE

    right = _right_where(lambda i: i < 12)

    def fail6(rows):
        return [dict(r, failed=True, correct=False, correct_strict=False) if i < 6 else r
                for i, r in enumerate(right(rows))]
    off, on = _quickstart_gsm8k(tmp_path, right, fail6)
    lines = accuracy_md(off, on, "off", "on", "emulator")
    # 14 paired answers (6..19), 6 right in both; no discordant pair: Tango's +-z^2 / (14 + z^2)
    assert _row(lines, "gsm8k") == (
        "| gsm8k | 42.9% (strict 42.9%) | 42.9% (strict 42.9%) | +0.0 [-21.5, +21.5] (no question differs) | 20 / 20 | "
        "0 / 6 | -; - | "
        "60.0% (strict 60.0%) / 30.0% (strict 30.0%) | McNemar exact p=1 (off-only 0, on-only 0, n=14); "
        "strict p=1; outputs differ 14/14; 6 unpaired/failed excluded |")
    assert TABLE_NOTE.format(a="off", b="on") in lines


def test_a_truncated_arm_is_compared_on_the_questions_both_asked(tmp_path):
    """Repro B: on's file holds only off's first 10 questions, with the same answers. Over every record the
    table read 50% vs 0%, -50 pp; over the 10 questions both arms answered, nothing changed."""
    right = _right_where(lambda i: i >= 10)
    off, on = _quickstart_gsm8k(tmp_path, right, lambda rows: right(rows)[:10])
    row = _row(accuracy_md(off, on, "off", "on", "emulator"), "gsm8k")
    assert row.startswith("| gsm8k | 0.0% (strict 0.0%) | 0.0% (strict 0.0%) | +0.0 [-27.8, +27.8] (no question differs) | 20 / 10 | "
                          "0 / 0 | -; - | 50.0% (strict 50.0%) / 0.0% (strict 0.0%) | McNemar exact p=1 (off-only 0, "
                          "on-only 0, n=10);")
    assert row.endswith("; 10 unpaired/failed excluded |")


def test_a_changed_answer_gets_a_delta_whose_ci_matches_the_test(tmp_path):
    """4 answers right in off turned wrong in on, of the quickstart's 20: -20 pp, CI Tango's for (4, 0, 20)."""
    from pipeline.accuracy.compare import paired_difference_ci

    off, on = _quickstart_gsm8k(tmp_path, _right_where(lambda i: i < 8), _right_where(lambda i: i < 4))
    lo, hi = paired_difference_ci(4, 0, 20)
    row = _row(accuracy_md(off, on, "off", "on", "emulator"), "gsm8k")
    assert row.startswith(f"| gsm8k | 40.0% (strict 40.0%) | 20.0% (strict 20.0%) | -20.0 [{lo * 100:+.1f}, "
                          f"{hi * 100:+.1f}] | 20 / 20 | 0 / 0 | -; - | 40.0% (strict 40.0%) / 20.0% (strict 20.0%) | "
                          "McNemar exact p=0.125 (off-only 4, on-only 0, n=20)")
    assert hi < 0


def test_gpqa_repeats_are_paired_by_question(tmp_path):
    """The quickstart's gpqa_diamond (10 questions x 2 repeats): one question's two answers turn right in on.
    Delta = 1/10 over questions; its bootstrap CI resamples questions, so it spans 0 and +10 pp exactly."""
    off, on = ArmPaths(tmp_path / "off"), ArmPaths(tmp_path / "on")
    for arm in (off, on):
        rows = [json.loads(line) for line in
                (QUICKSTART_ARMS / arm.root.name / "accuracy" / "gpqa_diamond.jsonl").read_text().splitlines()]
        assert len(rows) == 20 and {r["repeat"] for r in rows} == {0, 1}
        if arm is on:
            rows = [dict(r, correct=r["id"] == rows[0]["id"]) for r in rows]
        write_jsonl(arm.accuracy_records("gpqa_diamond"), rows)
    row = _row(accuracy_md(off, on, "off", "on", "emulator"), "gpqa_diamond")
    assert row.startswith("| gpqa_diamond | 0.0% | 10.0% | +10.0 [+0.0, +30.0] | 20 / 20 | 0 / 0 | -; - | 0.0% / 10.0% | ")
