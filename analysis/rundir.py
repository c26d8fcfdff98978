"""A run directory as the analysis sees it: the manifest plus one `ArmRun` per arm-run folder.

Arm runs are named "off", "on", and "off.2", "on.2" ... for repeats (ABBA);
the manifest's `arm_runs` list says which arm each folder belongs to, and the
folder name is the fallback. The manifest is read defensively: the report of a
half-written run should still say what it can.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.load import (AnalysisError, add_match_key, logged_cancellations, outcome_counts, profiling_only,
                           read_jsonl, read_phase_window, records_frame, server_metrics_frame, window_seconds)
from pipeline import dirlock
from pipeline.paths import ArmPaths, RunPaths, SweepPaths

if TYPE_CHECKING:
    import pandas as pd



@dataclass
class ArmRun:
    name: str                      # folder name: "off", "on.2"
    arm: str                       # "off" / "on"
    order: int                     # 1 for the first run of the arm, 2 for its repeat
    paths: ArmPaths
    records: "pd.DataFrame"        # profiling phase only, with match key; errors kept (ok=False)
    counts: dict[str, int]         # outcome_counts of `records`
    window_s: float                # measured window, seconds
    server: "pd.DataFrame | None" = None
    warmup_records: int = 0
    cycle_log: Path | None = None  # emulator: the log of the server lifetime that served the load stage
    cycle_log_note: str = ""       # said in the report when the choice among lifetimes needs saying
    phase_window_ns: tuple[int, int] | None = None   # aiperf's profiling phase, when it recorded one


@dataclass
class Run:
    root: Path
    manifest: dict[str, Any]
    arm_runs: list[ArmRun]
    notes: list[str] = field(default_factory=list)   # skipped repeats etc., shown in the report

    def runs_of(self, arm: str) -> list[ArmRun]:
        return sorted((r for r in self.arm_runs if r.arm == arm), key=lambda r: r.order)

    @property
    def arms(self) -> list[str]:
        return list(dict.fromkeys(r.arm for r in sorted(self.arm_runs, key=lambda r: r.order)))


def _stage_entry(manifest: dict[str, Any], arm_run: str, stage: str) -> dict[str, Any]:
    """What the manifest records of one arm run's stage ({} where nothing is)."""
    return ((manifest.get("stages") or {}).get(arm_run) or {}).get(stage) or {}


def read_manifest(root: Path) -> dict[str, Any]:
    paths = RunPaths(Path(root))
    if paths.root.is_file():
        raise AnalysisError(f"run dir {root}: a file, not a run directory (the folder `pipeline run` wrote)")
    if not paths.root.is_dir():
        raise AnalysisError(f"run dir {root}: no such directory")
    if not paths.manifest.is_file() and not paths.arms_dir.is_dir():
        sweep = SweepPaths(Path(root))
        if sweep.manifest.is_file():
            raise AnalysisError(f"{root} is a sweep dir: its report is {sweep.report} (`pipeline sweep --resume "
                                f"{root}` writes it again); `pipeline report {sweep.run_dir('POINT')}` reports one "
                                f"point")
        raise AnalysisError(f"{root} is not a run directory (no manifest.json and no arms/); "
                            "pass the folder that `pipeline run` wrote")
    if not paths.manifest.is_file():
        return {}
    try:
        doc = json.loads(paths.manifest.read_text())
    except ValueError as e:
        raise AnalysisError(f"{paths.manifest}: not valid JSON ({e}); the run did not finish writing it") from None
    return doc if isinstance(doc, dict) else {}


def arm_run_table(manifest: dict[str, Any], on_disk: list[str]) -> list[dict[str, Any]]:
    """[{name, arm, order}] from the manifest's `arm_runs`, else from folder names ("on.2" -> on, 2)."""
    listed = manifest.get("arm_runs") or (manifest.get("plan") or {}).get("arm_runs")
    if isinstance(listed, list) and listed and all(isinstance(x, dict) and "name" in x for x in listed):
        return [{"name": str(x["name"]), "arm": str(x.get("arm") or _split(x["name"])[0]),
                 "order": int(x.get("order") or x.get("round") or _split(x["name"])[1])} for x in listed]
    return [{"name": n, "arm": _split(n)[0], "order": _split(n)[1]} for n in on_disk]


def _split(name: str) -> tuple[str, int]:
    arm, _, k = str(name).partition(".")
    return arm, int(k) if k.isdigit() else 1


def expected_arms(manifest: dict[str, Any]) -> list[str]:
    """The arms the recipe declared (plan.arms or recipe.arms), defaulting to off/on."""
    for src in ((manifest.get("plan") or {}).get("arms"), (manifest.get("recipe") or {}).get("arms")):
        if isinstance(src, dict) and src:
            return [str(k) for k in src]
        if isinstance(src, list) and src:
            return [str(x.get("name") if isinstance(x, dict) else x) for x in src]
    return ["off", "on"]


