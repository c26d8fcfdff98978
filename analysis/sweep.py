"""A sweep's analysis: one row per (point, arm) from each point's run dir, with CIs, then the sweep report.

Per point it reuses the single-run analysis (analysis.compare: the same deltas and session-bootstrap CIs
as report.md). For the Pareto plot each arm's own interactivity and throughput get a CI too: the same
session-clustered bootstrap (analysis.stats), applied to one arm instead of a pair.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from analysis import stats, window
from analysis.load import AnalysisError, root_sessions
from analysis.compare import compare, pool
from analysis.formatting import fmt, fmt_delta
from analysis.rundir import load_run

if TYPE_CHECKING:
    import pandas as pd

DELTA_KEYS = ("tpot_p50", "tpot_p90", "inter_p50", "inter_p90", "ttft_p50", "throughput_equal_window")
# What the CSV's off_ / on_ / d_ columns of a per-request row count, in their names: report.md's per-arm table takes
# those rows over matched requests (analysis.compare.arm_rows); they were named `d_tpot_p50` etc. when they counted
# each arm's own requests, and a column that changed meaning under its old name would mislead a reader's old script.
MATCHED_SUFFIX = "_matched"
ALL_SUFFIX = "_all"


def arm_ci(values: np.ndarray, sessions: np.ndarray, stat: stats.Stat, n_boot: int = stats.N_BOOT,
           seed: int = stats.SEED) -> tuple[float, float, float]:
    """(estimate, lo, hi) of one arm's statistic; 95% CI from resampling whole sessions."""
    uniq, idx = np.unique(np.asarray(sessions).astype(str), return_inverse=True)
    s = stats.make_sample(values, idx, list(range(len(uniq))), stat)
    est = float(s.stat(s.values, np.ones((1, len(s.values))))[0])
    if len(uniq) < stats.MIN_SESSIONS:
        return est, float("nan"), float("nan")
    reps = s.stat(s.values, stats.session_draws(len(uniq), n_boot, seed)[:, s.sessions])
    reps = reps[np.isfinite(reps)]
    lo, hi = np.percentile(reps, [2.5, 97.5]) if len(reps) else (np.nan, np.nan)
    return est, float(lo), float(hi)


def _arm_figures(runs, gpus: int, window_s: float) -> dict:
    """Interactivity at TPOT p50 / p90, and output tokens a second a GPU over the point's equal window
    (analysis.window): a point whose last requests spill into the grace period, where few requests are left in
    flight, must not get a lower throughput for it; each with its session-bootstrap CI."""
    ok = pool(runs).ok
    tpot, sess = ok["tpot_ms"].to_numpy(float), root_sessions(ok["conversation_id"])
    keep = np.isfinite(tpot)
    out = {}
    for key, q in (("inter_p50", 50), ("inter_p90", 90)):
        out[key], out[f"{key}_lo"], out[f"{key}_hi"] = arm_ci(tpot[keep], sess[keep],
                                                              stats.inverse_quantile_stat(q))
    tokens = [window.tokens_in_window(r.records, window.window_start_ns(r.records, r.phase_window_ns), window_s)
              for r in runs]
    t_sess = np.concatenate([root_sessions(r.records.loc[t.index, "conversation_id"]) for r, t in zip(runs, tokens)])
    t, lo, hi = arm_ci(np.concatenate([t.to_numpy(float) for t in tokens]), t_sess,
                       stats.rate_stat(window_s * len(runs) * gpus))
    out.update(tput_per_gpu=t, tput_per_gpu_lo=lo, tput_per_gpu_hi=hi, requests=int(len(ok)))
    return out


def point_rows(point: str, run_dir: Path, gpus: int, labels: dict[str, str], shown_as: str) -> list[dict]:
    """Two rows (off, on) for one point: arm figures with CIs, and the on-vs-off deltas with CIs. shown_as: the
    run dir as the CSV names it."""
    run = load_run(run_dir)
    by_arm = {arm: [r for r in run.arm_runs if r.arm == arm] for arm in ("off", "on")}
    duration = ((run.manifest.get("recipe") or {}).get("load") or {}).get("benchmark_duration_s")
    c = compare(by_arm["off"], by_arm["on"], "off", "on", duration_s=duration)
    deltas = delta_columns(c.arm_table)
    e = c.primary  # the run's verdict: the same statistic, so the sweep never disagrees with a point's report
    if e is not None and e.n:
        deltas.update(d_matched_tpot=e.pct, d_matched_tpot_lo=e.lo, d_matched_tpot_hi=e.hi, matched_n=e.n)
    w = window.equal_window([r.window_s for r in by_arm["off"] + by_arm["on"]], duration)
    base = {"point": point, **labels, "gpus": gpus, "run_dir": shown_as}
    return [{**base, "arm": arm, **_arm_figures(by_arm[arm], gpus, w), **deltas} for arm in ("off", "on")]


