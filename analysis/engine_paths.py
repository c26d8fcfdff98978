"""What served each attention call of an sglang run, per arm run, from its server log.

The vattn backend wraps sglang's production attention backend (the base) and logs cumulative path
counters per scheduler process (`vattn paths: {...}`, vattn/sglang/counters.py). This module reads
arms/<arm run>/server.log and gives, per arm run: the vattn and base forward counts by mode (the last
line of each scheduler, summed), the base backend's name, the share of target-verify forwards
vattn served, and which CUDA graphs sglang captured ("Capture <phase> CUDA graph end").

The issue's bar: an arm run whose server env turns vattn on (VATTN, read as vattn/switch.py reads it) has vattn serve
>= 99% of its verify forwards; an arm that leaves it off, none at all. Both arms may turn it on (an A/B of
two vattn modes, such as the lossy VATTN_QK). Both are checked here from the counts, so the report says it
in one line per arm run.

Emulator and vLLM runs have no such log lines and get no section.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from vattn import switch
from vattn.sglang.counters import MODES, parse_log

if TYPE_CHECKING:
    import pandas as pd

    from analysis.rundir import Run

ON_SHARE = 0.99  # issue 17: vattn must serve at least this share of the on arm's verify forwards
_BASE_LINE = re.compile(r"vattn base: (\S+) \(([^)]*)\)")
_GRAPH_END = re.compile(r"Capture (.+?) CUDA graph end")


def log_paths(text: str) -> dict:
    """One server log -> {"vattn": {mode: n}, "base": {mode: n}, "base_backend", "base_source",
    "processes", "graphs": [phase, ...], "verify_share"}.

    `base_backend` comes from the counters (what the wrapper built); the `vattn base: X (source)`
    line names it too, and says whether it came from --vattn-base or sglang's default rule."""
    counts = parse_log(text)
    named = _BASE_LINE.findall(text)
    base = counts["base_backend"] or (named[-1][0] if named else None)
    graphs = list(dict.fromkeys(m.strip() for m in _GRAPH_END.findall(text)))
    return {**counts, "base_backend": base, "base_source": named[-1][1] if named else None,
            "graphs": graphs, "verify_share": verify_share(counts)}


def verify_share(counts: dict) -> float:
    """vattn's share of target-verify forwards; NaN when there were none."""
    v, b = counts["vattn"]["target_verify"], counts["base"]["target_verify"]
    return v / (v + b) if v + b else math.nan


def expects_vattn(manifest: dict, arm_run: str, arm: str) -> bool | None:
    """Whether the server env the plan gave `arm_run` (manifest plan.arm_runs[].env) turns vattn on; where the
    manifest has no such env, the arm's name decides (`on` yes, `off` no, others None)."""
    runs = (manifest.get("plan") or {}).get("arm_runs") or []
    env = next((r.get("env") for r in runs if isinstance(r, dict) and r.get("name") == arm_run), None)
    if not isinstance(env, dict):
        return {"on": True, "off": False}.get(arm)
    try:
        return switch.enabled(env)
    except ValueError:  # an env that did not validate: no bar to hold it to
        return None


def check(expect_vattn: bool | None, paths: dict) -> str:
    """The issue's bar for an arm run: with vattn on, >= 99% of verify forwards on vattn; off, no vattn call."""
    if expect_vattn:
        share = paths["verify_share"]
        if math.isnan(share):
            return "no verify forward counted"
        return "ok" if share >= ON_SHARE else f"below {ON_SHARE:.0%}"
    if expect_vattn is False:
        served = sum(paths["vattn"].values())
        return "ok" if served == 0 else f"vattn served {served} forwards"
    return ""


def paths_frame(run: "Run") -> "pd.DataFrame":
    """One row per arm run with a server log: arm_run, arm, base_backend, base_source, graphs,
    processes, vattn_<mode>, base_<mode>, verify_share, check."""
    import pandas as pd

    rows = []
    for r in sorted(run.arm_runs, key=lambda r: (r.order, r.arm)):
        log = Path(r.paths.server_log)
        if not log.is_file():
            continue
        p = log_paths(log.read_text(errors="replace"))
        row = {"arm_run": r.name, "arm": r.arm, "base_backend": p["base_backend"], "base_source": p["base_source"],
               "graphs": ", ".join(p["graphs"]), "processes": p["processes"], "verify_share": p["verify_share"],
               "check": check(expects_vattn(run.manifest, r.name, r.arm), p)}
        for path in ("vattn", "base"):
            row.update({f"{path}_{m}": p[path][m] for m in MODES})
        rows.append(row)
    return pd.DataFrame(rows)


def _engine(run: "Run") -> str | None:
    return (run.manifest.get("recipe") or {}).get("engine") or run.manifest.get("engine")


def engine_paths_md(run: "Run") -> list[str]:
    """The report's section body; [] for runs that are not sglang or whose logs carry no counters."""
    engine = _engine(run)
    if engine not in ("sglang", None):
        return []
    frame = paths_frame(run)
    if frame.empty or (engine is None and not frame["processes"].any()):
        return []
    modes = [m for m in MODES if frame[[f"vattn_{m}", f"base_{m}"]].to_numpy().any()] or ["target_verify"]
    head = ["arm run", "base backend", "CUDA graphs captured", *[f"{m} vattn / base" for m in modes],
            "verify on vattn", "check"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in frame.itertuples():
        base = f"{r.base_backend} ({r.base_source})" if r.base_source else (r.base_backend or "not logged")
        cells = [r.arm_run, base, r.graphs or "none logged",
                 *[f"{getattr(r, 'vattn_' + m)} / {getattr(r, 'base_' + m)}" for m in modes],
                 "n/a" if math.isnan(r.verify_share) else f"{r.verify_share:.1%}", r.check or "-"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    missing = [r.name for r in run.arm_runs if not Path(r.paths.server_log).is_file()]
    lines += ["", "Forwards counted by the vattn wrapper, per scheduler process, from the last `vattn paths:` "
              "line of each in the arm's server.log (cumulative; published every VATTN_COUNTERS_INTERVAL s "
              "and at exit). A CUDA-graph replay counts as the path its capture recorded. check: an arm whose env "
              f"turns vattn on needs >= {ON_SHARE:.0%} of target-verify forwards on vattn, one that leaves it off no "
              "vattn forward."]
    if missing:
        lines.append(f"No server.log for: {', '.join(missing)}.")
    return lines


def section_md(run: "Run") -> list[str]:
    """The whole report section, heading included; [] where engine_paths_md has nothing."""
    body = engine_paths_md(run)
    return ["## What served each attention call (sglang)", "", *body, ""] if body else []
