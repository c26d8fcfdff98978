"""Accuracy table for the report, from each arm's accuracy/<task>.jsonl (one line per question per repeat).

The paired tests (exact McNemar for GSM8K, paired test over GPQA repeats,
discordant questions, outputs that differ) belong to pipeline/accuracy/compare.py;
`paired_comparison` calls it when it exists and otherwise says so in the table.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from analysis.load import AnalysisError, read_jsonl
from pipeline.paths import ArmPaths

MAX_DISCORDANT = 20
MAX_DIVERGED = 10
# The emulator's words are a function of the prompt alone (pipeline/emulator/tokens.py OutputWords); only its
# perturbation hook flips them, never the kernel switch (VATTN_QK=e4m3 included): identity proves no numerics.
PERTURB_ENV = "EMULATOR_PERTURB_NUMERICS"   # pipeline/emulator/arm.py
BY_CONSTRUCTION = (f"identical by construction unless numerics are perturbed ({PERTURB_ENV}): it tests the "
                   "plumbing, not the kernel")
EMULATOR_NOTE = ("emulator: answers are filler words, a function of the prompt alone, so accuracy is not "
                 f"meaningful; outputs are {BY_CONSTRUCTION} (a lossy VATTN_QK=e4m3 arm would read identical too)")
DUMMY_WEIGHTS_NOTE = ("dummy weights (server.args.load_format: dummy): the model was never trained, so accuracy is "
                      "not meaningful; identical outputs in both arms, beside the A/A baseline, say that no greedy "
                      "output changed, a weak test of a kernel's numerics on such a model, and none at all where "
                      "every question gets the same answer (sglang's own dummy weights; `--vattn-dummy-init "
                      "scaled` avoids it); the chosen-token logprobs, where kept, are the stronger one")


def dummy_weights(recipe: dict) -> bool:
    """Whether the recipe's engine serves randomly initialised weights (sglang's and vLLM's load_format)."""
    args = (recipe.get("server") or {}).get("args") or {}
    return str(args.get("load_format", "")).lower() == "dummy"


def tasks_of(arm: ArmPaths) -> list[str]:
    d = arm.accuracy_dir
    if not d.is_dir():
        return []
    names = {p.name[: -len(".summary.json")] for p in d.glob("*.summary.json")}
    names |= {p.stem for p in d.glob("*.jsonl")}
    return sorted(names)


class TaskRecords:
    """Each arm's per-question records of one task (accuracy/<task>.jsonl), read once however many tables
    and checks use them."""

    def __init__(self, task: str):
        self.task = task
        self._read: dict[str, tuple[list[dict[str, Any]] | None, str]] = {}

    def rows(self, arm: ArmPaths) -> list[dict[str, Any]] | None:
        """The records; None where the file is missing or torn (`why_none` says which)."""
        return self._get(arm)[0]

    def why_none(self, arm: ArmPaths) -> str:
        return self._get(arm)[1]

    def _get(self, arm: ArmPaths) -> tuple[list[dict[str, Any]] | None, str]:
        path = arm.accuracy_records(self.task)
        if str(path) not in self._read:
            try:  # read_jsonl names a torn line, which the accuracy stage's own reader would skip
                self._read[str(path)] = (read_jsonl(path), "")
            except FileNotFoundError:
                self._read[str(path)] = (None, f"{path} missing")
            except (OSError, AnalysisError) as e:
                self._read[str(path)] = (None, str(e))
        return self._read[str(path)]


def arm_accuracy(arm: ArmPaths, task: str, records: TaskRecords | None = None) -> dict[str, Any] | None:
    """{accuracy, n, questions, repeats, failed} over every record of the per-question file, else from the
    summary: the table's "all records" column. Its headline is the paired accuracy (paired_comparison)."""
    rows = (records or TaskRecords(task)).rows(arm)  # missing or torn: the summary's numbers below
    if rows:
        # A failed record counts as wrong: the denominator is every question asked (as the summary does).
        correct = [bool(r.get("correct")) for r in rows]
        out = {"accuracy": sum(correct) / len(correct), "n": len(rows),
               "questions": len({r.get("id") for r in rows}),
               "repeats": len({r.get("repeat") for r in rows}),
               "failed": sum(bool(r.get("failed")) for r in rows), "source": "records"}
        if all("correct_strict" in r for r in rows):
            out["strict"] = sum(bool(r["correct_strict"]) for r in rows) / len(rows)
        return out
    summ = arm.accuracy_summary(task)
    if summ.is_file():
        try:
            doc = json.loads(summ.read_text())
        except ValueError:
            return None
        acc = doc.get("accuracy") if isinstance(doc, dict) else None
        if isinstance(acc, (int, float)):
            out = {"accuracy": float(acc), "n": doc.get("n_records", "?"), "questions": doc.get("n_questions", "?"),
                   "repeats": doc.get("repeats", "?"), "failed": doc.get("n_failed", "?"), "source": "summary"}
            if isinstance(doc.get("accuracy_strict"), (int, float)):
                out["strict"] = float(doc["accuracy_strict"])
            return out
    return None