def served_cycle_log(manifest: dict[str, Any], name: str, paths: ArmPaths) -> tuple[Path | None, str]:
    """The emulator cycle log of the server lifetime that served `name`'s load stage, and a note.

    The runner records that lifetime as stages.<name>.load.cycle_log_lifetime. A resumed arm run has one
    log per lifetime, and only the lifetime that ran the load matches the aiperf records beside it.
    """
    logs = paths.emulator_cycle_logs()
    if not logs:  # a run from before per-lifetime logs (or no cycle log at all)
        legacy = paths.legacy_emulator_cycles
        return (legacy if legacy.is_file() else None), ""
    recorded = _stage_entry(manifest, name, "load").get("cycle_log_lifetime")
    if recorded is not None:
        if int(recorded) not in logs:
            return None, (f"{name}: the load ran in server lifetime {recorded}, whose cycle log is missing "
                          f"(have {sorted(logs)}); left out")
        note = (f"{name}: server lifetime {recorded} of {len(logs)} (the one that ran the load)"
                if len(logs) > 1 else "")
        return logs[int(recorded)], note
    last = max(logs)
    note = (f"{name}: {len(logs)} server lifetimes and no record of which ran the load; showing the last "
            f"({last})") if len(logs) > 1 else ""
    return logs[last], note


def load_arm_run(paths: ArmPaths, name: str, arm: str, order: int) -> ArmRun:
    export = paths.profile_export
    raw = records_frame(read_jsonl(export))
    prof = profiling_only(raw)
    if prof.empty:
        raise AnalysisError(f"{export}: 0 profiling records ({len(raw)} warmup/other); the load stage "
                            "measured nothing - check aiperf.log and the benchmark duration")
    counts = outcome_counts(prof)
    logged = logged_cancellations(paths.aiperf_log)
    if logged and not counts["cancelled"]:  # an aiperf that exports no record of them: its log counts them
        counts["cancelled"] = logged
        counts["total"] += logged
    if counts["completed"] == 0:
        raise AnalysisError(f"{export}: 0 completed profiling requests ({counts['failed']} failed, "
                            f"{counts['cancelled']} cancelled); check the server log")
    server = None
    sm = paths.server_metrics_export
    if sm.is_file():
        try:
            server = server_metrics_frame(json.loads(sm.read_text()))
        except ValueError:
            server = None  # an unreadable optional export must not sink the report
    phase = read_phase_window(paths.aiperf_phase_manifest)
    return ArmRun(name=name, arm=arm, order=order, paths=paths, records=add_match_key(prof), counts=counts,
                  window_s=window_seconds(prof, phase), server=server,
                  warmup_records=int((raw["phase"] == "warmup").sum()), phase_window_ns=phase)


def check_not_in_progress(root: Path, manifest: dict[str, Any]) -> None:
    """Refuse a run that a pipeline process is working on now (it holds the dir's lock and writes the report when
    it finishes), or one that stopped without a word inside a load stage (kill -9, a lost node): that stage's
    aiperf export is partial, or holds only warm-up records."""
    running = [(name, stage) for name, stages in (manifest.get("stages") or {}).items() if isinstance(stages, dict)
               for stage, entry in stages.items() if isinstance(entry, dict) and entry.get("status") == "running"]
    if not running:
        return
    where = ", ".join(f"arm run `{name}`'s {stage} stage" for name, stage in running)
    pid = dirlock.holder(root)
    if pid is not None:
        raise AnalysisError(f"run dir {root} is still in progress: pipeline process {pid} is running {where}; it "
                            f"writes report.md when the run finishes")
    if not manifest.get("finished") and any(stage == "load" for _, stage in running):
        raise AnalysisError(f"run dir {root} is unfinished: it stopped during {where}, so that arm run's aiperf "
                            f"export is partial; finish it with `pipeline run --resume {root}`, which writes the "
                            f"report")


def load_run(root: Path) -> Run:
    """Read a run directory; each declared arm needs at least one arm run with an aiperf export."""
    root = Path(root)
    manifest = read_manifest(root)
    check_not_in_progress(root, manifest)
    paths = RunPaths(root)
    table = arm_run_table(manifest, paths.arm_runs())
    runs, notes = [], []
    for row in table:
        ap = paths.arm(row["name"])
        if not ap.profile_export.is_file():
            notes.append(f"arm run `{row['name']}`: no aiperf export at {ap.profile_export}; left out")
            continue
        runs.append(load_arm_run(ap, row["name"], row["arm"], row["order"]))
        runs[-1].cycle_log, runs[-1].cycle_log_note = served_cycle_log(manifest, row["name"], ap)
    present = {r.arm for r in runs}
    for arm in expected_arms(manifest):
        if arm not in present:
            export = paths.arm(arm).profile_export.relative_to(root)
            # a load recorded as done is one a resume would skip: say what is gone instead
            if _stage_entry(manifest, arm, "load").get("status") == "done":
                raise AnalysisError(f"run dir {root}: arm '{arm}' has no aiperf export at {export}, though its load "
                                    f"stage is recorded as done: the raw files were deleted or not copied with "
                                    f"the run dir, and the report is made from them")
            raise AnalysisError(f"run dir {root}: arm '{arm}' has no aiperf export (expected {export}); finish it "
                                f"with `pipeline run --resume {root}`")
    return Run(root=root, manifest=manifest, arm_runs=runs, notes=notes)
