"""`pipeline report`: RUN_DIR -> report.md + plots/*.png. The only module of analysis/ that writes files.

    write_report(run_dir)                       off vs on of one run -> RUN_DIR/report.md
    write_report(run_dir, out)                  ... -> out, its plots in out's folder (plots/<run name>_*.png)
    write_report(a_dir, compare=b_dir)          a's `on` vs b's `on` -> B_DIR/compare_<a name>.md
    write_report(a_dir, compare=b_dir, out=f)   ... -> f, its plots in f's folder: neither run is written
    write_report(a_dir, compare=b_dir, arms=("on", "off"))   named arms
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from analysis import acceptance, accuracy, cycles, engine_paths, placement, plots, stats
from analysis import verdict as verdict_md
from analysis.compare import Comparison, compare as run_compare
from analysis.formatting import fmt, fmt_delta, fmt_floor
from analysis.load import AnalysisError, warmup_priming
from analysis.provenance import provenance_md, run_differences
from analysis.rundir import Run, load_run
from pipeline.io import write_text_atomic
from pipeline.paths import RunPaths
from vattn import switch

ReportError = AnalysisError  # what the CLI catches: one line, no traceback

_METRIC_DEFINITIONS = (
    "TPOT is aiperf's per-request `inter_token_latency`: (request latency - TTFT) / (output tokens - 1). "
    "Interactivity is tokens per second per user, defined as 1000 / TPOT[ms]; \"at TPOT p50\" uses the "
    "median TPOT and \"at TPOT p90\" the 90th-percentile (slow-tail) TPOT. Output throughput is output "
    "tokens of completed requests divided by the measured window (aiperf's profiling phase, to its last "
    "request's end), summed over repeats; it has no CI, because one request's end sets that window and a session "
    "bootstrap would hold it fixed. Output throughput over an equal window counts the output tokens each arm "
    "run emitted in the "
    "same W seconds from its profiling start (W: the recipe's duration, at most the shortest window; a "
    "request's first token at its TTFT, the rest spread evenly to its end), so an arm whose last requests "
    "spill into the grace period is not measured over a longer window. Percentiles interpolate linearly between order statistics.")
_CI_DEFINITIONS = (
    "95% CIs come from a paired bootstrap that resamples whole sessions (a conversation together with its "
    "subagents' conversations, which aiperf names `<session>::sa:<agent>`) "
    f"{stats.N_BOOT} times with seed {stats.SEED}. The A/A noise floor, when an arm ran twice, is the "
    "largest |delta| inside the 95% CI of the same statistic between the two runs of one arm: a delta "
    "smaller than it cannot be told from run-to-run drift. A delta marked \"no spread\" did not move when sessions "
    "were resampled: every session did the same work in both arms (the same requests completed with the same "
    "tokens), so a rate's delta is the ratio of the windows; only the A/A floor of a repeat says whether it is "
    "more than drift.")


def definitions(c: Comparison) -> str:
    """The per-arm table's footnote, its delta in this report's own labels."""
    return f"{_METRIC_DEFINITIONS} Delta = ({c.b_label} - {c.a_label}) / {c.a_label}. {_CI_DEFINITIONS}"


def verdict(c: Comparison) -> str:
    """One line: the primary per-request estimate on matched requests (analysis.verdict); with no matched
    request, TPOT p50 of each arm's own requests."""
    line = verdict_md.verdict_line(c)
    if line is not None:
        return line
    row = c.arm_own[c.arm_own["key"] == "tpot_p50"].iloc[0]  # the table's own row has no pair to compare
    head = f"**Verdict:** {c.b_label} vs {c.a_label}: TPOT p50 {fmt_delta(row['delta_pct'], row['lo'], row['hi'])}"
    if not (np.isfinite(row["lo"]) and np.isfinite(row["hi"])):
        return (f"{head}: no conclusion: {row['sessions']} session(s) behind it, fewer than the "
                f"{stats.MIN_SESSIONS} a session bootstrap needs; run longer or with more sessions.")
    if not (row["lo"] > 0 or row["hi"] < 0):
        return f"{head}: no change detected (the 95% CI includes 0); no request completed in both arms."
    return f"{head}: {'slower' if row['lo'] > 0 else 'faster'}; the 95% CI excludes 0; no request completed in both arms."