def paired_comparison(records: TaskRecords, a: ArmPaths, b: ArmPaths, a_label: str = "off",
                      b_label: str = "on") -> tuple[str, list[str], dict[str, Any] | None]:
    """(table cell, discordant-question lines, paired accuracies: TaskComparison.paired_accuracy or None where
    no test ran) from pipeline.accuracy.compare, which owns the paired tests."""
    try:
        from pipeline.accuracy.compare import compare_records
        from pipeline.accuracy.records import answer_records
    except ImportError:
        return "paired test not available (pipeline.accuracy.compare missing)", [], None
    unread = [records.why_none(arm) for arm in (a, b) if records.rows(arm) is None]
    if unread:  # an arm's numbers came from its summary alone: no question can be paired
        return f"paired test not possible: {'; '.join(unread)}", [], None
    try:
        result = compare_records(records.task, *(answer_records(records.rows(arm)) for arm in (a, b)))
    except (KeyError, ValueError, TypeError) as e:  # a malformed record file must not sink the whole report
        return f"paired test failed: {type(e).__name__}: {e}", [], None
    disc = list(getattr(result.test, "discordant", ()))
    lines = [f"- {d.id}" + (f" (repeat {d.repeat})" if d.repeat is not None else "") +
             f": {_mark(d.off)} -> {_mark(d.on)}" for d in disc[:MAX_DISCORDANT]]
    if len(disc) > MAX_DISCORDANT:
        lines.append(f"- ... and {len(disc) - MAX_DISCORDANT} more")
    return result.cell(a_label, b_label, with_ci=False).replace("|", "/"), lines, result.paired_accuracy()


def identity_lines(records: TaskRecords, a: ArmPaths, b: ArmPaths, a_label: str, b_label: str,
                   note: str = "", emulator: bool = False) -> list[str]:
    """Outputs compared answer by answer (analysis.outputs): how many are identical, where the others first
    differ, in words (tokens, for the emulator), and, where both arms kept logprobs, how far the chosen
    tokens' logprobs moved over the tokens the answers share."""
    import pandas as pd

    from analysis.outputs import identity_summary, logprob_drift, output_identity

    task, recs = records.task, [records.rows(p) for p in (a, b)]
    if None in recs:
        return []
    ra, rb = (pd.DataFrame(r) for r in recs)
    if not {"id", "repeat", "output"} <= set(ra.columns) & set(rb.columns):
        return []
    ra, rb = (r[~r["failed"].fillna(False).astype(bool)] if "failed" in r else r for r in (ra, rb))
    pairs = output_identity(ra, rb)
    s = identity_summary(pairs)
    head = (f"Outputs, {task} ({a_label} vs {b_label}){note}: identical in {s['identical']}/{s['n']} answers "
            f"({s['fraction_identical'] * 100:.0f}%)")
    drift = drift_lines(task, logprob_drift(ra, rb), a_label, b_label, note)
    if s["identical"] == s["n"]:
        return [head + (f": {BY_CONSTRUCTION}." if emulator else "."), *drift]
    lines = [head + f"; the others first differ at word {s['min_first_diff']:.0f} (earliest), "
             f"{s['median_first_diff']:.0f} (median):"]
    diverged = pairs[~pairs["identical"]].sort_values("first_diff")
    for r in diverged.head(MAX_DIVERGED).itertuples():
        lines.append(f"- {r.id} (repeat {r.repeat}): first differs at word {r.first_diff:.0f} of "
                     f"{r.len_a} / {r.len_b}")
    if len(diverged) > MAX_DIVERGED:
        lines.append(f"- ... and {len(diverged) - MAX_DIVERGED} more")
    return lines + drift


def ignored_prompt_lines(records: TaskRecords, arms: dict) -> list[str]:
    """One warning naming the arm runs ({label: ArmPaths}) that gave every question of `task` one and the same
    answer: their model ignores the prompt (sglang's `load_format: dummy` weights do), so no kernel change
    could show in their outputs or logprobs, and identity between them proves nothing."""
    import pandas as pd

    task, blind, questions = records.task, [], 0
    for label, paths in arms.items():
        rows = records.rows(paths)
        r = pd.DataFrame(rows) if rows is not None else None
        if r is not None and {"id", "output"} <= set(r.columns) and r["id"].nunique() >= 2 \
                and r["output"].nunique() == 1:
            blind.append(label)
            questions = max(questions, r["id"].nunique())
    if not blind:
        return []
    return ["", f"**{', '.join(blind)}: every one of the {questions} {task} questions got the same answer, so the "
            f"model ignores its prompt and these comparisons cannot show a kernel change.** With dummy weights, "
            f"`--vattn-dummy-init scaled` in server.args gives answers that depend on the prompt "
            f"(vattn.sglang.dummy_init)."]


