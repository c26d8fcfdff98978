"""The report's verdict line and the two sections behind it: the primary estimate, and what the run
could have seen. Markdown only; the numbers come from analysis.estimate through the Comparison."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from analysis import estimate as est
from analysis import stats
from analysis.formatting import fmt_delta, fmt_floor

if TYPE_CHECKING:
    from analysis.compare import Comparison

# What the verdict line calls each estimator, and what the estimate table adds to say how it is computed.
LABELS = {
    "median": "median per-request change",
    "trimmed_mean": f"{int(est.TRIM * 100)}% trimmed mean per-request change",
    "hodges_lehmann": "typical per-request change (Hodges-Lehmann)",
    "mean_log": "geometric-mean per-request change",
}
DETAILS = {
    "median": "median of log-ratios",
    "trimmed_mean": f"mean of log-ratios without the lowest and highest {int(est.TRIM * 100)}%",
    "hodges_lehmann": "median of the pairwise means of log-ratios",
    "mean_log": "mean of log-ratios; not robust, a control",
}


def _floor_clause(e: est.Estimate, floor: float | None) -> str:
    """Whether the CI is wider than the A/A floor: a CI inside the floor means launch drift, not this
    run's request noise, limits what the run can claim."""
    if floor is None or not np.isfinite(floor):
        if e.launches > 1:
            return "no A/A floor (no arm ran twice)"
        return (f"no A/A floor (no arm ran twice): the CI assumes a launch drift of {est.LAUNCH_SD_LOG * 100:.1f}% a "
                "launch (fitted on the emulator); repeating arms (ABBA) measures it")
    half = e.width / 2
    if half > floor:
        return (f"CI half-width ±{half:.1f}% is wider than the A/A floor {fmt_floor(floor)}: this run's request noise, more "
                "than launch drift, sets it")
    return (f"CI half-width ±{half:.1f}% is narrower than the A/A floor {fmt_floor(floor)}: launch drift, not request noise, "
            "limits what this run can claim")


# Where one arm errored on more of the requests than the other by this share of the pairs, the matched requests
# are a survivor set: that arm's failed requests (maybe its slowest: timeouts) are missing from the pairs, so a
# speed verdict on the rest could mislead. Errors as frequent in both arms drop requests from both alike.
MAX_ONE_ARM_ERROR_SHARE = 0.02


def _one_arm_errors(c: "Comparison") -> tuple[str, bool]:
    """(the clause naming requests that errored in one arm only, whether one arm has too many more for a verdict)."""
    k = c.match_counts
    ea, eb = k.get("errored_a", 0), k.get("errored_b", 0)
    if not ea and not eb:
        return "", False
    sides = " and ".join(f"{n} in {label} only" for n, label in ((eb, c.b_label), (ea, c.a_label)) if n)
    excess = abs(eb - ea) / max(1, k.get("matched", 0) + ea + eb)
    return f"requests that errored (not cancelled) {sides}, left out of the pairs", excess > MAX_ONE_ARM_ERROR_SHARE


def verdict_line(c: "Comparison") -> str | None:
    """Effect, CI, matched n and the A/A-floor comparison, from the primary estimate; None without pairs."""
    e = c.primary
    if e is None or e.n == 0:
        return None
    head = (f"**Verdict:** {c.b_label} vs {c.a_label}: decode time per token, {LABELS[e.name]} "
            f"{fmt_delta(e.pct, e.lo, e.hi)} (n={e.n} matched requests, {e.sessions} sessions"
            + (f", {e.launches} launches" if e.launches > 1 else "") + ")")
    errors, too_many = _one_arm_errors(c)
    if too_many:
        return (f"{head}: no speed verdict: {errors}, one arm more than the other by over {MAX_ONE_ARM_ERROR_SHARE:.0%} "
                "of the pairs; the matched requests are only those both arms served. Find why the requests failed "
                "(server logs) first.")
    if errors:
        head += f"; {errors}"
    if not np.isfinite(e.lo):
        return (f"{head}: no conclusion: {e.sessions} session(s), fewer than the {stats.MIN_SESSIONS} a "
                "session bootstrap needs; run longer or with more sessions.")
    floor = _floor_clause(e, c.primary_floor)
    if e.launches_disagree():  # the CI is then as wide as a few launches' spread makes it: say where it comes from
        per = ", ".join(f"{p:+.1f}%" for p in e.launch_pcts)
        floor += (f"; the launches disagree (per launch pair: {per}), more than their requests' noise explains, "
                  "so the CI is set by launch-to-launch drift: more launch pairs narrow it, a longer window does not")
    if not e.excludes_zero():
        return (f"{head}: no change detected (the 95% CI includes 0; this run could have seen about "
                f"{e.mde_pct():.1f}% or more); {floor}.")
    word = "slower" if e.lo > 0 else "faster"
    if c.primary_floor is not None and np.isfinite(c.primary_floor) and abs(e.pct) <= c.primary_floor:
        return f"{head}: {word}, but within the A/A noise floor; {floor}."
    return f"{head}: {word}; the 95% CI excludes 0; {floor}."