def load_md(c: Comparison) -> list[str]:
    lines = ["| arm run | profiling requests | completed | failed | cancelled | no TPOT | warmup excluded "
             "| window (s) |", "|---|---|---|---|---|---|---|---|"]
    for label, r in [(c.a_label, r) for r in c.a_runs] + [(c.b_label, r) for r in c.b_runs]:
        k = r.counts
        lines.append(f"| {_series_name(label, r)} | {k['total']} | {k['completed']} | {k['failed']} | "
                     f"{k['cancelled']} | {k['no_tpot']} | {r.warmup_records} | {r.window_s:.1f} |")
    return lines + priming_md(c)


def priming_md(c: Comparison) -> list[str]:
    """One line on the sessions the warm-up primed, where the load stage recorded them: a session it missed starts
    cold in the window, its long first prefill queued behind or ahead of the others' turns."""
    runs = [(_series_name(label, r), warmup_priming(r.paths.stage_result("load")))
            for label, runs in ((c.a_label, c.a_runs), (c.b_label, c.b_runs)) for r in runs]
    runs = [(name, p) for name, p in runs if p]
    if not runs:
        return []
    (first, p0), rest = runs[0], runs[1:]
    counts = ", ".join([f"{p0[0]} of the trace's {p0[1]} sessions ({first})"]
                       + [f"{p[0]} of {p[1]} ({name})" for name, p in rest])
    cold = sorted({p[1] - p[0] for _, p in runs})
    line = f"Warm-up primed the first call of {counts}"
    if cold == [0]:
        return ["", line + "."]
    return ["", line + f"; the other {' / '.join(map(str, cold))} start cold in the window: TTFT rows are then "
                       "dominated by those cold prefills and the queueing behind them, not by decode."]


def arm_table_md(c: Comparison, grace: str = "") -> list[str]:
    """The per-arm table and its notes; `grace`: the load's duration + grace period in words, where known."""
    done_a = sum(r.counts["completed"] for r in c.a_runs)
    done_b = sum(r.counts["completed"] for r in c.b_runs)
    lines = [f"| metric | requests | {c.a_label} | {c.b_label} | delta [95% CI] | A/A noise floor | "
             f"all requests: {c.a_label} / {c.b_label} |", "|---|---|---|---|---|---|---|"]
    # The equal-window throughput is the headline rate; the own-window row, which no CI can bound, closes the table.
    last = {"throughput_equal_window": 1, "completed": 2, "throughput": 3}   # rates after the latencies, in this order
    rows = sorted(c.arm_table.itertuples(), key=lambda r: last.get(r.key, 0))
    for r in rows:
        counted = f"{int(r.n)} matched" if r.basis == "matched" else f"all ({done_a} / {done_b})"
        lines.append(f"| {r.metric} | {counted} | {fmt(r.a)} | {fmt(r.b)} | "
                     f"{fmt_delta(r.delta_pct, r.lo, r.hi, r.why)} | {fmt_floor(r.floor, c.aa_source is not None)} "
                     f"| {fmt(r.a_all)} / {fmt(r.b_all)} |")
    k = c.match_counts
    lines += ["", "Rows on matched requests (TPOT, interactivity, TTFT, E2E latency) give each arm's statistic over "
                  "the same requests, completed in both arms (as in Matched requests below): their delta, CI and A/A "
                  "floor are paired by request and resample sessions, as the verdict does. Rows on all requests "
                  "(throughput, requests completed) count each arm's own requests: serving more of them is what a rate "
                  "measures. The last column gives every row over each arm's own completed requests, for context, "
                  "with no CI"
                  + (f": {k['only_b']} request(s) were dispatched in {c.b_label} only and {k['only_a']} in "
                     f"{c.a_label} only (the faster arm reaches further into each session before the window ends), "
                     "so there its latency values compare different requests." if k["only_a"] or k["only_b"] else
                     "; here both arms dispatched the same requests.")]
    lines += ["", "A percentile row's CI can include 0 where the verdict's excludes it: the verdict is the trimmed mean of "
                  "per-request log-ratios over matched requests, which pairs each request with itself; a percentile "
                  "of each arm moves with whichever requests sit at it."]
    if grace:
        lines += ["", f"aiperf's own summary divides by the window plus its grace period ({grace}), the same for both "
                      "arms: its throughput delta is the ratio of output tokens, whatever time each arm took."]
    if c.aa_source:
        lines += ["", f"A/A noise floor from: {c.aa_source}. Each row's floor counts the requests its row counts "
                      "(matched between the two runs, or all). Repeats of an arm are pooled in this table; matched "
                      "requests pair the k-th run of each arm."]
    return lines


