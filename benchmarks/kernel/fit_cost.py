"""`python -m benchmarks.kernel.fit_cost [--model vattn] --run LABEL [--run LABEL ...]`: fit a hardware profile's
`vattn_hopper` figures (vattn/cost.py; configs/hardware/h200.yaml) to bench runs' VATTN_HOPPER=1 rows, or with
`--model vattn` its Triton path's figures to the rows that path served, and print each row's error before and
after. Several runs (on several machines) fit one model to all their rows.

The bench times each call's parts apart as well as the whole chain (plan_us, main_us, reduce_us beside us), so
the fit goes part by part, then polishes on the whole:
  1. the main kernel's figures on main_us: a CTA's fixed cost (piece_latency_us) and the Hopper paths' path_tbps,
     or the Triton paths' dot_tflops (of the kernel paths the rows ran) and a per-kernel constant (launch_us, the
     one-wave grids' fill and drain, which later waves overlap);
  2. the reduce's (reduce_fixed_us, reduce_piece_us, reduce_seq_us, reduce_tbps) on reduce_us, by non-negative
     least squares of the relative error (the model is linear in them);
  3. plan_us as the median of what the chain adds to the two (with programmatic launches it overlaps them);
  4. every figure together on the call's us, minimising the largest relative error plus 0.3 x its rms, held
     near steps 1-3's figures (Nelder-Mead from them).
Each model fits the rows its kernels served (backend hopper_sm90 or triton), but those of --leave-out's shapes
(still printed). The Triton model's plan_us is one figure a planner: the fit moves every planner's by balanced's
change (the runs time balanced only).
Needs scipy (a benchmark tool, not a runtime dependency)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.kernel.shapes import Shape, select
from pipeline.paths import HARDWARE_PROFILES_DIR
from vattn.cost import HardwareProfile, kernel_path, load_profile, predict_attention_us

REDUCE = ("reduce_fixed_us", "reduce_piece_us", "reduce_seq_us", "reduce_tbps")
_OFF = dict(plan_us=0.0, reduce_fixed_us=0.0, reduce_piece_us=0.0, reduce_seq_us=0.0, reduce_tbps=1e12,
            piece_latency_us=0.0)  # every term but the main kernel's bytes zero
BACKEND = {"vattn_hopper": "hopper_sm90", "vattn": "triton"}  # the rows each model fits
RATE_START = {"vattn_hopper": 4.0, "vattn": 500.0}  # TB/s of a Hopper path, TFLOP/s of a Triton path's dots


def bench_rows(paths: list[Path], run: str, model: str = "vattn_hopper") -> list[tuple[Shape, dict]]:
    """(shape, record) of the run's balanced vattn rows served by `model`'s kernels, from whichever file holds it
    (VATTN_QK=split's: the lossy mode's figures are set apart, by their measured ratio to these)."""
    recs = [r for path in paths for r in json.loads(path.read_text())
            if r.get("run", "").startswith(run) and r["impl"] == "vattn" and r["planner"] == "balanced"
            and r.get("qk", "split") == "split"]
    if not recs:
        raise ValueError(f"--run: got {run!r}; no balanced vattn record of {', '.join(map(str, paths))} has a run "
                         "label starting so")
    return [(select(r["shape"])[0], r) for r in recs if r.get("backend") == BACKEND[model]]


def main_figures(model: str, rows) -> tuple[str, ...]:
    """The main kernel's rates, named "path_tbps.k8" (a Hopper path's bytes rate) or "dot_tflops.fp8x2" (a Triton
    path's dots: those of the paths the rows ran), then a CTA's fixed cost."""
    if model == "vattn_hopper":  # the fitted runs' paths: head_dim 128 reads two KV heads a CTA, as k8 does 256
        return ("path_tbps.k8", "path_tbps.kv16", "piece_latency_us")
    paths = sorted({kernel_path(list(s.q_lens), s.gqa, s.kv_dtype, s.head_dim)[0] for s, _ in rows})
    return tuple(f"dot_tflops.{p}" for p in paths) + ("launch_us", "piece_latency_us")


def with_figures(prof: HardwareProfile, values: dict[str, float], model: str = "vattn_hopper") -> HardwareProfile:
    v = getattr(prof, model)
    fields, tables = {}, {t: dict(getattr(v, t)) for t in ("path_tbps", "dot_tflops")}
    for k, x in values.items():
        table, _, path = k.partition(".")
        if path:
            tables[table][path] = x
        elif k == "plan_us" and isinstance(v.plan_us, dict):  # every planner moves by balanced's change
            fields[k] = {p: max(0.0, f + x - v.plan_us["balanced"]) for p, f in v.plan_us.items()}
        else:
            fields[k] = x
    return replace(prof, **{model: replace(v, **tables, **fields)})


def figures(prof: HardwareProfile, names, model: str = "vattn_hopper") -> dict[str, float]:
    v = getattr(prof, model)
    out = {}
    for k in names:
        table, _, path = k.partition(".")
        value = getattr(v, table)[path] if path else getattr(v, k)
        out[k] = value["balanced"] if isinstance(value, dict) else value
    return out


def predict(prof: HardwareProfile, row: tuple[Shape, dict], model: str = "vattn_hopper") -> float:
    """The model's call for a bench row; the Triton path planned with the occupancy its kernel had (q8 and bf16
    ran one program an SM), as the emulator plans with the compiled kernel's."""
    shape, r = row
    if model == "vattn" and r.get("programs_per_sm"):
        prof = replace(prof, slots_per_sm=r["programs_per_sm"])
    return predict_attention_us(list(shape.seq_lens), list(shape.q_lens), impl=model, planner="balanced",
                                profile=prof, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                                gqa=shape.gqa, kv_dtype=shape.kv_dtype, page_size=shape.page_size)