def delta_columns(arm_table: "pd.DataFrame") -> dict:
    """The CSV's columns of the per-arm table's DELTA_KEYS rows: `d_<key>`, `_lo`, `_hi` (delta % of on over off,
    95% CI) and `off_<key>` / `on_<key>` (each arm's value). A row over matched requests names its columns
    `<key>_matched` and adds each arm's value over its own requests as `off_<key>_all` / `on_<key>_all`; a rate row
    (over each arm's own requests) keeps its plain name."""
    out = {}
    for _, r in arm_table.iterrows():
        if r["key"] not in DELTA_KEYS:
            continue
        name = r["key"] + (MATCHED_SUFFIX if r["basis"] == "matched" else "")
        out.update({f"d_{name}": r["delta_pct"], f"d_{name}_lo": r["lo"], f"d_{name}_hi": r["hi"],
                    f"off_{name}": r["a"], f"on_{name}": r["b"]})
        if r["basis"] == "matched":
            out.update({f"off_{r['key']}{ALL_SUFFIX}": r["a_all"], f"on_{r['key']}{ALL_SUFFIX}": r["b_all"]})
    return out


def summary_frame(points: list[dict], sweep_dir: Path | None = None) -> tuple["pd.DataFrame", dict[str, str]]:
    """points: [{point, run_dir, gpus, labels}] of finished runs -> (one row per (point, arm), {point: why it could
    not be analysed}). A point that cannot be analysed (an export gone, no profiling record) is left out rather
    than sinking the others. run_dir in the rows and the reasons: relative to sweep_dir where given, so the CSV
    reads the same from any working directory."""
    import pandas as pd

    rows, failed = [], {}
    for p in points:
        run_dir = Path(p["run_dir"])
        shown_as = os.path.relpath(run_dir, sweep_dir) if sweep_dir is not None else str(run_dir)
        try:
            rows += point_rows(p["point"], run_dir, p["gpus"], p.get("labels", {}), shown_as)
        except AnalysisError as e:  # its message names the run dir; the reader of a sweep knows it by shown_as
            failed[p["point"]] = str(e).replace(str(run_dir), shown_as)
        except Exception as e:  # anything else one point's files provoke must not cost the other points either
            failed[p["point"]] = f"{type(e).__name__}: {e}"
    return pd.DataFrame(rows), failed


def pareto_lines(df: "pd.DataFrame", axes: list[str] = (),
                 along: str | None = None) -> list[tuple[str, str, "pd.DataFrame"]]:
    """[(arm, series, rows)]: the plot's lines. A line joins the points of one arm that differ only in `along` (the
    matrix axis that sets concurrency), in sweep order; series names the values of the other axes ("" if none),
    so that a 2 x 2 matrix draws two lines per arm, not one zigzag across TP2 and TP4."""
    others = [a for a in axes if a != along and a in df.columns]
    groups = list(df.groupby(others, sort=False)) if others else [((), df)]
    lines = []
    for arm in ("off", "on"):
        for key, g in groups:
            key = key if isinstance(key, tuple) else (key,)
            lines.append((arm, ", ".join(map(str, key)), g[g["arm"] == arm]))
    return lines


