"""Calibration of the verdict on recorded runs: false alarms on A/A comparisons, power and CI width on A/B.

    python -m analysis.calibrate RUN_DIR [RUN_DIR ...] [--splits 20] [--n-boot 1000]

A/A comparisons come from two sources:
- real: the same arm in two launches. Runs of one recipe replay the same trace with the same seed, so
  run i's `off` matches run j's `off` request for request (and `off` vs `off.2` inside an ABBA run);
- resampled splits of one A/B run: the matched log-ratios are centred on their median and each session's
  sign is flipped at random. Swapping the arm labels of a pair is what an A/A comparison cannot tell
  apart, so this keeps the run's noise (outliers, session clustering) and removes its effect.
A false alarm is a 95% CI that excludes 0. Power is the share of A/B runs whose CI excludes 0.
"""
from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from analysis import estimate as est
from analysis import stats
from analysis.compare import matched_pairs

if TYPE_CHECKING:
    import pandas as pd

    from analysis.rundir import ArmRun, Run


def sign_flip_split(lr: "pd.DataFrame", seed: int) -> "pd.DataFrame":
    """One resampled A/A split of an A/B log_ratios frame: centred on its median, each session's
    sign drawn at random."""
    rng = np.random.default_rng(seed)
    sessions = lr["session"].astype(str)
    uniq = sorted(set(sessions))
    sign = dict(zip(uniq, rng.choice([-1.0, 1.0], size=len(uniq))))
    return lr.assign(r=(lr["r"] - lr["r"].median()) * sessions.map(sign).to_numpy())


def ab_frame(run: "Run", a: str = "off", b: str = "on") -> "pd.DataFrame":
    return est.log_ratios(matched_pairs(run.runs_of(a), run.runs_of(b)))


def aa_frames(runs: Sequence["Run"]) -> list[tuple[str, "pd.DataFrame"]]:
    """Real A/A log_ratios frames: every arm's repeat inside a run, and each arm across pairs of runs."""
    out = []
    for run in runs:
        for arm in run.arms:
            reps = run.runs_of(arm)
            if len(reps) >= 2:
                out.append((f"{run.root.name}:{reps[0].name} vs {reps[1].name}",
                            est.log_ratios(matched_pairs([reps[0]], [reps[1]]))))
    for r1, r2 in itertools.combinations(runs, 2):
        for arm in sorted(set(r1.arms) & set(r2.arms)):
            x: ArmRun = r1.runs_of(arm)[0]
            y: ArmRun = r2.runs_of(arm)[0]
            out.append((f"{r1.root.name}:{arm} vs {r2.root.name}:{arm}", est.log_ratios(matched_pairs([x], [y]))))
    return out


def false_alarms(frames: Sequence["pd.DataFrame"], n_boot: int, seed: int = stats.SEED) -> "pd.DataFrame":
    """estimator | comparisons | false_alarms | rate | median_width over A/A log_ratios frames."""
    import pandas as pd

    rows = []
    for name in est.ESTIMATORS:
        es = [est.estimate(f, name, n_boot, seed) for f in frames]
        es = [e for e in es if np.isfinite(e.lo)]
        fa = sum(e.excludes_zero() for e in es)
        rows.append({"estimator": name, "comparisons": len(es), "false_alarms": fa,
                     "rate": fa / len(es) if es else np.nan,
                     "median_width": float(np.median([e.width for e in es])) if es else np.nan})
    return pd.DataFrame(rows)


def power(frames: Sequence["pd.DataFrame"], n_boot: int, seed: int = stats.SEED) -> "pd.DataFrame":
    """estimator | runs | detected | median_pct | median_width | median_mde | between_sd | median_se over A/B
    log_ratios frames. between_sd (the spread of the centre across runs, log units x 100) against median_se
    (one run's bootstrap standard error, same units) says whether one launch's CI covers launch noise."""
    import pandas as pd

    rows = []
    for name in est.ESTIMATORS:
        es = [est.estimate(f, name, n_boot, seed) for f in frames]
        rows.append({"estimator": name, "runs": len(es), "detected": sum(e.excludes_zero() for e in es),
                     "median_pct": float(np.median([e.pct for e in es])),
                     "median_width": float(np.median([e.width for e in es])),
                     "median_mde": float(np.median([e.mde_pct() for e in es])),
                     "between_sd": float(np.std([np.log1p(e.pct / 100) for e in es], ddof=1) * 100)
                     if len(es) > 1 else np.nan,
                     "median_se": float(np.median([e.se_log for e in es]) * 100)})
    return pd.DataFrame(rows)


def md_table(df: "pd.DataFrame") -> str:
    """A markdown table (pandas' to_markdown needs tabulate, which the project does not install)."""
    def cell(v):
        return f"{v:.2f}" if isinstance(v, (float, np.floating)) else str(v)
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def width_at_fixed_false_alarms(ab: Sequence["pd.DataFrame"], aa: Sequence["pd.DataFrame"], n_boot: int,
                                rate: float = 0.05, seed: int = stats.SEED) -> "pd.DataFrame":
    """Per estimator: the multiplier k of the bootstrap standard error at which exactly `rate` of the A/A
    comparisons would claim an effect (the (1 - rate) quantile of |centre| / se), and the median A/B CI
    width with that multiplier. This compares estimators at the same false-alarm rate, whatever their
    nominal calibration."""
    import pandas as pd

    rows = []
    for name in est.ESTIMATORS:
        null = [est.estimate(f, name, n_boot, seed) for f in aa]
        z = [abs(np.log1p(e.pct / 100)) / e.se_log for e in null if np.isfinite(e.se_log) and e.se_log > 0]
        k = float(np.quantile(z, 1 - rate)) if z else np.nan
        alt = [est.estimate(f, name, n_boot, seed) for f in ab]
        widths = [(np.exp(np.log1p(e.pct / 100) + k * e.se_log) - np.exp(np.log1p(e.pct / 100) - k * e.se_log)) * 100
                  for e in alt if np.isfinite(e.se_log)]
        detected = sum(abs(np.log1p(e.pct / 100)) > k * e.se_log for e in alt if np.isfinite(e.se_log))
        rows.append({"estimator": name, "k_at_5pct": k, "median_width": float(np.median(widths)) if widths else np.nan,
                     "detected": int(detected), "runs": len(alt)})
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> int:
    from analysis.rundir import load_run

    p = argparse.ArgumentParser(prog="python -m analysis.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", nargs="+", help="run directories of one recipe (same trace and seed)")
    p.add_argument("--splits", type=int, default=20, help="resampled A/A splits per A/B run")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap replicates per CI")
    args = p.parse_args(argv)
    runs = [load_run(Path(d)) for d in args.run_dirs]
    ab = [ab_frame(r) for r in runs]
    real = aa_frames(runs)
    split = [sign_flip_split(f, seed) for f in ab for seed in range(args.splits)]
    print(f"## A/B runs: {len(ab)} (matched pairs per run: {', '.join(str(len(f)) for f in ab)})\n")
    print(md_table(power(ab, args.n_boot)), "\n")
    print(f"## A/A, real repeats of an arm: {len(real)} comparisons\n")
    print(md_table(false_alarms([f for _, f in real], args.n_boot)), "\n")
    print(f"## A/A, resampled splits: {len(split)} ({args.splits} per A/B run)\n")
    print(md_table(false_alarms(split, args.n_boot)), "\n")
    print(f"## CI width at a fixed 5% false-alarm rate (all {len(real) + len(split)} A/A comparisons)\n")
    print(md_table(width_at_fixed_false_alarms(ab, [f for _, f in real] + split, args.n_boot)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
