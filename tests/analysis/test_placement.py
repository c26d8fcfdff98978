"""Concurrent placement with a swap: kernel and GPU effects on frames small enough to check by hand."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis.placement import (contrast, effects, gpu_facts, group_deltas, has_swap, matched_cells,
                                pairing_line, placement_frame, placement_md)
from analysis.report import write_report
from analysis.rundir import load_run

N_BOOT = 300
SESSIONS = [f"s{i}" for i in range(6)]


def arm_runs(ports=(30000, 30001), gpus=((), ()), hosts=("local", "local"), swap=True) -> list[dict]:
    """pipeline.plan's concurrent order: group 0 off on slot 0, on on slot 1; group 1 swapped."""
    slot = lambda s: {"host": hosts[s], "gpus": list(gpus[s]), "port": ports[s]}  # noqa: E731
    rows = [{"name": "off", "arm": "off", "round": 1, "group": 0, **slot(0)},
            {"name": "on", "arm": "on", "round": 1, "group": 0, **slot(1)}]
    if swap:
        rows += [{"name": "off.2", "arm": "off", "round": 2, "group": 1, **slot(1)},
                 {"name": "on.2", "arm": "on", "round": 2, "group": 1, **slot(0)}]
    return rows


def manifest(**kw) -> dict:
    return {"plan": {"mode": "concurrent"}, "arm_runs": arm_runs(**kw)}


def records(values: dict[tuple[str, int], float]) -> pd.DataFrame:
    """A record frame (ArmRun.records shape) from {(session, turn): tpot}; ttft/latency follow from tpot."""
    rows = [{"conversation_id": s, "turn_index": t, "occurrence": 0, "ok": np.isfinite(v), "tpot_ms": v,
             "ttft_ms": 100.0 + v, "latency_ms": 100.0 + 10 * v} for (s, t), v in values.items()]
    return pd.DataFrame(rows)


def base(s: str, t: int) -> float:
    return 10.0 + int(s[1:]) + 0.5 * t     # per-request baseline: 10..15.5 ms


def cells(kernel=-2.0, gpu=1.0, interaction=0.0, drift=0.0, noise=0.0, sessions=SESSIONS,
          seed=3) -> dict[str, pd.DataFrame]:
    """y = base + kernel*[on] + gpu*[set B] + interaction*[on and B] + drift*[group 2] (+ noise)."""
    rng = np.random.default_rng(seed)
    where = {"off": ("off", "A", 0), "on": ("on", "B", 0), "off.2": ("off", "B", 1), "on.2": ("on", "A", 1)}
    out = {}
    for name, (arm, gset, group) in where.items():
        on, b = arm == "on", gset == "B"
        out[name] = records({(s, t): base(s, t) + kernel * on + gpu * b + interaction * (on and b) + drift * group
                             + noise * rng.standard_normal() for s in sessions for t in range(2)})
    return out


def row(df: pd.DataFrame, effect: str, metric: str = "tpot_ms") -> pd.Series:
    return df[(df["effect"] == effect) & (df["metric"] == metric)].iloc[0]


# ---------------------------------------------------------------- placement from the manifest

def test_placement_on_cpu_tells_sets_apart_by_port():
    p = placement_frame(manifest())
    assert list(p["name"]) == ["off", "on", "off.2", "on.2"]
    assert list(p["gpu_set"]) == ["A", "B", "B", "A"]
    assert list(p["swapped"]) == [False, False, True, True]
    assert has_swap(p)
    assert pairing_line(p) == ("Pairing (each group's two arm runs ran at the same time): group 1: off on A, "
                               "on on B; group 2 (swapped): off.2 on B, on.2 on A.")


