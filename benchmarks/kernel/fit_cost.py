"""`python -m benchmarks.kernel.fit_cost --run LABEL [--run LABEL ...]`: fit a hardware profile's `vattn_hopper` figures
(vattn/cost.py; configs/hardware/h200.yaml) to bench runs' VATTN_HOPPER=1 rows, and print each row's error before and
after. Several runs (on several machines) fit one model to all their rows.

The bench times each call's parts apart as well as the whole chain (plan_us, main_us, reduce_us beside us), so
the fit goes part by part, then polishes on the whole:
  1. the main kernel's figures (path_tbps of k8 and kv16, piece_latency_us) on main_us;
  2. the reduce's (reduce_fixed_us, reduce_piece_us, reduce_seq_us, reduce_tbps) on reduce_us, by non-negative
     least squares of the relative error (the model is linear in them);
  3. plan_us as the median of what the chain adds to the two (with programmatic launches it overlaps them);
  4. every figure together on the call's us, minimising the largest relative error plus 0.3 x its rms, held
     near steps 1-3's figures (Nelder-Mead from them).
Rows the Hopper kernels did not serve (backend Triton) are left out: the model gives them Triton's figures.
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
from vattn.cost import HardwareProfile, load_profile, predict_attention_us

MAIN = ("k8", "kv16", "piece_latency_us")  # path_tbps entries, then a VattnModel field
REDUCE = ("reduce_fixed_us", "reduce_piece_us", "reduce_seq_us", "reduce_tbps")
FITTED = MAIN + ("plan_us",) + REDUCE
_OFF = dict(plan_us=0.0, reduce_fixed_us=0.0, reduce_piece_us=0.0, reduce_seq_us=0.0, reduce_tbps=1e12,
            piece_latency_us=0.0)  # every term but the main kernel's bytes zero


def bench_rows(paths: list[Path], run: str) -> list[tuple[Shape, dict]]:
    """(shape, record) of the run's balanced vattn rows served by the Hopper kernels, from whichever file holds it."""
    recs = [r for path in paths for r in json.loads(path.read_text())
            if r.get("run", "").startswith(run) and r["impl"] == "vattn" and r["planner"] == "balanced"]
    if not recs:
        raise ValueError(f"--run: got {run!r}; no balanced vattn record of {', '.join(map(str, paths))} has a run "
                         "label starting so")
    return [(select(r["shape"])[0], r) for r in recs if r.get("backend") == "hopper_sm90"]


def with_figures(prof: HardwareProfile, values: dict[str, float]) -> HardwareProfile:
    v = prof.vattn_hopper
    paths = dict(v.path_tbps) | {k: values[k] for k in ("k8", "kv16") if k in values}
    return replace(prof, vattn_hopper=replace(v, path_tbps=paths,
                                              **{k: x for k, x in values.items() if k not in ("k8", "kv16")}))


def figures(prof: HardwareProfile) -> dict[str, float]:
    v = prof.vattn_hopper
    return {k: v.path_tbps[k] if k in ("k8", "kv16") else getattr(v, k) for k in FITTED}


def predict(prof: HardwareProfile, shape: Shape) -> float:
    return predict_attention_us(list(shape.seq_lens), list(shape.q_lens), impl="vattn_hopper", planner="balanced",
                                profile=prof, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                                gqa=shape.gqa, kv_dtype=shape.kv_dtype, page_size=shape.page_size)


def errors(prof: HardwareProfile, rows, key: str = "us") -> np.ndarray:
    return np.array([predict(prof, s) / r[key] - 1 for s, r in rows])


def _score(errs: np.ndarray) -> float:
    return float(np.max(np.abs(errs)) + 0.3 * np.sqrt(np.mean(errs ** 2)))


MAIN_START = (4.0, 4.0, 5.0)  # TB/s of k8 and kv16, us of a CTA's fixed cost
PART_WEIGHT = 0.05  # step 4's pull toward the parts' figures
RATES = ("k8", "kv16", "reduce_tbps")  # divisors: kept above zero; every other figure at zero or above