def pareto_plot(df: "pd.DataFrame", path: Path, axes: list[str] = (), along: str | None = None) -> Path:
    """Left: interactivity (at TPOT p50, solid, filled markers; p90, dashed, hollow) against output throughput per
    GPU, one line per arm (colour) and values of the matrix's other axes (marker), each point with 95% CI bars on
    both axes and labelled with its `along` value (its point name without a matrix). Right: the paired on-vs-off
    deltas per point (the verdict's matched TPOT delta and the equal-window throughput delta) with their CIs: each
    arm's own CI spans the sessions' spread, which a paired comparison removes, so the left panel alone makes
    arms that differ reliably look alike."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from analysis.plots import _save, arm_style

    fig, (ax, dax) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=100, gridspec_kw={"width_ratios": [3, 2]})
    ax.set(title="Each arm: interactivity vs output throughput per GPU", xlabel="output throughput per GPU (tok/s)",
           ylabel="interactivity (tok/s/user)")
    lines = pareto_lines(df, axes, along)
    series = list(dict.fromkeys(s for _, s, _ in lines))
    markers = "os^Dv<>PX*"
    for arm, s, a in lines:
        # off and on in the colours every report plot gives its baseline and candidate (plots.arm_style)
        color, marker = arm_style(("off", "on").index(arm))["color"], markers[series.index(s) % len(markers)]
        x = a["tput_per_gpu"].to_numpy(float)
        xerr = _err(x, a["tput_per_gpu_lo"], a["tput_per_gpu_hi"])
        for key, style, face in (("inter_p50", "-", color), ("inter_p90", "--", "none")):
            y = a[key].to_numpy(float)
            ax.errorbar(x, y, xerr=xerr, yerr=_err(y, a[f"{key}_lo"], a[f"{key}_hi"]), ls=style, marker=marker,
                        mfc=face, capsize=3, color=color, alpha=0.85)
            for _, r in a.iterrows():  # off's labels up-left of its markers, on's down-right: the arms sit close
                ax.annotate(_point_label(r, along), (r["tput_per_gpu"], r[key]), textcoords="offset points",
                            xytext=(-8, 8) if arm == "off" else (8, -12), ha="right" if arm == "off" else "left",
                            fontsize=8, color=color, bbox=LABEL_BOX)
    handles = [Line2D([], [], color=arm_style(i)["color"], label=arm) for i, arm in enumerate(("off", "on"))]
    handles += [Line2D([], [], color="gray", ls="-", marker="o", label="at TPOT p50"),
                Line2D([], [], color="gray", ls="--", marker="o", mfc="none", label="at TPOT p90")]
    if len(series) > 1:
        handles += [Line2D([], [], color="gray", ls="none", marker=markers[i % len(markers)], label=s)
                    for i, s in enumerate(series)]
    ax.legend(handles=handles, fontsize=9)
    _paired_panel(dax, df, along)
    for a_ in (ax, dax):
        a_.grid(alpha=0.3)
    return _save(fig, path)


LABEL_BOX = {"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8}  # legible over CI bars
# The paired panel's series: (CSV column, legend label, colour, marker), colours neither arm's.
PAIRED = (("d_matched_tpot", "matched TPOT, the verdict (< 0 better)", "#444444", "o"),
          ("d_throughput_equal_window", "throughput, equal window (> 0 better)", "#55a868", "s"))


def _point_label(r, along: str | None) -> str:
    return str(r[along]) if along and along in r else str(r["point"])


def _paired_panel(ax, df: "pd.DataFrame", along: str | None) -> None:
    """On-vs-off delta % per point in sweep order, 95% CI bars (session bootstrap, paired where matched)."""
    on = df[df["arm"] == "on"].drop_duplicates("point")
    x = np.arange(len(on), dtype=float)
    for i, (key, label, color, marker) in enumerate(PAIRED):
        if key not in on:
            continue
        y = on[key].to_numpy(float)
        ax.errorbar(x + (i - 0.5) * 0.15, y, yerr=_err(y, on[f"{key}_lo"], on[f"{key}_hi"]), ls="none",
                    marker=marker, capsize=4, color=color, label=label)
    ax.axhline(0, color="black", lw=1)
    ax.set_xticks(x, [_point_label(r, along) for _, r in on.iterrows()])
    ax.set_xlim(-0.6, len(on) - 0.4)
    ax.set(title="Paired: on vs off per point (95% CI)", xlabel=along or "point",
           ylabel="delta = (on - off) / off (%)")
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1)  # below: CIs reach any height


def _err(center: np.ndarray, lo, hi) -> np.ndarray:
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    lo, hi = np.where(np.isfinite(lo), lo, center), np.where(np.isfinite(hi), hi, center)
    return np.vstack([np.clip(center - lo, 0, None), np.clip(hi - center, 0, None)])


def _delta(r, key: str) -> str:
    v = r.get(f"d_{key}")
    if v is None:
        return "n/a"
    return fmt_delta(v, r.get(f"d_{key}_lo", np.nan), r.get(f"d_{key}_hi", np.nan))


def _pair(off, on, key: str) -> str:
    return f"{fmt(off[key])} / {fmt(on[key])}"


def _matched(on, key: str) -> str:
    """off / on over matched requests (delta [CI]): a value and its delta count the same requests."""
    m = key + MATCHED_SUFFIX
    return f"{fmt(on.get(f'off_{m}'))} / {fmt(on.get(f'on_{m}'))} ({_delta(on, m)})"


def four_point_md(df: "pd.DataFrame") -> list[str]:
    """The MI355X reference's table shape: one row per point, off / on and the delta with its CI. Latency columns
    count matched requests, as report.md's per-arm table does; throughput each arm's own, over the equal window."""
    lines = ["| point | matched TPOT delta, the verdict (< 0 better) | TPOT p50 (ms) off / on, matched (delta) "
             "| interactivity p50 (tok/s/user) off / on, matched (delta) "
             "| interactivity p90 (tok/s/user) off / on, matched (delta) "
             "| output tok/s/GPU off / on, all requests (delta) |",
             "|---|---|---|---|---|---|"]
    for point, g in df.groupby("point", sort=False):
        off, on = g[g["arm"] == "off"].iloc[0], g[g["arm"] == "on"].iloc[0]
        lines.append(f"| {point} | {_delta(on, 'matched_tpot')} | {_matched(on, 'tpot_p50')} "
                     f"| {_matched(on, 'inter_p50')} | {_matched(on, 'inter_p90')} "
                     f"| {_pair(off, on, 'tput_per_gpu')} ({_delta(on, 'throughput_equal_window')}) |")
    return lines


# deltas_md's column headers: the quantity with its unit, and which sign of its delta is better.
DELTA_HEADERS = {
    "tpot_p50": ("TPOT p50 (ms)", "< 0"), "tpot_p90": ("TPOT p90 (ms)", "< 0"),
    "inter_p50": ("interactivity p50 (tok/s/user)", "> 0"), "inter_p90": ("interactivity p90 (tok/s/user)", "> 0"),
    "ttft_p50": ("TTFT p50 (ms)", "< 0"), "throughput_equal_window": ("output throughput, equal window (tok/s)", "> 0")}
DELTA_NOTE = ("Delta = (on - off) / off, in %, with its 95% CI in brackets. Better is negative for times (TPOT, "
              "TTFT) and positive for rates (interactivity, throughput); a CI that spans 0 shows no difference "
              "this sweep could resolve.")


def deltas_md(df: "pd.DataFrame") -> list[str]:
    keys = [k for k in DELTA_KEYS if k != "throughput_equal_window"] + ["throughput_equal_window"]
    cols = [k + MATCHED_SUFFIX if k != "throughput_equal_window" else k for k in keys]
    heads = [f"{DELTA_HEADERS[k][0]}, {'matched' if c.endswith(MATCHED_SUFFIX) else 'all requests'}; "
             f"{DELTA_HEADERS[k][1]} better" for k, c in zip(keys, cols)]
    lines = ["| point | " + " | ".join(heads) + " |", "|---" * (len(cols) + 1) + "|"]
    for point, g in df.groupby("point", sort=False):
        on = g[g["arm"] == "on"].iloc[0]
        lines.append(f"| {point} | " + " | ".join(_delta(on, k) for k in cols) + " |")
    return lines


def provenance_md(run_dirs: dict[str, Path]) -> list[str]:
    """What every point ran and under which load, from the points' manifests: one line per item where all points
    agree, `point: value` pairs where they differ. [] where no point has a manifest."""
    from analysis.rundir import read_manifest

    items: dict[str, dict[str, str]] = {}
    for point, d in run_dirs.items():
        try:
            m = read_manifest(Path(d))
        except (AnalysisError, OSError, ValueError):
            continue
        r = m.get("recipe") if isinstance(m.get("recipe"), dict) else {}
        load, place = r.get("load") or {}, r.get("placement") or {}
        env = ", ".join(f"{k} {a if a is not None else 'unset'} -> {b if b is not None else 'unset'}"
                        for k, (a, b) in (m.get("env_diff") or {}).items())
        for item, value in (
                ("commit", (m.get("git_sha") or "not recorded")[:12]),
                ("engine / model", f"{r.get('engine')} / {r.get('model')}"),
                ("trace", f"`{load.get('trace')}`"),
                ("concurrency", load.get("concurrency")),
                ("window", f"{load.get('benchmark_duration_s')} s measured after {load.get('warmup_requests')} "
                           f"warm-up requests, {load.get('grace_period_s')} s grace"),
                ("arm order", f"{place.get('mode')}, {place.get('order')}"),
                ("off -> on", env or "not recorded")):
            items.setdefault(item, {})[point] = str(value)
    lines = []
    for item, by_point in items.items():
        values = set(by_point.values())
        text = values.pop() if len(values) == 1 else "; ".join(f"{p}: {v}" for p, v in by_point.items())
        lines.append(f"- {item}: {text}")
    return lines


# Under the tables: what their columns and the CSV's count (the CSV's latency columns were renamed when they
# moved to matched requests; this says so where a reader of the sweep looks).
COLUMNS_NOTE = (
    "Latency columns (TPOT, interactivity, TTFT; `matched` in the tables, `*_matched` in sweep_summary.csv's "
    "`off_*` / `on_*` / `d_*` columns) count matched requests, the same request completed in both arms, paired by "
    "request and resampled by session, as each run's report.md per-arm table: the faster arm also sends requests "
    "the other never reached (late turns, often prefix-cache hits), which would move its own percentiles. "
    "`off_<key>_all` / `on_<key>_all` give each arm's value over its own completed requests, with no CI (an older "
    "sweep_summary.csv has `d_tpot_p50`, `off_tpot_p50` and the like instead: those counted each arm's own "
    "requests). "
    "Throughput (`throughput_equal_window`, `tput_per_gpu`) counts each arm's own requests, as do the per-arm "
    "`inter_p50` / `inter_p90` columns and the Pareto plot: each arm's own operating point.")


def md_cell(text: str, limit: int) -> str:
    """The first line of `text` as one markdown table cell of at most about `limit` characters: no '|', and no
    backtick left open where the cut fell inside a code span (it would swallow the rest of the row)."""
    line = (text.splitlines() or [""])[0].replace("|", "/")
    if len(line) > limit:
        line = line[:limit].rstrip() + "..."
    if line.count("`") % 2:
        i = line.rindex("`")
        line = line[:i] + line[i + 1:]
    return line


def sweep_report_md(name: str, df: "pd.DataFrame", status: dict[str, str], report_dir: Path,
                    png: Path | None, run_dirs: dict[str, Path] | None = None,
                    gpus: dict[str, tuple[int, str]] | None = None) -> str:
    """run_dirs: {point: run dir} of the points that have one, finished or not. gpus: {point: (GPUs per server,
    what sets that count)}, which tok/s/GPU divides by."""
    run_dirs, gpus = run_dirs or {}, gpus or {}
    parts = [f"# Sweep {name}: kernel off vs on across {len(status)} points", "",
             "| point | status | GPUs per server | run dir |", "|---|---|---|---|"]
    for point, st in status.items():
        rel = os.path.relpath(run_dirs[point], report_dir) if point in run_dirs else ""
        n = f"{gpus[point][0]} ({md_cell(gpus[point][1], 80)})" if point in gpus else ""
        parts.append(f"| {point} | {st} | {n} | {rel} |")
    if df.empty:
        none = ("No finished point could be analysed (the status table says why): nothing to compare."
                if any(st.startswith("analysis failed") for st in status.values())
                else "No point has finished yet: nothing to compare.")
        return "\n".join(parts + ["", none]) + "\n"
    n = df["point"].nunique()
    prov = provenance_md({p: d for p, d in run_dirs.items() if p in set(df["point"])})
    if prov:
        parts += ["", "## What ran (from each point's manifest.json)", "", *prov]
    parts += ["", f"## Per-point table: {n} point{'s' * (n != 1)} (the layout of the MI355X reference's four-point "
              "table)", "", DELTA_NOTE, "", *four_point_md(df), "",
              "## Deltas on vs off per point (95% CI, session bootstrap; as in each run's report.md)", "",
              *deltas_md(df), "", COLUMNS_NOTE, ""]
    if png is not None:
        parts += ["## Interactivity vs output throughput per GPU", "",
                  f"![pareto]({os.path.relpath(png, report_dir)})", "",
                  "Left: each marker is one point and arm; bars are 95% CIs from resampling whole sessions, "
                  "each arm on its own: they include the spread between sessions, which the paired deltas (right, "
                  "and the tables) cancel, so overlapping bars on the left do not mean the arms are alike. "
                  "Interactivity = 1000 / TPOT[ms] at the TPOT p50 (solid) and p90 (dashed) of the arm's own "
                  "completed requests. Throughput per "
                  "GPU = output tokens emitted in the point's equal window (the recipe's duration from the "
                  "profiling start, as report.md's equal-window row) / that window / the point's GPUs per server (the "
                  "status table names each count and what sets it). The matched "
                  "TPOT delta is each run's verdict: its report's primary estimate and CI.", ""]
    return "\n".join(parts)