def test_placement_by_gpu_ids_and_by_host():
    p = placement_frame(manifest(gpus=((0,), (1,))))
    assert list(p["gpus"]) == [(0,), (1,), (1,), (0,)] and list(p["gpu_set"]) == ["A", "B", "B", "A"]
    # TP2 pairs on one 4-GPU host (recipes/*tp2-concurrent.yaml): a set is a pair of ids.
    p = placement_frame(manifest(gpus=((0, 1), (2, 3))))
    assert list(p["gpus"]) == [(0, 1), (2, 3), (2, 3), (0, 1)] and list(p["gpu_set"]) == ["A", "B", "B", "A"]
    # One host per arm: same port and GPU id on both, the host tells them apart.
    p = placement_frame(manifest(ports=(30000, 30000), gpus=((0,), (0,)), hosts=("h0", "h1")))
    assert list(p["host"]) == ["h0", "h1", "h1", "h0"] and list(p["gpu_set"]) == ["A", "B", "B", "A"]


def test_no_swap_is_no_design():
    assert not has_swap(placement_frame(manifest(swap=False)))


@pytest.mark.parametrize("edit, message", [
    (lambda rows: rows[2].update(arm="on"), r"group 1 has arms \['on', 'on'\]; a concurrent group runs off and on"),
    (lambda rows: rows[2].update(port=30002), r"group 1 ran on .*30002.*expected the first group's two GPU sets"),
    (lambda rows: [r.pop("group") for r in rows], r"no group/host/gpus/port per arm run"),
])
def test_bad_arm_runs_are_named(edit, message):
    m = manifest()
    edit(m["arm_runs"])
    with pytest.raises(ValueError, match=message):
        placement_frame(m)


# ---------------------------------------------------------------- effects by hand

def test_additive_kernel_and_gpu_effects_recovered_exactly():
    p = placement_frame(manifest())
    long = matched_cells(cells(kernel=-2.0, gpu=1.0), p)
    eff = effects(long, p, n_boot=N_BOOT)
    mean_base = np.mean([base(s, t) for s in SESSIONS for t in range(2)])   # 12.75
    k, g, o = row(eff, "kernel"), row(eff, "gpu"), row(eff, "orientation")
    # off cells: base (A) and base + 1 (B) -> mean 13.25; on cells: base - 2 + 1 (B) and base - 2 (A) -> 11.25.
    assert (k.n, k.a, k.b, k.diff_ms) == (12, pytest.approx(mean_base + 0.5), pytest.approx(mean_base - 1.5),
                                       pytest.approx(-2.0))
    assert k.delta_pct == pytest.approx(-2.0 / 13.25 * 100) and k.lo < k.delta_pct < k.hi < 0
    assert g.diff_ms == pytest.approx(1.0) and g.a == pytest.approx(mean_base - 1.0) and 0 < g.lo < g.hi
    # No drift, no interaction: the two orientations hold the same cells' sums.
    assert o.diff_ms == pytest.approx(0.0) and o.lo == pytest.approx(0.0) and o.hi == pytest.approx(0.0)
    assert set(eff["metric"]) == {"tpot_ms", "ttft_ms", "latency_ms"}
    assert row(eff, "kernel", "latency_ms").diff_ms == pytest.approx(-20.0)   # latency = 100 + 10 * tpot


def test_per_group_delta_is_kernel_plus_minus_gpu():
    p = placement_frame(manifest())
    g = group_deltas(matched_cells(cells(kernel=-2.0, gpu=1.0), p), p, n_boot=N_BOOT)
    assert list(g["off_run"]) == ["off", "off.2"] and list(g["on_run"]) == ["on", "on.2"]
    assert list(g["off_set"]) == ["A", "B"] and list(g["on_set"]) == ["B", "A"]
    assert g["diff_ms"].tolist() == pytest.approx([-1.0, -3.0])     # kernel + GPU, kernel - GPU
    assert g["delta_pct"].tolist() == pytest.approx([-1 / 12.75 * 100, -3 / 13.75 * 100])
    # The pooled kernel effect is their average in ms: the GPU difference cancels across the swap.
    assert g["diff_ms"].mean() == pytest.approx(row(effects(matched_cells(cells(), p), p, n_boot=N_BOOT),
                                                     "kernel").diff_ms)


def test_interaction_shows_in_orientation_and_splits_into_both_effects():
    p = placement_frame(manifest())
    eff = effects(matched_cells(cells(kernel=-2.0, gpu=1.0, interaction=-1.0), p), p, n_boot=N_BOOT)
    # on@B = base - 2: kernel = k + i/2, GPU = g + i/2, orientation = -i/2.
    assert row(eff, "kernel").diff_ms == pytest.approx(-2.5)
    assert row(eff, "gpu").diff_ms == pytest.approx(0.5)
    assert row(eff, "orientation").diff_ms == pytest.approx(0.5) and row(eff, "orientation").lo > 0