def _minimise(fn, names, x0):
    from scipy.optimize import minimize

    def bounded(x):
        ok = all(v > 0 if n in RATES else v >= 0 for n, v in zip(names, x))
        return fn(x) if ok else 10.0

    return minimize(bounded, x0, method="Nelder-Mead", options=dict(maxiter=4000, xatol=1e-5, fatol=1e-8)).x


def fit(prof: HardwareProfile, rows) -> dict[str, float]:
    from scipy.optimize import nnls

    # 1. the main kernel alone, every other term off, from the same start whatever the profile holds (so that the
    # fit's figures depend on the rows alone)
    main_prof = with_figures(prof, _OFF)
    x = _minimise(lambda x: _score(errors(with_figures(main_prof, dict(zip(MAIN, x))), rows, "main_us")), MAIN,
                  MAIN_START)
    values = dict(zip(MAIN, x))
    # 2. the reduce: the model adds fixed + piece x a + seq x b + bytes / tbps; each column is one term at 1
    bare = with_figures(prof, _OFF | {"k8": 1e9, "kv16": 1e9})
    base = np.array([predict(bare, s) for s, _ in rows])
    cols = [np.array([predict(with_figures(bare, {k: 1.0}), s) for s, _ in rows]) - base for k in REDUCE]
    y = np.array([r["reduce_us"] for _, r in rows])
    coef, _ = nnls(np.stack(cols, 1) / y[:, None], np.ones_like(y))
    values |= dict(zip(REDUCE[:3], coef[:3])) | {"reduce_tbps": 1 / coef[3] if coef[3] > 0 else 1e12}
    # 3. the plan: what the chain adds to its main kernel and reduce timed alone
    values["plan_us"] = max(0.0, float(np.median([r["us"] - r["main_us"] - r["reduce_us"] for _, r in rows])))
    # 4. all of them on the call, held near the parts' figures (a penalty on each one's log ratio to them): the
    # call alone cannot tell the plan's fixed time from the reduce's or a CTA's, and would trade one for another
    parts = np.array([values[k] for k in FITTED])

    def call_score(x):
        return _score(errors(with_figures(prof, dict(zip(FITTED, x))), rows)) + PART_WEIGHT * float(
            np.mean(np.log((x + 1e-3) / (parts + 1e-3)) ** 2))

    x = _minimise(call_score, FITTED, parts)
    return dict(zip(FITTED, x))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    records = Path(__file__).resolve().parents[1]
    ap.add_argument("--json", type=Path, action="append", help="bench records, repeatable (default "
                    "benchmarks/h200-vattn.json and benchmarks/h200-peers.json)")
    ap.add_argument("--run", required=True, action="append", help="a run label, or its start; repeatable")
    ap.add_argument("--profile", default="h200", help="the hardware profile to start from (default h200)")
    a = ap.parse_args(argv)
    prof = load_profile(a.profile, HARDWARE_PROFILES_DIR)
    if prof.vattn_hopper is None:
        ap.error(f"--profile: got {a.profile!r}; it has no vattn_hopper figures to fit")
    paths = a.json or [records / "h200-vattn.json", records / "h200-peers.json"]
    try:
        rows = [row for run in a.run for row in bench_rows(paths, run)]
    except ValueError as e:
        ap.error(str(e))
    values = fit(prof, rows)
    before, after = errors(prof, rows), errors(with_figures(prof, values), rows)
    print(f"{'shape':28s} {'measured':>9s} {'before':>8s} {'after':>8s}")
    for (shape, r), b, f in zip(rows, before, after):
        print(f"{shape.name:28s} {r['us']:9.1f} {b:+8.1%} {f:+8.1%}")
    for label, errs in (("before", before), ("after", after)):
        print(f"{label}: largest |error| {np.max(np.abs(errs)):.1%}, rms {np.sqrt(np.mean(errs ** 2)):.1%} "
              f"over {len(rows)} rows")
    old = figures(prof)
    for k in FITTED:
        print(f"{k}: {old[k]:g} -> {values[k]:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
