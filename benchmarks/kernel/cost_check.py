"""`python -m benchmarks.kernel.cost_check --check-cycles RUN_DIR`: vattn's cost model against the kernel
times a kernel-in-the-loop emulator run measured (arms/*/emulator_cycles/), per decode cycle.

It reads a pipeline run directory, so it lives with the benchmark tooling, not in the kernel package.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

from pipeline.paths import HARDWARE_PROFILES_DIR, RunPaths
from vattn.cost import HardwareProfile, load_profile, predict_attention_us


def approx_batch(cycle: dict) -> tuple[list[int], list[int], bool]:
    """(seq_lens, q_lens, exact): the cycle log keeps totals, not each sequence, so the verify batch is
    rebuilt as its longest sequence (max_kv) plus the rest of attn_kv_tokens spread evenly: exact for
    batches of 1 and 2 (up to the few new tokens max_kv may leave out) and for uniform batches."""
    b, total, q = cycle["batch"], cycle["attn_kv_tokens"], cycle["q_len"]
    if b == 1:
        return [total], [q], True
    longest = min(cycle["max_kv"], total)
    rest = total - longest
    lens = [longest] + [rest // (b - 1) + (i < rest % (b - 1)) for i in range(b - 1)]
    return lens, [q] * b, b == 2


def check_cycles(run_dir: str, profile: str = "h200", tol: float = 0.2) -> list[dict]:
    """Per arm run: the share of decode cycles whose logged per-layer prediction, and the prediction
    recomputed with `profile` on the rebuilt batch (approx_batch), are within `tol` of the measured
    kernel time, and the median ratios; exact_*: the cycles whose batch the log pins down exactly."""
    run = RunPaths(Path(run_dir))
    if not run.arm_runs():
        raise ValueError(f"run_dir: got {run_dir!r}; it has no arms/ folder with arm runs")
    prof = load_profile(profile, HARDWARE_PROFILES_DIR)
    rows = [_arm_row(run, arm, prof, tol) for arm in run.arm_runs()]
    return [r for r in rows if r is not None]


def _arm_row(run: RunPaths, arm: str, prof: HardwareProfile, tol: float) -> dict | None:
    arm_paths = run.arm(arm)
    # Every server lifetime's log counts: each cycle is checked on its own batch.
    logs = list(arm_paths.emulator_cycle_logs().values()) or [arm_paths.legacy_emulator_cycles]
    lines = [x for p in logs if p.is_file() for x in p.read_text().splitlines()]
    if not lines:
        return None
    info = json.loads(arm_paths.server_info.read_text())
    c = info["config"]
    shape = dict(num_kv_heads=c["num_kv_heads"], head_dim=c["head_dim"], gqa=c["gqa"], kv_dtype=c["kv_dtype"],
                 page_size=c["page_size"])
    slots = info["hardware"].get("slots_per_sm", prof.slots_per_sm)  # the kernel's occupancy, as logged
    arm_prof = replace(prof, slots_per_sm=slots)
    impl = info["arm"].get("impl", "vattn")  # vattn_hopper where the arm ran VATTN_HOPPER=1
    qk = info["arm"].get("qk", "split")  # VATTN_QK's rounding (runs before it was logged: split)
    logged, now, exact = [], [], []
    for line in lines:
        cyc = json.loads(line)
        meas = cyc.get("measured_attention_layer_us", 0.0)
        if not meas or not cyc.get("batch"):
            continue
        logged.append(cyc["predicted_attention_layer_us"] / meas)
        lens, qs, is_exact = approx_batch(cyc)
        now.append(predict_attention_us(lens, qs, impl=impl, planner=cyc["planner"], profile=arm_prof, qk=qk,
                                        **shape) / meas)
        if is_exact:
            exact.append(now[-1])
    if not logged:
        return None
    return dict(arm=arm, planner=info["arm"].get("planner"), cycles=len(logged),
                logged_within=sum(abs(r - 1) <= tol for r in logged) / len(logged),
                logged_median=statistics.median(logged),
                now_within=sum(abs(r - 1) <= tol for r in now) / len(now),
                now_median=statistics.median(now), exact_cycles=len(exact),
                exact_within=sum(abs(r - 1) <= tol for r in exact) / max(1, len(exact)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernel.cost_check", description=__doc__.splitlines()[0])
    ap.add_argument("--check-cycles", metavar="RUN_DIR", required=True,
                    help="a kernel-in-the-loop run directory (arms/*/emulator_cycles/)")
    ap.add_argument("--profile", default="h200", help="a name in configs/hardware/ or a profile YAML's path")
    ap.add_argument("--tol", type=float, default=0.2)
    args = ap.parse_args(argv)
    print(f"predicted / measured per attention layer, decode cycles; 'now' = recomputed with profile "
          f"{args.profile} on the batch rebuilt from the log's totals (longest + even rest: approximate)")
    print(f"{'arm':8s} {'planner':13s} {'cycles':>6s} {'logged within':>14s} {'logged median':>14s} "
          f"{'now within':>11s} {'now median':>11s} {'exact batches':>14s} {'exact within':>13s}")
    for r in check_cycles(args.check_cycles, args.profile, args.tol):
        print(f"{r['arm']:8s} {str(r['planner']):13s} {r['cycles']:6d} {r['logged_within']:14.0%} "
              f"{r['logged_median']:14.2f} {r['now_within']:11.0%} {r['now_median']:11.2f} "
              f"{r['exact_cycles']:14d} {r['exact_within']:13.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