def matched_md(c: Comparison) -> list[str]:
    k = c.match_counts
    lines = [f"Matched on (conversation_id, turn_index, k-th occurrence): {k['matched']} pairs completed by both; "
             f"dispatched in one arm only (or cancelled at the window's end in the other, which aiperf exports "
             f"no record of): {k['only_a']} ({c.a_label}) / {k['only_b']} ({c.b_label}); "
             f"not completed with a decode time (an error, a cancellation at the window's end, or no TPOT) in "
             f"{c.a_label} only {k['failed_a']}, in {c.b_label} only {k['failed_b']}, in both {k['failed_both']}.", ""]
    if c.matched.empty:
        return lines + ["No matched requests: the arms completed no request in common."]
    lines += [f"| metric | n | before ({c.a_label}, mean) | after ({c.b_label}, mean) | delta [95% CI] | "
              "median per-request delta | requests faster / slower | sign test p (sessions) | A/A noise floor |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in c.matched.itertuples():
        lines.append(f"| {r.metric} | {r.n} | {fmt(r.a)} | {fmt(r.b)} | {fmt_delta(r.delta_pct, r.lo, r.hi)} | "
                     f"{r.median_req_delta_pct:+.1f}% | {r.faster} / {r.slower} | {r.sign_p:.3g} | "
                     f"{fmt_floor(getattr(r, 'floor', None), c.aa_source is not None)} |")
    return lines


# What each engine metric counts (sglang's names; the emulator exports the same): a gauge is averaged over the
# scrapes, a counter given as its rate per second. Another engine's metrics (vLLM's, say) show their own HELP text.
SERVER_UNITS = {
    "sglang:cache_hit_rate": "fraction of prompt tokens served from the prefix cache",
    "sglang:cached_tokens": "prompt tokens served from the prefix cache, per s",
    "sglang:gen_throughput": "tok/s over the engine's last ~5 s, averaged over scrapes",
    "sglang:generation_tokens": "output tokens per s",
    "sglang:prompt_tokens": "prompt tokens per s",
    "sglang:num_cycles": "scheduler steps per s",
    "sglang:num_requests": "requests received per s",
    "sglang:num_finished_requests": "requests finished per s",
    "sglang:num_queue_reqs": "requests waiting",
    "sglang:num_running_reqs": "requests running",
    "sglang:num_used_tokens": "KV-cache tokens in use",
    "sglang:spec_accept_length": "tokens accepted per speculative step (last ~5 s)",
}


def _server_unit(name: str, kind: str, description: str) -> str:
    if name in SERVER_UNITS:
        return SERVER_UNITS[name]
    if not description:
        return "?"
    return f"{description}, per s (engine's help)" if kind.startswith("counter") else f"{description} (engine's help)"


def server_md(c: Comparison) -> list[str]:
    """Server-side figures from aiperf's server-metrics export (first run of each side), when present."""
    sa = next((r.server for r in c.a_runs if r.server is not None and not r.server.empty), None)
    sb = next((r.server for r in c.b_runs if r.server is not None and not r.server.empty), None)
    if sa is None and sb is None:
        return ["No aiperf server-metrics export in this run."]
    import pandas as pd

    empty = pd.DataFrame(columns=["name", "kind", "value", "description"])

    def side(frame):  # runs analysed before the description was read have none
        return (empty if frame is None else frame).reindex(columns=empty.columns, fill_value="")

    m = side(sa).merge(side(sb), on=["name", "kind"], how="outer", suffixes=("_a", "_b"))
    m["description"] = [a if isinstance(a, str) and a else (b if isinstance(b, str) else "")
                        for a, b in zip(m["description_a"], m["description_b"])]
    lines = [f"| server metric | kind | unit | {c.a_label} | {c.b_label} |", "|---|---|---|---|---|"]
    idle = []  # zero or absent in both arms (an engine exports gauges of features this run never used)
    for r in m.sort_values("name").itertuples():
        if all(pd.isna(v) or v == 0 for v in (r.value_a, r.value_b)):
            idle.append(r.name)
            continue
        lines.append(f"| {r.name} | {r.kind} | {_server_unit(r.name, r.kind, r.description)} | {fmt(r.value_a)} | "
                     f"{fmt(r.value_b)} |")
    lines += ["", "From aiperf's scrapes of the server's /metrics: averages and rates over aiperf's profiling phase "
                  "(gauge: mean of its values; counter: increase per second)."]
    if idle:
        lines += ["", f"Zero or absent in both arms, left out of the table: {', '.join(idle)}."]
    return lines


def _series_name(label: str, r) -> str:
    """"off.2" in a one-run report; "runA:on (on.2)" when comparing runs."""
    if label == r.arm:
        return r.name
    return label if r.name == r.arm else f"{label} ({r.name})"


def make_plots(c: Comparison, plots_dir: Path, prefix: str = "") -> dict[str, Path]:
    a_ok = {r.name: r.records[r.records["ok"]] for r in c.a_runs}
    b_ok = {r.name: r.records[r.records["ok"]] for r in c.b_runs}
    tpot = {c.a_label: np.concatenate([f["tpot_ms"].to_numpy() for f in a_ok.values()]),
            c.b_label: np.concatenate([f["tpot_ms"].to_numpy() for f in b_ok.values()])}
    sides = [(label, [_series_name(label, r) for r in runs]) for label, runs in ((c.a_label, c.a_runs),
                                                                                 (c.b_label, c.b_runs))]
    styles = plots.comparison_styles(sides)  # an arm's colour follows it from plot to plot
    e = c.primary
    over_time = {_series_name(label, r): r.records[r.records["ok"]]
                 for label, runs in ((c.a_label, c.a_runs), (c.b_label, c.b_runs)) for r in runs}
    return {
        "TPOT CDF per arm": plots.tpot_cdf(tpot, plots_dir / f"{prefix}tpot_cdf.png", styles),
        "Matched per-request TPOT delta": plots.delta_histogram(
            c.request_deltas.to_numpy(), plots_dir / f"{prefix}matched_tpot_delta.png", f"{c.b_label} vs {c.a_label}",
            verdict=(e.pct, e.lo, e.hi) if e is not None and e.n and np.isfinite(e.lo) else None,
            verdict_name=f"{verdict_md.LABELS[e.name]} (verdict)" if e is not None else "verdict"),
        "TPOT over time per arm": plots.tpot_over_time(over_time, plots_dir / f"{prefix}tpot_over_time.png", styles),
    }


def _rel(p: Path, base: Path) -> str:
    return Path(os.path.relpath(p, base)).as_posix()


def recipe_of(run: Run) -> dict:
    r = run.manifest.get("recipe")
    return r if isinstance(r, dict) else {}


def lossy_arm_notes(recipe: dict) -> list[str]:
    """A note per arm whose kernel switch asks for a lossy mode of vattn (vattn/switch.py: VATTN_QK=e4m3), so that
    a reader weighs the accuracy section as the point of the run, not a formality."""
    notes = []
    for name, arm in (recipe.get("arms") or {}).items():
        env = (arm or {}).get("env") or {}
        try:
            lossy = switch.enabled(env) and switch.qk_mode(env) == switch.LOSSY_QK
        except ValueError:  # a recipe that did not validate: the provenance's env diff shows it as it was
            continue
        if lossy:
            notes.append(f"arm `{name}` runs vattn's lossy fast mode ({switch.VATTN_QK}={switch.LOSSY_QK}: Q rounded "
                         "to e4m3 for Q.K^T, against Q split in two parts by default); whether it changes answers is "
                         "the Accuracy section's to say")
    return notes


def aiperf_window(run: Run) -> str:
    """"60 + 20 s": the recipe's benchmark duration and grace period, which aiperf's summary divides by."""
    load = recipe_of(run).get("load") or {}
    dur, grace = load.get("benchmark_duration_s"), load.get("grace_period_s")
    return f"{dur:g} + {grace:g} s" if isinstance(dur, (int, float)) and isinstance(grace, (int, float)) else ""


def timing_source(run: Run, other: Run | None, cycle_lines: Sequence[str]) -> list[str]:
    """One line under the verdict where an emulator made the timings: its numbers are modelled, not measured."""
    if "emulator" not in {(recipe_of(r).get("engine") or r.manifest.get("engine")) for r in (run, other) if r}:
        return []
    if cycle_lines[:1] == [f"## {cycles.KERNEL_TITLE}"]:  # the real kernel ran on the batches: attention measured
        return ["Timings are the emulator's: attention measured by running the kernel on a GPU, the rest of each "
                "step from its cost model; not an end-to-end hardware measurement."]
    hw = ((recipe_of(run).get("server") or {}).get("args") or {}).get("hardware")
    profile = f" (hardware profile `{hw}`, fitted to kernel runs on that GPU)" if hw else ""
    return [f"Timings are the emulator's: its cost model{profile}, not a hardware measurement."]


def compose(c: Comparison, title: str, run: Run, other: Run | None, figures: dict[str, Path],
            cycle_lines: list[str], out_dir: Path, placement_lines: Sequence[str] = ()) -> str:
    engine = (run.manifest.get("recipe") or {}).get("engine") or run.manifest.get("engine")
    a_paths, b_paths = c.a_runs[0].paths, c.b_runs[0].paths
    notes = run.notes + (other.notes if other else []) + c.notes + lossy_arm_notes(recipe_of(run))
    notes += lossy_arm_notes(recipe_of(other)) if other else []
    differ = run_differences(run.manifest, other.manifest) if other else []
    if differ:  # a change of load or engine moves every figure: it is not the kernel's effect
        notes.append(f"the two runs differ in more than the compared arms ({c.a_label} / {c.b_label}): "
                     + "; ".join(differ))
    timing = timing_source(run, other, cycle_lines)  # its own paragraph: markdown would join it to the verdict's
    parts = [f"# {title}", "", verdict(c), *([""] + timing if timing else []), ""]
    if notes:
        parts += ["Notes:", *[f"- {n}" for n in notes], ""]
    parts += ["## Load", "", *load_md(c), "", "## Per-arm metrics", "", *arm_table_md(c, aiperf_window(run)), "", definitions(c), "",
              "## Matched requests", "", *matched_md(c), "", *verdict_md.primary_md(c), "",
              "## What this run could have seen", "",
              *verdict_md.sensitivity_md(c, recipe_of(run).get("target_effect")), ""]
    if placement_lines:  # concurrent placement with a swap: kernel effect apart from the GPU effect
        parts += ["## Placement: concurrent with swap", "", *placement_lines, ""]
    parts += engine_paths.section_md(run)  # sglang runs only: vattn / base forwards per arm run
    parts += acceptance.section_md(c, engine)  # runs whose engine logs acceptance per request
    parts += ["## Server-side metrics", "", *server_md(c), "", "## Plots", ""]
    parts += [f"![{name}]({_rel(p, out_dir)})" for name, p in figures.items()] + [""]
    if cycle_lines:  # its own heading: what ran says what the section is
        parts += [*cycle_lines, ""]
    repeats = [(runs[0].paths, runs[1].paths, runs[0].name, runs[1].name)
               for runs in (c.a_runs, c.b_runs) if len(runs) >= 2]
    parts += ["## Accuracy", "", *accuracy.accuracy_md(a_paths, b_paths, c.a_label, c.b_label, engine, repeats,
                                                       dummy=accuracy.dummy_weights(recipe_of(run))), ""]
    parts += ["## Provenance", ""]
    if other is not None:
        parts += [f"### {c.a_label}: {run.root}", "", *provenance_md(run.manifest, run.root), "",
                  f"### {c.b_label}: {other.root}", "", *provenance_md(other.manifest, other.root)]
    else:
        parts += provenance_md(run.manifest, run.root)
    return "\n".join(parts) + "\n"


def write_report(run_dir: Path, out: Path | None = None, *, compare: Path | None = None,
                 arms: tuple[str, str] | None = None, n_boot: int = stats.N_BOOT) -> Path:
    """Analyse RUN_DIR (or RUN_DIR against `compare`) and write the markdown report; returns its path.

    One run: arms default to ("off", "on"). Two runs: RUN_DIR's arms[0] (default "on") is the
    baseline, `compare`'s arms[1] (default "on") the candidate. Raises ReportError (one line) on
    bad input.
    """
    run = load_run(Path(run_dir))
    other = load_run(Path(compare)) if compare is not None else None
    a_arm, b_arm = arms or (("on", "on") if other else ("off", "on"))
    if other is None and a_arm == b_arm:  # refused before anything is written: the run's report stays as it was
        raise ReportError(f"--arms: names '{a_arm}' twice for the one run dir {run.root}: nothing to compare; name "
                          f"two different arms of it (arms with exports: {', '.join(run.arms) or 'none'}), e.g. "
                          f"--arms off on, or give a second run dir to compare '{a_arm}' across runs")
    a_runs = run.runs_of(a_arm)
    b_runs = (other or run).runs_of(b_arm)
    for arm, runs, src in ((a_arm, a_runs, run), (b_arm, b_runs, other or run)):
        if not runs:
            raise ReportError(f"run dir {src.root}: no arm '{arm}' (arms with exports: "
                              f"{', '.join(src.arms) or 'none'}); pick one with --arms")
    if other is not None:
        if run.root.resolve() == other.root.resolve() and a_arm == b_arm:
            raise ReportError(f"{run.root} and {other.root} are one run and --arms names '{a_arm}' twice: nothing to "
                              "compare; name two arms (--arms off on) or give two run dirs")
        a_label, b_label = f"{run.root.name}:{a_arm}", f"{other.root.name}:{b_arm}"
        # An --out report's plots go beside it: a comparison leaves both input runs as they were.
        out = Path(out) if out else RunPaths(other.root).compare_report(run.root.name)
        plots_dir = out.parent / "plots"
        prefix, title = f"compare_{run.root.name}_", f"A/B report: {b_label} vs {a_label}"  # as the verdict
    else:
        a_label, b_label = a_arm, b_arm
        title = f"A/B report: {run.root.name} ({b_arm} vs {a_arm})"
        if out:  # beside the report, named for the run: a read-only run dir can be reported elsewhere
            out, plots_dir, prefix = Path(out), Path(out).parent / "plots", f"{run.root.name}_"
        else:
            out, plots_dir, prefix = RunPaths(run.root).report, RunPaths(run.root).plots_dir, ""
    duration = (recipe_of(other or run).get("load") or {}).get("benchmark_duration_s")
    c = run_compare(a_runs, b_runs, a_label, b_label, n_boot=n_boot, duration_s=duration)
    figures = make_plots(c, plots_dir, prefix)
    cycle_lines = cycles.cycles_md(c, plots_dir, prefix, out.parent)
    placement_lines = placement.placement_md(run, n_boot=n_boot) if other is None else []
    write_text_atomic(out, compose(c, title, run, other, figures, cycle_lines, out.parent, placement_lines))
    return out


def cli_report(run_dirs: Sequence[str | Path], out: str | Path | None = None,
               arms: Sequence[str] | str | None = None) -> int:
    """`pipeline report RUN_DIR [B_DIR] [--out FILE] [--arms A B]`: write the report, print its path,
    return the exit code; bad input prints one `error: ...` line on stderr and returns 2."""
    if len(run_dirs) not in (1, 2):
        print(f"error: pipeline report takes RUN_DIR or A_DIR B_DIR, got {len(run_dirs)} paths", file=sys.stderr)
        return 2
    pair = None
    if arms:
        parts = arms.split(",") if isinstance(arms, str) else list(arms)
        if len(parts) != 2 or not all(parts):
            print(f"error: --arms: expected two arm names like 'off on', got {arms!r}", file=sys.stderr)
            return 2
        pair = (str(parts[0]), str(parts[1]))
    if out and Path(out).is_dir():
        print(f"error: --out: {out!r} is a directory; give the report's file path (e.g. {Path(out) / 'report.md'})",
              file=sys.stderr)
        return 2
    try:
        path = write_report(Path(run_dirs[0]), Path(out) if out else None,
                            compare=Path(run_dirs[1]) if len(run_dirs) == 2 else None, arms=pair)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0