def drift_lines(task: str, drift, a_label: str, b_label: str, note: str = "") -> list[str]:
    """One line on the chosen tokens' logprobs (analysis.outputs.logprob_drift); [] where no pair kept them."""
    from analysis.outputs import drift_summary

    d = drift_summary(drift)
    if not d["n"]:
        return []
    head = (f"Chosen-token logprobs, {task} ({a_label} vs {b_label}){note}, over the {d['shared']} tokens the "
            "answers share")
    if not d["moved"]:
        return ["", head + ": identical."]
    return ["", head + f": {d['moved']} moved ({d['fraction_moved'] * 100:.0f}%); largest change "
            f"{d['max_abs']:.3g} nats, the median answer's largest {d['median_max_abs']:.3g}."]


def _mark(v: float) -> str:
    return "right" if v == 1 else "wrong" if v == 0 else f"{v:.2f}"


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not run"
    strict = f" (strict {r['strict'] * 100:.1f}%)" if "strict" in r else ""
    return f"{r['accuracy'] * 100:.1f}%{strict}"


def _paired_cell(p: dict[str, Any] | None, arm: str) -> str:
    """An arm's accuracy over the paired answers; '-' where nothing could be paired."""
    if p is None or p[arm] is None:
        return "-"
    strict = f" (strict {p['strict_' + arm] * 100:.1f}%)" if p.get("strict_" + arm) is not None else ""
    return f"{p[arm] * 100:.1f}%{strict}"


def _delta_cell(p: dict[str, Any] | None, differ: int | None = None) -> str:
    """Delta and CI; tagged "(no question differs)" wherever no question's correctness differs (`differ`: the
    discordant count), whichever interval the test used, so that tasks read alike."""
    if p is None or p["delta"] is None:
        return "-"
    ci = f" [{p['ci_low'] * 100:+.1f}, {p['ci_high'] * 100:+.1f}]" if p["ci_low"] is not None else ""
    same = differ == 0 or p["ci_method"].startswith("no question differs")
    return f"{p['delta'] * 100:+.1f}{ci}{' (no question differs)' if same else ''}"


# An answer the parser could not read scores wrong in both arms alike: past this share of an arm's records the
# score measures the parser or the token budget, not the kernel.
MAX_INVALID_SHARE = 0.2


def answer_quality(arm: ArmPaths, task: str) -> dict[str, Any] | None:
    """{invalid, truncated: shares of the records, max_tokens} from the accuracy stage's summary; None without it."""
    try:
        doc = json.loads(arm.accuracy_summary(task).read_text())
    except (OSError, ValueError):
        return None
    n = doc.get("n_records") if isinstance(doc, dict) else None
    if not isinstance(n, int) or n <= 0 or not isinstance(doc.get("invalid_rate"), (int, float)):
        return None
    trunc = doc.get("n_truncated")
    return {"invalid": float(doc["invalid_rate"]), "truncated": trunc / n if isinstance(trunc, int) else None,
            "max_tokens": (doc.get("generation") or {}).get("max_tokens")}


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _quality_cell(qa: dict | None, qb: dict | None) -> str:
    return "; ".join("-" if q is None else f"{_share(q['invalid'])} / {_share(q['truncated'])}" for q in (qa, qb))


def quality_warning(task: str, qa: dict | None, qb: dict | None, a_label: str, b_label: str) -> list[str]:
    """A bold line where an arm's invalid share passes MAX_INVALID_SHARE."""
    if not any(q and q["invalid"] > MAX_INVALID_SHARE for q in (qa, qb)):
        return []
    inv = " and ".join(f"{_share(q['invalid'] if q else None)} of {label}'s" for q, label in ((qa, a_label),
                                                                                             (qb, b_label)))
    budget = next((q["max_tokens"] for q in (qa, qb) if q and q.get("max_tokens")), None)
    trunc = " / ".join(_share(q["truncated"] if q else None) for q in (qa, qb))
    return ["", f"**{task}: {inv} answers had no parseable answer (over {MAX_INVALID_SHARE:.0%}): the score measures "
            f"the parser or the token budget ({f'max_tokens {budget}; ' if budget else ''}{trunc} truncated), not "
            "the kernel.**"]


