"""`pipeline sweep`: run every point of a sweep as an ordinary run, one after another, then the sweep report.

Each point is its own run dir under SWEEP_DIR/runs/<point>, made and resumed exactly as `pipeline run` does,
so a point's stages survive a crash like any run's. sweep.json holds the expanded point recipes (a resume
runs what was recorded, not what the sweep file says now) and each point's status. `--resume` skips points
whose run finished, resumes points whose run started, and starts the rest. Given the sweep file too, a resume
first re-plans from it the points that have not finished (a failed point's fix), and adds its new points.
"""
from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from pipeline import dirlock
from pipeline.io import read_json, write_json_atomic, write_json_exclusive, write_text_atomic
from pipeline.manifest import now
from pipeline.paths import RunPaths, SweepPaths

if TYPE_CHECKING:
    from pipeline.config.recipe import Recipe


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] sweep     {msg}", flush=True)


def create_sweep(sweep_file: str, out: str | None) -> Path:
    from pipeline.launch import load_checked_sweep

    spec, recipes = load_checked_sweep(sweep_file)
    root = Path(out) if out else Path(spec.output_dir) / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    paths = SweepPaths(root)
    if root.exists() and not root.is_dir():
        raise SystemExit(f"error: --out: {root} is a file, not a folder; give a sweep dir that does not exist yet "
                         f"or is empty")
    if root.exists() and any(root.iterdir()):
        raise SystemExit(f"error: --out: sweep dir {root} already exists and is not empty; use "
                         f"`pipeline sweep --resume {root}` to finish it, or another --out")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file on the way (--out FILE/sub), no permission, ...
        raise SystemExit(f"error: --out: cannot make sweep dir {root}: {e.strerror or e}") from None
    write_json_exclusive(paths.manifest, {
        "name": spec.name, "sweep_file": str(sweep_file), "spec": spec.model_dump(mode="json"),
        "created": now(), "finished": None,
        "points": {p: _new_point(paths, p, r) for p, r in recipes.items()}})
    return root


def _new_point(paths: SweepPaths, point: str, recipe: dict) -> dict:
    """A point's sweep.json entry before it runs; its run dir relative to the sweep dir (point_run_dir)."""
    return {"status": "pending", "recipe": recipe, "run_dir": str(paths.run_dir(point).relative_to(paths.root))}


def point_run_dir(root: Path, point: str, entry: dict) -> Path:
    """A point's run dir: sweep.json records it relative to the sweep dir, so a resume from another cwd, or of a
    moved sweep dir, finds it."""
    rd = Path(entry["run_dir"])
    if rd.is_absolute():
        return rd
    if len(rd.parts) > 2 and rd.parts[-2:] == ("runs", point):
        return root / "runs" / point  # an older sweep.json: relative to the cwd it was made in, not the sweep dir
    return root / rd


def replan_sweep(root: Path, sweep_file: str) -> None:
    """Take an edited sweep file's recipe for every point of the sweep in `root` that has not finished, and add
    its new points; an unfinished point whose recipe changed starts a new run, its earlier one kept under
    superseded/. Finished points keep their runs: a file that changes one, or drops a point, is refused (a
    sweep's points must come from one plan), before anything is changed."""
    from pipeline.launch import load_checked_sweep

    spec, recipes = load_checked_sweep(sweep_file)
    paths = SweepPaths(root)
    doc = read_json(paths.manifest)
    dropped = [p for p in doc["points"] if p not in recipes]
    if dropped:
        raise SystemExit(f"error: {sweep_file}: points {', '.join(dropped)} of {root} are not in it; a re-plan may "
                         f"change unfinished points and add new ones, not drop points")
    state = {p: _point_state(point_run_dir(root, p, e)) for p, e in doc["points"].items()}
    changed_done = [p for p, e in doc["points"].items() if state[p] == "done" and e["recipe"] != recipes[p]]
    if changed_done:
        raise SystemExit(f"error: {sweep_file}: it changes points {', '.join(changed_done)}, which finished in "
                         f"{root}; a re-plan changes only unfinished points. To run one again, move its run dir "
                         f"({paths.run_dir(changed_done[0])}) out of the sweep, or start a new sweep")
    for point, recipe in recipes.items():
        entry = doc["points"].get(point)
        if entry is None:
            doc["points"][point] = _new_point(paths, point, recipe)
            progress(f"{point}: new point from {sweep_file}")
            continue
        if entry["recipe"] == recipe:
            continue
        run_dir = point_run_dir(root, point, entry)
        note = ""
        if run_dir.exists():  # its stages ran under the old recipe: none of them can stand for the new one
            attempt = 1 + len(entry.get("superseded", []))
            aside = paths.superseded(point, attempt)
            aside.parent.mkdir(parents=True, exist_ok=True)
            run_dir.rename(aside)
            entry.setdefault("superseded", []).append({
                "attempt": attempt, "at": now(), "status": entry["status"], "error": entry.get("error"),
                "run_dir": str(aside.relative_to(root))})
            note = f"; its earlier run is kept in {aside}"
        entry.update(recipe=recipe, status="pending", error=None)
        progress(f"{point}: re-planned from {sweep_file}{note}")
    doc.update(spec=spec.model_dump(mode="json"), sweep_file=str(sweep_file), name=spec.name)
    write_json_atomic(paths.manifest, doc)