def errors(prof: HardwareProfile, rows, key: str = "us", model: str = "vattn_hopper") -> np.ndarray:
    return np.array([predict(prof, row, model) / row[1][key] - 1 for row in rows])


def _score(errs: np.ndarray) -> float:
    return float(np.max(np.abs(errs)) + 0.3 * np.sqrt(np.mean(errs ** 2)))


LATENCY_START = 5.0  # us of a CTA's fixed cost
PART_WEIGHT = 0.05  # step 4's pull toward the parts' figures


def _minimise(fn, names, x0):
    from scipy.optimize import minimize

    def bounded(x):  # rates are divisors, kept above zero; every other figure at zero or above
        ok = all(v > 0 if "." in n or n == "reduce_tbps" else v >= 0 for n, v in zip(names, x))
        return fn(x) if ok else 10.0

    return minimize(bounded, x0, method="Nelder-Mead", options=dict(maxiter=4000, xatol=1e-5, fatol=1e-8)).x


def fit(prof: HardwareProfile, rows, model: str = "vattn_hopper") -> dict[str, float]:
    from scipy.optimize import nnls

    def err(p, key="us"):
        return errors(p, rows, key, model)

    def fig(p, values):
        return with_figures(p, values, model)

    # 1. the main kernel alone, every other term off, from the same start whatever the profile holds (so that the
    # fit's figures depend on the rows alone)
    main = main_figures(model, rows)
    main_prof = fig(prof, _OFF)
    start = [RATE_START[model] if "." in k else LATENCY_START for k in main]
    x = _minimise(lambda x: _score(err(fig(main_prof, dict(zip(main, x))), "main_us")), main, start)
    values = dict(zip(main, x))
    # 2. the reduce: the model adds fixed + piece x a + seq x b + bytes / tbps; each column is one term at 1
    bare = fig(prof, _OFF | {k: 1e9 for k in main if "." in k} | {"launch_us": 0.0})
    base = np.array([predict(bare, row, model) for row in rows])
    cols = [np.array([predict(fig(bare, {k: 1.0}), row, model) for row in rows]) - base for k in REDUCE]
    y = np.array([r["reduce_us"] for _, r in rows])
    coef, _ = nnls(np.stack(cols, 1) / y[:, None], np.ones_like(y))
    values |= dict(zip(REDUCE[:3], coef[:3])) | {"reduce_tbps": 1 / coef[3] if coef[3] > 0 else 1e12}
    # 3. the plan: what the chain adds to its main kernel and reduce timed alone
    values["plan_us"] = max(0.0, float(np.median([r["us"] - r["main_us"] - r["reduce_us"] for _, r in rows])))
    # 4. all of them on the call, held near the parts' figures (a penalty on each one's log ratio to them): the
    # call alone cannot tell the plan's fixed time from the reduce's or a CTA's, and would trade one for another
    names = tuple(values)
    parts = np.array([values[k] for k in names])

    def call_score(x):
        return _score(err(fig(prof, dict(zip(names, x))))) + PART_WEIGHT * float(
            np.mean(np.log((x + 1e-3) / (parts + 1e-3)) ** 2))

    x = _minimise(call_score, names, parts)
    return dict(zip(names, x))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    records = Path(__file__).resolve().parents[1]
    ap.add_argument("--json", type=Path, action="append", help="bench records, repeatable (default "
                    "benchmarks/h200-vattn.json and benchmarks/h200-peers.json)")
    ap.add_argument("--run", required=True, action="append", help="a run label, or its start; repeatable")
    ap.add_argument("--profile", default="h200", help="the hardware profile to start from (default h200)")
    ap.add_argument("--model", default="vattn_hopper", choices=tuple(BACKEND),
                    help="the figures to fit: vattn_hopper (VATTN_HOPPER=1's kernels, default) or vattn (the Triton path)")
    ap.add_argument("--leave-out", default="", metavar="SHAPES",
                    help="comma-separated shape names whose rows the fit leaves out (their errors are still printed)")
    a = ap.parse_args(argv)
    prof = load_profile(a.profile, HARDWARE_PROFILES_DIR)
    if getattr(prof, a.model) is None:
        ap.error(f"--profile: got {a.profile!r}; it has no {a.model} figures to fit")
    paths = a.json or [records / "h200-vattn.json", records / "h200-peers.json"]
    try:
        rows = [row for run in a.run for row in bench_rows(paths, run, a.model)]
    except ValueError as e:
        ap.error(str(e))
    if not rows:
        ap.error(f"--run: the runs have no balanced rows that {a.model}'s kernels ({BACKEND[a.model]}) served")
    left_out = {name for name in a.leave_out.split(",") if name}
    if left_out - {s.name for s, _ in rows}:
        ap.error(f"--leave-out: got {', '.join(sorted(left_out - {s.name for s, _ in rows}))}; the runs' rows are of "
                 f"{', '.join(sorted({s.name for s, _ in rows}))}")
    values = fit(prof, [row for row in rows if row[0].name not in left_out], a.model)
    before, after = errors(prof, rows, model=a.model), errors(with_figures(prof, values, a.model), rows, model=a.model)
    print(f"{'shape':28s} {'measured':>9s} {'before':>8s} {'after':>8s}")
    for (shape, r), b, f in zip(rows, before, after):
        print(f"{shape.name:28s} {r['us']:9.1f} {b:+8.1%} {f:+8.1%}" + ("  (left out)" if shape.name in left_out else ""))
    fitted = np.array([s.name not in left_out for s, _ in rows])
    for label, errs in (("before", before[fitted]), ("after", after[fitted])):
        print(f"{label}: largest |error| {np.max(np.abs(errs)):.1%}, rms {np.sqrt(np.mean(errs ** 2)):.1%} "
              f"over the {len(errs)} fitted rows")
    old = figures(prof, values, a.model)
    for k, x in values.items():
        print(f"{k}: {old[k]:g} -> {x:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