def detectable_line(task: str, p: dict[str, Any] | None) -> list[str]:
    """The smallest accuracy change the task's sample could show: the paired CI's half-width, in words."""
    if p is None or p.get("ci_low") is None or p.get("ci_high") is None:
        return []
    unit = "answers" if p["ci_method"] == "Tango score" else "questions"
    half = (p["ci_high"] - p["ci_low"]) * 100 / 2
    return [f"- {task}: with {p['n']} paired {unit} the 95% CI spans ±{half:.1f} pts: a smaller accuracy change "
            "would not show."]


TABLE_NOTE = ("{a} and {b}: accuracy over the answers both arms gave (the paired test's n; a question that failed in "
              "either arm, or that one arm never asked, is left out of both). Delta: {b} - {a} over those answers, "
              "95% CI by Tango's score interval for paired proportions where a question has one answer, else by a "
              "bootstrap over questions, each with its repeats (accuracy is then the mean over questions of each "
              "one's mean over its repeats); \"no question differs\": the bound on the share of questions that "
              "differ that 0 of n allows (Wilson's score limit), where a bootstrap would say [0, 0]; the tag marks every task "
              "where no question's correctness differs, whichever interval it has. Invalid / truncated: the "
              "accuracy stage's shares of each arm's records with no parseable answer / cut at max_tokens. All records: "
              "every record of each arm, a failed one counted wrong (as the accuracy stage's summary counts it); n "
              "and failed count those records.")


def accuracy_md(a: ArmPaths, b: ArmPaths, a_label: str, b_label: str, engine: str | None,
                repeats: Sequence[tuple[ArmPaths, ArmPaths, str, str]] = (), *, dummy: bool = False) -> list[str]:
    """The accuracy table, then output identity a vs b and, for each (first run, repeat, names) in
    `repeats`, the same arm against its repeat: the A/A baseline (batching and cache hits alone can
    change greedy outputs in an engine, so identity off vs on means something only beside it).
    dummy: the engine served dummy weights (dummy_weights), said above the table as the emulator is."""
    tasks = sorted(set(tasks_of(a)) | set(tasks_of(b)))
    if not tasks:
        return ["Accuracy: not run."]
    lines = []
    if engine == "emulator":
        lines += [f"**{EMULATOR_NOTE}**", ""]
    elif dummy:
        lines += [f"**{DUMMY_WEIGHTS_NOTE}**", ""]
    # The headline columns come from the paired test's own pairs: accuracy over each arm's every record
    # would score a failed or missing answer as wrong in one arm only and contradict the test beside it.
    lines += [f"| task | {a_label} | {b_label} | delta (pp) [95% CI] | n ({a_label} / {b_label}) | failed | "
              f"invalid / truncated ({a_label}; {b_label}) | all records ({a_label} / {b_label}) | paired test |",
              "|---|---|---|---|---|---|---|---|---|"]
    discordant: list[str] = []
    warnings: list[str] = []
    detectable: list[str] = []
    identity: list[str] = []
    for t in tasks:
        records = TaskRecords(t)
        ra, rb = arm_accuracy(a, t, records), arm_accuracy(b, t, records)
        test, disc, p = paired_comparison(records, a, b, a_label, b_label) if ra and rb else ("-", [], None)
        fa, fb = (_paired_cell(p, arm) if r else "not run" for r, arm in ((ra, "off"), (rb, "on")))
        n = f"{ra['n'] if ra else '-'} / {rb['n'] if rb else '-'}"
        failed = f"{ra['failed'] if ra else '-'} / {rb['failed'] if rb else '-'}"
        qa, qb = answer_quality(a, t), answer_quality(b, t)
        lines.append(f"| {t} | {fa} | {fb} | {_delta_cell(p, len(disc) if p else None)} | {n} | {failed} | "
                     f"{_quality_cell(qa, qb)} | {_cell(ra)} / {_cell(rb)} | {test} |")
        warnings += quality_warning(t, qa, qb, a_label, b_label)
        detectable += detectable_line(t, p)
        if disc:
            discordant += ["", f"Discordant questions, {t} ({a_label} -> {b_label}):", *disc]
        pairs = [(a, b, a_label, b_label, "")] + [(*r, ", A/A baseline") for r in repeats]
        for x, y, x_label, y_label, note in pairs:
            if records.rows(x) is not None and records.rows(y) is not None:
                identity += ["", *identity_lines(records, x, y, x_label, y_label, note, engine == "emulator")]
        identity += ignored_prompt_lines(records, {label: arm for x, y, x_label, y_label, _ in pairs
                                             for label, arm in ((x_label, x), (y_label, y))})
    detectable = ["", "Smallest detectable accuracy change:", *detectable] if detectable else []
    return lines + warnings + detectable + ["", TABLE_NOTE.format(a=a_label, b=b_label)] + identity + discordant