def _point_state(run_dir: Path) -> str:
    """missing (no run yet) | unfinished (a manifest, not finished) | done."""
    m = RunPaths(run_dir).manifest
    if not m.is_file():
        return "missing"
    return "done" if read_json(m).get("finished") else "unfinished"


def _run_point(point: str, entry: dict, root: Path) -> None:
    from pipeline.launch import run_recipe

    run_dir = point_run_dir(root, point, entry)
    state = _point_state(run_dir)
    if state == "done":
        progress(f"{point}: finished before (resume): skipped")
        return
    if state == "unfinished":
        progress(f"{point}: resuming {run_dir}")
        run_recipe(None, resume=str(run_dir))
        return
    recipe_file = root / "recipes" / f"{point}.yaml"  # what `pipeline run` reads, kept for a reader
    recipe_file.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(recipe_file, yaml.safe_dump(entry["recipe"], sort_keys=False))
    if run_dir.exists() and not any(run_dir.iterdir()):
        run_dir.rmdir()  # killed before its manifest: nothing of it is worth keeping
    progress(f"{point}: new run {run_dir}")
    run_recipe(str(recipe_file), out=str(run_dir))


def _error_text(e: BaseException) -> str:
    if isinstance(e, SystemExit):  # run_recipe's refusals (a run dir taken by something else): one line each
        return e.code.removeprefix("error: ") if isinstance(e.code, str) else f"exited with status {e.code}"
    return f"{type(e).__name__}: {e}"


def execute_sweep(root: Path, replan_from: str | None = None, resuming: bool = False) -> int:
    """Run the points not yet finished, one after another (first re-planned from the sweep file `replan_from`,
    if given); a failed point is recorded and the rest go on. Ctrl-C or SIGTERM writes the report of the points
    finished so far, then raises KeyboardInterrupt. Returns 1 if a point failed or could not be analysed, else 0."""
    def on_term(signum, frame):  # as within a run (runner.execute), so that SIGTERM between points unwinds too
        raise KeyboardInterrupt(signal.Signals(signum).name)

    # two sweeps in one dir would run its points twice, into the same run dirs
    with dirlock.exclusive(root, lambda e: f"error: sweep dir {e}; wait for it to finish or stop it, then resume"):
        progress(f"sweep dir: {root} ({'resuming' if resuming else 'new'})")  # only once the dir is ours
        if replan_from:
            replan_sweep(root, replan_from)
        previous = signal.signal(signal.SIGTERM, on_term)
        try:
            return _execute_sweep(root)
        finally:
            signal.signal(signal.SIGTERM, previous)


