"""Optional section from the emulator's cycle log (one line per cycle): "Kernel in the loop" where the real
kernel ran on the batches, else "Emulator cycle log" (every time in it the cost model's).

Each server lifetime writes its own log (emulator_cycles/lifetime-<n>.jsonl); analysis/rundir.py picks
the one whose lifetime ran the load stage, so a resumed arm's figures come from one server.

Fields used (pipeline/emulator/engine.py `_log_line`): `step_us` (modelled
step time), `attn_us` (cost-model attention time) and, when the real kernel
ran on the batch, `measured_attention_us`. Absent file or fields: no section.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from analysis import plots
from analysis.load import read_jsonl

if TYPE_CHECKING:
    import pandas as pd

    from analysis.compare import Comparison

KERNEL_TITLE = "Kernel in the loop"      # the real kernel ran on the batches (measured_attention_us)
MODEL_TITLE = "Emulator cycle log"       # no kernel ran: every time is the cost model's


def cycles_frame(lines: list[dict]) -> "pd.DataFrame":
    import pandas as pd

    df = pd.DataFrame(lines)
    for col in ("step_us", "attn_us", "measured_attention_us", "batch"):
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def cycle_summary(df: "pd.DataFrame") -> dict[str, float]:
    """Cycles, mean/p50/p90 step time, decode-only p50, and the attention share of step time."""
    import pandas as pd

    step = df["step_us"].dropna().to_numpy(float) if "step_us" in df else np.array([])
    out = {"cycles": float(len(df))}
    if len(step):
        out.update(step_mean=float(step.mean()), step_p50=float(np.percentile(step, 50)),
                   step_p90=float(np.percentile(step, 90)))
        # In kernel mode the step slept the measured attention; attn_us is then the cost model's prediction.
        attn = "measured_attention_us" if "measured_attention_us" in df else "attn_us"
        if "prefill_tokens" in df:
            # Decode-only cycles isolate what the attention kernel changes from prefill's long steps; attn_us is
            # decode attention alone, so over all cycles its share would be diluted by prefill's steps.
            dec = df[pd.to_numeric(df["prefill_tokens"], errors="coerce") == 0].dropna(subset=["step_us"])
            if len(dec):
                out["decode_step_p50"] = float(np.percentile(dec["step_us"].to_numpy(float), 50))
                if attn in dec and dec["step_us"].sum() > 0:
                    out["attn_share"] = float(dec[attn].sum() / dec["step_us"].sum())
        elif attn in df:  # a log without prefill_tokens: every cycle, said so in the section
            out["attn_share_all"] = float(df[attn].sum() / df["step_us"].sum())
    return out


def cycles_md(c: "Comparison", plots_dir: Path, prefix: str, out_dir: Path) -> list[str]:
    """Markdown for the section, its heading first (empty list when no arm has a cycle log); writes its plots."""
    frames, notes = {}, []
    for label, runs in ((c.a_label, c.a_runs), (c.b_label, c.b_runs)):
        p = runs[0].cycle_log
        if runs[0].cycle_log_note:
            notes.append(runs[0].cycle_log_note)
        if p is not None and p.is_file():
            df = cycles_frame(read_jsonl(p))
            if not df.empty:
                frames[label] = df
    if not frames:
        return []
    measured = any("measured_attention_us" in df for df in frames.values())
    lines = [f"## {KERNEL_TITLE if measured else MODEL_TITLE}", "", "From the emulator's per-cycle log (first run of each arm; of a resumed arm run, the server "
             "lifetime that ran the load). Decode attention share = decode attention time / step time, summed over "
             "decode cycles only (no prefill in the step).",
             *([""] + [f"Cycle log: {n}." for n in notes] if notes else []), "",
             "| arm | cycles | step mean (us) | step p50 (us) | step p90 (us) | decode-only step p50 (us) "
             "| decode attention share |", "|---|---|---|---|---|---|---|"]
    for label, df in frames.items():
        s = cycle_summary(df)
        cells = [f"{s[k]:.1f}" if k in s else "n/a"
                 for k in ("step_mean", "step_p50", "step_p90", "decode_step_p50")]
        share = (f"{s['attn_share'] * 100:.1f}%" if "attn_share" in s else
                 f"{s['attn_share_all'] * 100:.1f}% (all cycles)" if "attn_share_all" in s else "n/a")
        lines.append(f"| {label} | {int(s['cycles'])} | {' | '.join(cells)} | {share} |")
    styles = plots.comparison_styles(((c.a_label, ()), (c.b_label, ())))  # each arm's colour in every plot
    steps = {k: df["step_us"].dropna().to_numpy(float) for k, df in frames.items() if "step_us" in df}
    if steps:
        p = plots.step_time_distribution(steps, plots_dir / f"{prefix}step_time.png", "us", styles)
        lines += ["", f"![Emulator step time per arm]({Path(os.path.relpath(p, out_dir)).as_posix()})"]
    for label, df in frames.items():
        if "measured_attention_us" in df and "attn_us" in df:
            both = df.loc[df["batch"] > 0, ["attn_us", "measured_attention_us"]].dropna()
            both = both[both["measured_attention_us"] > 0]
            if len(both):
                err = (both["attn_us"] / both["measured_attention_us"] - 1).abs()
                lines += ["", f"{label}: cost model vs measured attention over {len(both)} decode cycles: "
                              f"median |error| {err.median() * 100:.1f}%, within 20% on "
                              f"{(err <= 0.2).mean() * 100:.0f}% of cycles (ratio predicted/measured p50 "
                              f"{(both['attn_us'] / both['measured_attention_us']).median():.2f})."]
                p = plots.predicted_vs_measured(both["attn_us"].to_numpy(), both["measured_attention_us"].to_numpy(),
                                                plots_dir / f"{prefix}attention_pred_vs_meas_{label.replace(':', '_')}.png",
                                                styles[label])
                lines += ["", f"![Predicted vs measured attention, {label}]"
                              f"({Path(os.path.relpath(p, out_dir)).as_posix()})"]
    return lines