def test_drift_between_groups_cancels_from_kernel_and_gpu():
    p = placement_frame(manifest())
    eff = effects(matched_cells(cells(kernel=-2.0, gpu=0.0, drift=3.0), p), p, n_boot=N_BOOT)
    assert row(eff, "kernel").diff_ms == pytest.approx(-2.0)
    assert row(eff, "gpu").diff_ms == pytest.approx(0.0)
    assert row(eff, "orientation").diff_ms == pytest.approx(3.0)


def test_noisy_runs_kernel_ci_covers_truth_and_aa_gpu_ci_covers_zero():
    """50 noisy replays of 20 sessions: the 95% CIs cover the true kernel effect and the true (zero) GPU
    effect in most replays, and the kernel CI excludes zero in all (the effect is ~10 standard errors)."""
    p = placement_frame(manifest())
    sessions = [f"s{i}" for i in range(20)]
    truth = -2.0 / (np.mean([base(s, t) for s in sessions for t in range(2)]) ) * 100
    covered = aa_covered = excludes = 0
    for seed in range(50):
        eff = effects(matched_cells(cells(kernel=-2.0, gpu=0.0, noise=1.0, sessions=sessions, seed=seed), p), p,
                      ["tpot_ms"], n_boot=N_BOOT, seed=seed)
        k, g = row(eff, "kernel"), row(eff, "gpu")
        covered += k.lo < truth < k.hi
        excludes += k.hi < 0
        aa_covered += g.lo < 0 < g.hi
    assert covered >= 42 and aa_covered >= 42 and excludes == 50, (covered, aa_covered, excludes)


def test_only_requests_completed_in_all_four_runs_are_used():
    c = cells()
    c["off.2"].loc[0, "ok"] = False                                  # s0 turn 0 failed in off.2
    c["on"] = c["on"][c["on"]["conversation_id"] != "s5"]            # s5 never dispatched in on
    p = placement_frame(manifest())
    long = matched_cells(c, p)
    keys = set(zip(long["conversation_id"], long["turn_index"]))
    assert ("s0", 0) not in keys and not any(s == "s5" for s, _ in keys) and len(keys) == 12 - 1 - 2
    assert len(long) == 4 * len(keys)
    assert row(effects(long, p, n_boot=N_BOOT), "kernel").n == 9
    with pytest.raises(ValueError, match=r"no records for arm run\(s\) \['on.2'\]"):
        matched_cells({k: v for k, v in c.items() if k != "on.2"}, p)


def test_contrast_with_fewer_than_five_sessions_has_no_ci():
    p = placement_frame(manifest())
    few = {k: v[v["conversation_id"].isin(["s0", "s1"])] for k, v in cells().items()}
    r = contrast(matched_cells(few, p), ["off", "off.2"], ["on", "on.2"], "tpot_ms", n_boot=N_BOOT)
    assert r["n"] == 4 and r["sessions"] == 2 and r["diff_ms"] == pytest.approx(-2.0)
    assert np.isnan(r["lo"]) and np.isnan(r["hi"])


def test_gpu_facts_per_set_from_manifest():
    m = manifest(gpus=((0,), (1,)))
    m["hosts"] = {"local": {"kind": "local", "gpus": [
        {"index": "0", "name": "NVIDIA H200", "uuid": "GPU-aaa", "clocks.sm": "1980 MHz", "clocks.max.sm": "1980 MHz",
         "clocks.mem": "3201 MHz", "memory.total": "143771 MiB", "driver_version": "570.1"},
        {"index": "1", "name": "NVIDIA H200", "uuid": "GPU-bbb", "clocks.sm": "345 MHz"}]}}
    f = gpu_facts(m, placement_frame(m))
    assert list(f["gpu_set"]) == ["A", "B"] and list(f["uuid"]) == ["GPU-aaa", "GPU-bbb"]
    assert f.iloc[1]["clocks.sm"] == "345 MHz" and f.iloc[1]["clocks.max.sm"] == "unknown"
    assert gpu_facts(manifest(), placement_frame(manifest())).empty     # CPU: no GPU ids, no facts