def _execute_sweep(root: Path) -> int:
    paths = SweepPaths(root)
    doc = read_json(paths.manifest)
    failed = []
    for point, entry in doc["points"].items():
        entry["status"] = "running"
        write_json_atomic(paths.manifest, doc)
        try:
            _run_point(point, entry, root)
            entry["status"], entry["error"] = "done", None
        except KeyboardInterrupt:
            entry["status"] = "interrupted"
            write_json_atomic(paths.manifest, doc)
            progress(f"{point}: interrupted; writing the report of the points finished so far")
            try:
                progress(f"report: {write_sweep_report(root)[0]}")
            except Exception as e:  # the interrupt is what the user must see; a resume writes the report again
                progress(f"no report: {type(e).__name__}: {e}")
            raise
        except (Exception, SystemExit) as e:  # one point's failure must not lose the others; its run dir says more
            entry["status"], entry["error"] = "failed", _error_text(e)[:2000]
            failed.append(point)
            progress(f"{point}: failed: {entry['error'][:300]}")
        write_json_atomic(paths.manifest, doc)
    doc["finished"] = now() if not failed else None
    write_json_atomic(paths.manifest, doc)
    report, unanalysed = write_sweep_report(root)
    progress(f"report: {report}")
    for point, why in unanalysed.items():
        progress(f"{point}: analysis failed, left out of the summary and plot: {why}")
    if failed:
        progress(f"{len(failed)} point(s) failed: {', '.join(failed)}; rerun them with "
                 f"`pipeline sweep --resume {root}`, or, after fixing the sweep file, "
                 f"`pipeline sweep SWEEP_FILE --resume {root}`")
    return 1 if failed or unanalysed else 0


def point_gpus(recipe: "Recipe", gpus_per_server: int | None) -> tuple[int, str]:
    """GPUs one server of a point spans, which divide its output throughput into per-GPU figures, and what sets
    that count.

    A real engine spans the GPUs placement gives it (placement.gpus_per_arm, which a server preset may set), else
    those its flags ask for (sglang's --tp-size, vllm's --tensor-parallel-size, each times pipeline parallelism).
    The emulator stands for the server its flags describe (tp_size, which its model preset sets), whatever GPUs
    placement lends it. The sweep file's gpus_per_server, where set, overrides the flags, not a real engine's
    placement."""
    from pipeline.config.arms import arm_server_args
    from pipeline.engines import get_engine

    engine = get_engine(recipe.engine)
    if recipe.placement.gpus_per_arm and not engine.emulated:
        return recipe.placement.gpus_per_arm, "placement.gpus_per_arm"
    if gpus_per_server:
        return gpus_per_server, "gpus_per_server of the sweep file"
    return engine.gpus(arm_server_args(recipe.server, recipe.arms["on"]))


def write_sweep_report(root: Path) -> tuple[Path, dict[str, str]]:
    """sweep_report.md, sweep_summary.csv and the plot, of the points finished so far. Returns the report and
    {point: why it could not be analysed} of finished points left out of the CSV and plot (the report says so)."""
    from analysis.sweep import md_cell, pareto_plot, summary_frame, sweep_report_md
    from pipeline.config.sweep import check_point, line_axis, point_labels

    paths = SweepPaths(root)
    doc = read_json(paths.manifest)
    run_dirs = {p: point_run_dir(root, p, e) for p, e in doc["points"].items()}
    status = {p: _point_state(run_dirs[p]) for p in doc["points"]}
    for p, e in doc["points"].items():  # why a point did not finish: its error, short (the run dir has all)
        if status[p] != "done" and e.get("status") == "failed":
            status[p] = "failed: " + md_cell(e.get("error") or "", 160)
    gpus, unanalysed = {}, {}
    for p, e in doc["points"].items():
        try:
            gpus[p] = point_gpus(check_point(p, e["recipe"]), doc["spec"].get("gpus_per_server"))
        except ValueError as err:  # a recorded recipe this version refuses, a TP flag that is not a number
            unanalysed[p] = f"its GPU count: {' '.join(str(err).split())}"
    labels = point_labels(doc["spec"].get("matrix"))  # a matrix's {axis: value}: columns of the CSV
    done = [{"point": p, "run_dir": run_dirs[p], "gpus": gpus[p][0], "labels": labels.get(p, {})}
            for p in doc["points"] if status[p] == "done" and p in gpus]
    df, failed = summary_frame(done, root)
    unanalysed = {p: why for p, why in {**unanalysed, **failed}.items() if status[p] == "done"}
    for p, why in unanalysed.items():
        status[p] = "analysis failed: " + md_cell(why, 160)
    png = None
    if not df.empty:
        paths.summary_csv.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(paths.summary_csv, index=False)
        png = pareto_plot(df, paths.pareto_png, list(doc["spec"].get("matrix") or {}),
                          line_axis(doc["spec"].get("matrix")))
    write_text_atomic(paths.report, sweep_report_md(doc["name"], df, status, paths.root, png,
                                                    {p: d for p, d in run_dirs.items() if d.is_dir()}, gpus))
    return paths.report, unanalysed
