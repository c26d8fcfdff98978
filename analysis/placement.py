"""Concurrent placement with a swap: the kernel effect separated from the GPU effect (a 2x2 of arm x GPU set).

Group 1 runs `off` on GPU set A and `on` on set B at the same time; group 2 swaps them (off.2 on B,
on.2 on A). Each request matched in all four arm runs then has four values y[arm, set]:

    per-group kernel delta   group 1: on@B vs off@A = kernel + GPU;   group 2: on@A vs off@B = kernel - GPU
    kernel effect            (on@A + on@B) vs (off@A + off@B)        the GPU difference cancels across the swap
    GPU effect (A/A)         (off@B + on@B) vs (off@A + on@A)        the GPUs checked against each other
    orientation              (off@B + on@A) vs (off@A + on@B)        drift between the groups

Within a group both arms see the same time of day and the same trace replay, so drift cancels from
each per-group delta; the GPU difference cancels only in the pool of both groups. Four cells cannot
tell everything apart: the kernel x GPU interaction is aliased with the orientation contrast (drift
between groups), and a drift that changes the kernel's own effect leaks into the GPU effect. The
report says so next to the table.

Every estimate is a ratio of means over the same matched requests (so the cells are balanced and the
decomposition is exact for additive effects), with a CI from `stats.paired_ratio_bootstrap`, which
resamples whole sessions. More rounds (`repeats: 2` with swap) stack in the same way.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from analysis import stats
from analysis.load import root_sessions
from analysis.formatting import fmt
from analysis.metrics import KEY, MATCHED_METRICS

if TYPE_CHECKING:
    import pandas as pd

    from analysis.rundir import Run

PLACEMENT_COLUMNS = ["name", "arm", "group", "host", "gpus", "port", "gpu_set", "swapped"]
GPU_FACT_FIELDS = ("name", "uuid", "clocks.sm", "clocks.max.sm", "clocks.mem", "memory.total", "driver_version")


def _where(row: dict[str, Any]) -> tuple:
    # Host and GPU ids name a GPU set; on a CPU-only host (no GPU binding) the port is what tells the two
    # concurrent servers apart.
    return str(row.get("host")), tuple(int(g) for g in row.get("gpus") or ()), int(row.get("port") or 0)


def is_concurrent(manifest: dict[str, Any]) -> bool:
    plan = manifest.get("plan") or {}
    mode = plan.get("mode") or ((manifest.get("recipe") or {}).get("placement") or {}).get("mode")
    return mode == "concurrent"


def placement_frame(manifest: dict[str, Any]) -> "pd.DataFrame":
    """One row per arm run: name | arm | group | host | gpus | port | gpu_set ("A"/"B") | swapped.

    Set A is where the first group's `off` ran, set B where its `on` ran; a group is swapped when its
    `off` ran on B. Raises ValueError naming the group when a group is not one off and one on on A and B.
    """
    import pandas as pd

    rows = [dict(r) for r in manifest.get("arm_runs") or [] if isinstance(r, dict) and "name" in r]
    if not rows or any("group" not in r for r in rows):
        raise ValueError("manifest arm_runs: no group/host/gpus/port per arm run; cannot place the arm runs")
    groups: dict[int, list[dict]] = {}
    for r in rows:
        groups.setdefault(int(r["group"]), []).append(r)
    where = {}
    for g, members in sorted(groups.items()):
        arms = sorted(str(r["arm"]) for r in members)
        if arms != ["off", "on"]:
            raise ValueError(f"manifest arm_runs: group {g} has arms {arms}; a concurrent group runs off and on")
        where[g] = {str(r["arm"]): _where(r) for r in members}
    a_set, b_set = where[min(groups)]["off"], where[min(groups)]["on"]
    out = []
    for g, members in sorted(groups.items()):
        swapped = where[g]["off"] == b_set
        if {where[g]["off"], where[g]["on"]} != {a_set, b_set}:
            raise ValueError(f"manifest arm_runs: group {g} ran on {sorted(where[g].values())}; expected the "
                             f"first group's two GPU sets {[a_set, b_set]}")
        for r in members:
            out.append({"name": str(r["name"]), "arm": str(r["arm"]), "group": g, "host": str(r.get("host")),
                        "gpus": tuple(int(x) for x in r.get("gpus") or ()), "port": int(r.get("port") or 0),
                        "gpu_set": "A" if _where(r) == a_set else "B", "swapped": swapped})
    return pd.DataFrame(out, columns=PLACEMENT_COLUMNS).sort_values(["group", "arm"], ignore_index=True)


def has_swap(placement: "pd.DataFrame") -> bool:
    return bool(placement["swapped"].any() and (~placement["swapped"]).any())


def matched_cells(records: dict[str, "pd.DataFrame"], placement: "pd.DataFrame") -> "pd.DataFrame":
    """Requests completed in every arm run of `placement`, long: KEY | arm_run | metric columns.

    `records` maps arm-run name -> analysis.load record frame with `occurrence` (ArmRun.records).
    """
    import pandas as pd

    cols = [c for c, _ in MATCHED_METRICS]
    names = list(placement["name"])
    missing = [n for n in names if n not in records]
    if missing:
        raise ValueError(f"matched_cells: no records for arm run(s) {missing}; have {sorted(records)}")
    parts = [records[n].loc[records[n]["ok"], KEY + cols].assign(arm_run=n) for n in names]
    long = pd.concat(parts, ignore_index=True)
    runs_per_key = long.groupby(KEY, dropna=False)["arm_run"].transform("nunique")
    return long[runs_per_key == len(names)].reset_index(drop=True)


def contrast(long: "pd.DataFrame", a_runs: list[str], b_runs: list[str], col: str,
             n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> dict[str, Any]:
    """Mean of `col` over the b runs vs over the a runs, on the keys every listed run has a value for.

    Returns n (matched requests), sessions, a, b (means, ms), diff_ms (b - a), delta_pct, lo, hi.
    """
    wide = long.pivot_table(index=KEY, columns="arm_run", values=col, aggfunc="first")
    runs = list(a_runs) + list(b_runs)
    wide = wide.reindex(columns=runs).dropna()
    sess = root_sessions(wide.index.get_level_values("conversation_id"))
    a = np.concatenate([wide[r].to_numpy(float) for r in a_runs]) if len(wide) else np.array([])
    b = np.concatenate([wide[r].to_numpy(float) for r in b_runs]) if len(wide) else np.array([])
    if len(a) == 0:
        nan = float("nan")
        return {"n": 0, "sessions": 0, "a": nan, "b": nan, "diff_ms": nan, "delta_pct": nan, "lo": nan, "hi": nan}
    # Stacked copies of one request share its session, so a bootstrap draw weights them together.
    d = stats.paired_ratio_bootstrap(a, b, np.tile(sess, len(a_runs)), n_boot, seed)
    return {"n": len(wide), "sessions": d.sessions, "a": d.a, "b": d.b, "diff_ms": d.b - d.a,
            "delta_pct": d.pct, "lo": d.lo, "hi": d.hi}


def _runs(placement: "pd.DataFrame", **where) -> list[str]:
    sel = placement
    for k, v in where.items():
        sel = sel[sel[k] == v]
    return list(sel.sort_values(["group", "arm"])["name"])


EFFECTS = [
    # key, label, a side, b side (filters on the placement frame)
    ("kernel", "kernel: on vs off, both groups pooled", {"arm": "off"}, {"arm": "on"}),
    ("gpu", "GPU set: B vs A, both arms pooled (A/A)", {"gpu_set": "A"}, {"gpu_set": "B"}),
    ("orientation", "orientation: swapped vs first pairing (drift + kernel x GPU)", {"swapped": False},
     {"swapped": True}),
]


def effects(long: "pd.DataFrame", placement: "pd.DataFrame", metrics: list[str] | None = None,
            n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> "pd.DataFrame":
    """effect | label | metric | n | sessions | a | b | diff_ms | delta_pct | lo | hi for each EFFECTS entry."""
    import pandas as pd

    rows = []
    for col in metrics or [c for c, _ in MATCHED_METRICS]:
        for key, label, a_sel, b_sel in EFFECTS:
            a_runs, b_runs = _runs(placement, **a_sel), _runs(placement, **b_sel)
            if len(a_runs) != len(b_runs) or not a_runs:
                continue   # an unbalanced split would weigh one side's cells more than the other's
            rows.append({"effect": key, "label": label, "metric": col,
                         **contrast(long, a_runs, b_runs, col, n_boot, seed)})
    return pd.DataFrame(rows)


def group_deltas(long: "pd.DataFrame", placement: "pd.DataFrame", col: str = "tpot_ms",
                 n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> "pd.DataFrame":
    """Per group: group | off run | off set | on run | on set | n | sessions | a | b | diff_ms | delta_pct | lo | hi.

    Each is the kernel delta of two arm runs that ran at the same time, on different GPU sets: in a
    2x2 it is kernel + GPU effect in the first group and kernel - GPU effect in the swapped one.
    """
    import pandas as pd

    rows = []
    for g, members in placement.groupby("group", sort=True):
        off = members[members["arm"] == "off"].iloc[0]
        on = members[members["arm"] == "on"].iloc[0]
        rows.append({"group": int(g), "off_run": off["name"], "off_set": off["gpu_set"], "on_run": on["name"],
                     "on_set": on["gpu_set"], **contrast(long, [off["name"]], [on["name"]], col, n_boot, seed)})
    return pd.DataFrame(rows)


def gpu_facts(manifest: dict[str, Any], placement: "pd.DataFrame") -> "pd.DataFrame":
    """gpu_set | host | index | name | uuid | clocks... per GPU of each set, from manifest hosts.<host>.gpus.

    nvidia-smi's index is matched to the recipe's GPU id; the two agree unless CUDA_DEVICE_ORDER
    reorders devices, which only differs on hosts with mixed GPU models.
    """
    import pandas as pd

    hosts = manifest.get("hosts") or {}
    rows = []
    for (gpu_set, host, gpus), _ in placement.groupby(["gpu_set", "host", "gpus"], sort=True):
        entry = hosts.get(host)
        facts = (entry.get("gpus") or []) if isinstance(entry, dict) else []
        by_index = {str(f.get("index")): f for f in facts if isinstance(f, dict)}
        for i in gpus:
            f = by_index.get(str(i), {})
            rows.append({"gpu_set": gpu_set, "host": host, "index": i,
                         **{k: f.get(k, "unknown") for k in GPU_FACT_FIELDS}})
    return pd.DataFrame(rows, columns=["gpu_set", "host", "index", *GPU_FACT_FIELDS])


# ---------------------------------------------------------------- report section

def set_label(placement: "pd.DataFrame", gpu_set: str) -> str:
    r = placement[placement["gpu_set"] == gpu_set].iloc[0]
    gpus = f"GPU {','.join(map(str, r['gpus']))}" if r["gpus"] else f"no GPU binding, port {r['port']}"
    return f"{gpu_set} ({r['host']}, {gpus})"


def pairing_line(placement: "pd.DataFrame") -> str:
    """Which GPU set each arm run used, group by group."""
    parts = []
    for g, members in placement.groupby("group", sort=True):
        runs = ", ".join(f"{r.name} on {r.gpu_set}" for r in members.sort_values("arm").itertuples())
        parts.append(f"group {g + 1}{' (swapped)' if members['swapped'].any() else ''}: {runs}")
    return "Pairing (each group's two arm runs ran at the same time): " + "; ".join(parts) + "."


def _ci(lo: float, hi: float) -> str:
    if np.isfinite(lo) and np.isfinite(hi):
        return f"[{lo:+.1f}%, {hi:+.1f}%]"
    return f"no CI (< {stats.MIN_SESSIONS} sessions)"


def placement_md(run: "Run", n_boot: int = stats.N_BOOT, seed: int = stats.SEED) -> list[str]:
    """Markdown for "Placement: concurrent with swap", or [] when the run is not concurrent with a swap."""
    if not is_concurrent(run.manifest):
        return []
    try:
        placement = placement_frame(run.manifest)
    except ValueError as e:
        return [f"Concurrent run, but the arm runs cannot be placed: {e}."]
    if not has_swap(placement):
        return []
    loaded = {r.name: r.records for r in run.arm_runs}
    absent = [n for n in placement["name"] if n not in loaded]
    if absent:
        return [pairing_line(placement), "",
                f"No 2x2 decomposition: arm run(s) {', '.join(absent)} have no aiperf export."]
    long = matched_cells(loaded, placement)
    labels = dict(MATCHED_METRICS)
    lines = [pairing_line(placement), "",
             f"GPU sets: {set_label(placement, 'A')}; {set_label(placement, 'B')}. "
             f"Requests completed in all {len(placement)} arm runs: {long[KEY].drop_duplicates().shape[0]} "
             f"(from {len(set(root_sessions(long['conversation_id'])))} sessions); every estimate below uses only "
             "these, "
             "as a ratio of means (delta % of the second side over the first), with a session bootstrap CI.", ""]
    if long.empty:
        return lines + ["No request completed in every arm run: no decomposition."]
    eff = effects(long, placement, n_boot=n_boot, seed=seed)
    lines += ["| effect | metric | n | first side mean (ms) | second side mean (ms) | estimate | 95% CI |",
              "|---|---|---|---|---|---|---|"]
    for r in eff.itertuples():
        lines.append(f"| {r.label} | {labels[r.metric]} | {r.n} | {fmt(r.a)} | {fmt(r.b)} | "
                     f"{r.delta_pct:+.1f}% ({r.diff_ms:+.3g} ms) | {_ci(r.lo, r.hi)} |")
    lines += ["", "The kernel effect pools both groups, so the GPU sets' difference cancels; the GPU effect "
              "compares the sets with each arm on both (an A/A check of the GPUs: its CI should include 0). "
              "With four cells the orientation contrast cannot tell drift between the groups from a kernel x "
              "GPU interaction, and a kernel effect that drifts between the groups shows up in the GPU effect. "
              "The A/A noise floor in the tables above compares each arm's two runs, which ran on different "
              "GPU sets at different times: it holds the GPU effect and the drift, not only run-to-run noise.",
              "", "Per group, decode time per token (each group's arms ran at the same time on different GPU "
              "sets, so each delta is the kernel effect plus or minus the GPU effect):", "",
              "| group | off ran on | on ran on | n | off mean (ms) | on mean (ms) | kernel delta [95% CI] |",
              "|---|---|---|---|---|---|---|"]
    for r in group_deltas(long, placement, n_boot=n_boot, seed=seed).itertuples():
        lines.append(f"| {r.group + 1} ({r.off_run} / {r.on_run}) | {r.off_set} | {r.on_set} | {r.n} | "
                     f"{fmt(r.a)} | {fmt(r.b)} | {r.delta_pct:+.1f}% {_ci(r.lo, r.hi)} |")
    facts = gpu_facts(run.manifest, placement)
    lines += ["", "GPU facts per set (nvidia-smi at the start of the run):", ""]
    if facts.empty:
        return lines + ["No GPU binding in this run (CPU host): the sets are the two servers' ports."]
    lines += ["| set | host | GPU | name | SM clock / max | memory clock | memory | driver | uuid |",
              "|---|---|---|---|---|---|---|---|---|"]
    for f in facts.to_dict("records"):
        lines.append(f"| {f['gpu_set']} | {f['host']} | {f['index']} | {f['name']} | {f['clocks.sm']} / "
                     f"{f['clocks.max.sm']} | {f['clocks.mem']} | {f['memory.total']} | {f['driver_version']} | "
                     f"{f['uuid']} |")
    return lines