def primary_md(c: "Comparison") -> list[str]:
    """Every candidate estimator on the matched pairs, the primary marked, and the ratio of means."""
    if c.candidates is None or c.candidates.empty:
        return []
    lines = [f"Per-request change of decode time per token, log-ratio log({c.b_label}/{c.a_label}) per matched request, "
             "summarised and shown as (exp(x) - 1); 95% CI: the centre +- t(sessions - 1) x sqrt(sessions / "
             "(sessions - 1)) x its standard error, the bootstrap resampling sessions; with one launch of each arm "
             f"the error adds an assumed launch drift of {est.LAUNCH_SD_LOG * 100:.1f}% a launch in quadrature, which "
             "one launch pair cannot measure. When arms repeat, a resample draws sessions once for every launch "
             "(they replay the same sessions), the spread of the launch pairs' own centres measures the drift, and "
             "the t takes Welch-Satterthwaite degrees of freedom from both: the CI covers what other launches of "
             "these sessions would give, and with two launch pairs it is wide when they disagree. "
             f"The verdict uses the **{LABELS[est.PRIMARY]}**, chosen on recorded runs (BENCHMARKS.md, \"Verdict "
             "calibration\"): robust to the few requests that overlapped another session's prefill in one arm.",
             "", "| estimate | delta [95% CI] | CI excludes 0 |", "|---|---|---|"]
    for r in c.candidates.itertuples():
        mark = " (primary)" if r.estimator == est.PRIMARY else ""
        lines.append(f"| {LABELS[r.estimator]}: {DETAILS[r.estimator]}{mark} | {fmt_delta(r.pct, r.lo, r.hi)} | "
                     f"{'yes' if r.excludes_zero else 'no'} |")
    m = c.matched[c.matched["key"] == "tpot_ms"] if not c.matched.empty else c.matched
    if len(m):
        r = m.iloc[0]
        lines.append(f"| ratio of matched means (secondary: follows the slowest requests) | "
                     f"{fmt_delta(r['delta_pct'], r['lo'], r['hi'])} | "
                     f"{'yes' if r['lo'] > 0 or r['hi'] < 0 else 'no'} |")
    return lines


def sensitivity_md(c: "Comparison", target_pct: float | None) -> list[str]:
    """The smallest effect this run could detect, and the window a given effect would need."""
    e = c.primary
    if e is None or not np.isfinite(e.se_log):
        return ["Too few sessions for a bootstrap: no detectable-effect figure."]
    mde = e.mde_pct()
    k = e.k if np.isfinite(e.k) else est.small_sample_factor(e.sessions)
    lines = [f"Smallest detectable effect: {mde:.1f}% (a true change this large would give a 95% CI that "
             f"excludes 0 in 80% of runs like this one: ({k:.2f} + 0.84) x the bootstrap standard error, "
             f"{e.se_log * 100:.2f}% in log units, over {e.n} matched requests in a {c.window_s:.0f} s window)."]
    targets = [t for t in (target_pct, 5.0, 2.0) if t]
    for t in dict.fromkeys(targets):
        need = est.window_for_effect(c.window_s, e, t)
        src = " (the recipe's target_effect)" if t == target_pct else ""
        if need <= c.window_s:
            verdict = "this window suffices"
        elif np.isinf(need):
            verdict = (f"no window suffices with one launch of each arm: the assumed launch drift alone "
                       f"({est.LAUNCH_SD_LOG * 100:.1f}% a launch) is too large; repeat the arms (ABBA)"
                       if e.launches == 1 else "no window suffices: the launches' measured drift alone is too "
                       "large; run more launch pairs")
        else:
            verdict = f"about {need:.0f} s of window ({need / c.window_s:.1f}x this one) at this noise level"
        lines.append(f"- a {t:g}% effect{src}: {verdict}.")
    lines.append("The window estimate assumes the requests' part of the standard error narrows as "
                 "1 / sqrt(matched requests) and that matched requests grow in proportion to the window; the "
                 "launch-to-launch drift (assumed with one launch pair, measured from the launches' spread when arms "
                 "repeat) does not shrink with a longer window, so compare with the A/A floor when the recipe "
                 "repeats an arm.")
    return lines