# ---------------------------------------------------------------- the report section

def _run_dir(tmp_path, m: dict):
    from analysis_records import make_run, record

    def lines(delta: float) -> list[dict]:
        return [record(s, t, 1000 * i + t, tpot=base(s, t) + delta) for i, s in enumerate(SESSIONS)
                for t in range(2)]

    root = make_run(tmp_path / "conc", {"off": lines(0.0), "on": lines(-1.0), "off.2": lines(1.0),
                                        "on.2": lines(-2.0)})
    (root / "manifest.json").write_text(json.dumps(m))
    return root


def test_report_has_placement_section_for_concurrent_swap(tmp_path):
    m = manifest(gpus=((0,), (1,)))
    m["hosts"] = {"local": {"gpus": [{"index": "0", "name": "NVIDIA H200", "uuid": "GPU-aaa"},
                                     {"index": "1", "name": "NVIDIA H200", "uuid": "GPU-bbb"}]}}
    md = write_report(_run_dir(tmp_path, m), n_boot=N_BOOT).read_text()
    sec = md.split("## Placement: concurrent with swap\n", 1)[1].split("\n## ", 1)[0]
    assert "group 1: off on A, on on B; group 2 (swapped): off.2 on B, on.2 on A." in sec
    assert "GPU sets: A (local, GPU 0); B (local, GPU 1). Requests completed in all 4 arm runs: 12" in sec
    # kernel -2 ms, GPU +1 ms on a 12.75 ms base: off mean 13.25, on 11.25.
    tpot = "| Decode time per token (ms) | 12 |"
    assert f"| kernel: on vs off, both groups pooled {tpot} 13.25 | 11.25 | -15.1% (-2 ms) |" in sec
    assert f"| GPU set: B vs A, both arms pooled (A/A) {tpot} 11.75 | 12.75 | +8.5% (+1 ms) |" in sec
    assert "| 1 (off / on) | A | B | 12 | 12.75 | 11.75 | -7.8% [" in sec
    assert "| 2 (off.2 / on.2) | B | A | 12 | 13.75 | 10.75 | -21.8% [" in sec
    assert "| A | local | 0 | NVIDIA H200 |" in sec and "| GPU-bbb |" in sec
    assert "it holds the GPU effect and the drift" in sec


def test_no_placement_section_without_swap_or_when_sequential(tmp_path):
    seq = {"plan": {"mode": "sequential"}, "arm_runs": arm_runs()}
    md = write_report(_run_dir(tmp_path, seq), n_boot=N_BOOT).read_text()
    assert "## Placement" not in md
    assert placement_md(load_run(tmp_path / "conc")) == []
    m = manifest()
    m["arm_runs"] = m["arm_runs"][:2] + [dict(m["arm_runs"][0], name="off.2", round=2, group=1),
                                         dict(m["arm_runs"][1], name="on.2", round=2, group=1)]
    (tmp_path / "conc" / "manifest.json").write_text(json.dumps(m))
    assert placement_md(load_run(tmp_path / "conc")) == []     # concurrent, but never swapped


def test_missing_arm_run_export_is_said(tmp_path):
    import shutil

    root = _run_dir(tmp_path, manifest())
    shutil.rmtree(root / "arms" / "on.2")
    lines = placement_md(load_run(root), n_boot=N_BOOT)
    assert lines[-1] == "No 2x2 decomposition: arm run(s) on.2 have no aiperf export."


def test_concurrent_run_without_groups_says_why(tmp_path):
    root = _run_dir(tmp_path, manifest())
    m = manifest()
    for r in m["arm_runs"]:
        r.pop("group")
    (root / "manifest.json").write_text(json.dumps(m))
    assert placement_md(load_run(root), n_boot=N_BOOT) == [
        "Concurrent run, but the arm runs cannot be placed: manifest arm_runs: no group/host/gpus/port per arm "
        "run; cannot place the arm runs."]
