"""Start or resume one run: the body of `pipeline run`, shared by `pipeline sweep` (one run per point).

A new run claims its run dir by writing the manifest exclusively; a resume runs the recipe recorded there.
"""
from __future__ import annotations

import time
from pathlib import Path

from pipeline import dirlock


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM (str: the signal's name) in a run whose dir exists: the CLI names that dir to resume."""

    def __init__(self, signal_name: str, run_dir: Path):
        super().__init__(signal_name)
        self.run_dir = run_dir


def load_checked_recipe(path: str):
    """The recipe, with its accuracy files' fields checked (pipeline.accuracy.stage.check_task_files), which the
    recipe model leaves to the stage that reads them."""
    from pipeline.accuracy.data import DataError
    from pipeline.accuracy.stage import check_task_files
    from pipeline.config.base import RecipeError
    from pipeline.config.recipe import load_recipe

    recipe = load_recipe(path)
    try:
        check_task_files(recipe.accuracy)
    except DataError as e:  # an invalid recipe like any other: its file named, exit 2
        raise RecipeError(f"{path}: invalid recipe\n{e}") from None
    return recipe


def load_checked_sweep(sweep_file: str):
    """(the sweep spec, {point: its expanded recipe}), every point validated as a recipe and its accuracy files
    checked as load_checked_recipe does: a bad point stops the sweep before its first point runs."""
    from pipeline.accuracy.data import DataError
    from pipeline.accuracy.stage import check_task_files
    from pipeline.config.base import RecipeError
    from pipeline.config.sweep import check_point, load_sweep, point_recipes

    spec = load_sweep(sweep_file)
    recipes = point_recipes(spec, Path(sweep_file))
    for point, data in recipes.items():
        try:
            check_task_files(check_point(point, data).accuracy)
        except DataError as e:  # as check_point says a point's other errors
            raise RecipeError(f"sweep point {point!r}: invalid recipe\n{e}") from None
    return spec, recipes


def _run_dir_taken(run_dir: Path, why: str) -> SystemExit:
    return SystemExit(f"error: --out: run dir {run_dir} {why}; a run never overwrites or shares another's dir. "
                      f"Use `pipeline run --resume {run_dir}` to finish that run, or another --out")


def _new_run_dir(recipe, out: str | None) -> Path:
    """A fast first check; the atomic claim is the exclusive write of the manifest (Manifest.create)."""
    from pipeline.paths import file_in_the_way

    run_dir = Path(out) if out else Path(recipe.output_dir) / f"{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if (f := file_in_the_way(run_dir)) is not None:
        raise SystemExit(f"error: {'--out' if out else 'output_dir'}: '{f}' is not a directory, so run dir "
                         f"{run_dir} cannot be made; give a folder")
    if run_dir.exists() and any(p.name != dirlock.LOCK_NAME for p in run_dir.iterdir()):
        raise _run_dir_taken(run_dir, "already exists and is not empty")
    return run_dir


def _make_run_dir(run_dir: Path, field: str) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # no permission, a file made there since _new_run_dir looked, ...
        raise SystemExit(f"error: {field}: cannot make run dir {run_dir}: {e.strerror or e}") from None


def _resume(run_dir: Path, recipe_path: str | None):
    from pipeline.config.recipe import Recipe, recipe_to_dict
    from pipeline.inputs import changed_inputs
    from pipeline.manifest import Manifest
    from pipeline.paths import RunPaths

    paths = RunPaths(run_dir)
    if not paths.manifest.is_file():
        raise SystemExit(f"error: --resume: {run_dir} has no manifest.json; not a run directory")
    manifest = Manifest.load(paths.manifest)
    recipe = Recipe.model_validate(manifest.data["recipe"])
    if recipe_path and recipe_to_dict(load_checked_recipe(recipe_path)) != manifest.data["recipe"]:
        raise SystemExit(f"error: {recipe_path} differs from the recipe recorded in {paths.manifest}; "
                         f"resume runs the recorded recipe: drop the recipe argument or start a new run")
    changed = changed_inputs(manifest.data.get("inputs") or [])
    if changed:  # the finished stages read the old files: arms on different inputs would compare nothing
        raise SystemExit("error: --resume: since the run started, " + "; ".join(changed) + ". The finished stages "
                         "read the recorded content: restore it (the manifest's inputs list each sha256), or start "
                         "a new run")
    return recipe, manifest


def run_recipe(recipe_path: str | None, *, out: str | None = None, resume: str | None = None) -> int:
    """Run `recipe_path` into `out` (default: a new timestamped dir), or finish the run in `resume`;
    write its report. Returns the exit code. The run dir is locked (pipeline.dirlock) throughout."""
    from pipeline.config.recipe import recipe_to_dict
    from pipeline.hosts import LocalHost
    from pipeline.manifest import Manifest, machine_facts, new_run_id, now
    from pipeline.paths import RunPaths
    from pipeline.plan import build_plan
    from pipeline.runner import check_matched_gpus, execute, host_facts, make_hosts

    if resume:
        run_dir = Path(resume)
        _resume(run_dir, recipe_path)  # its errors before the lock creates anything in a wrong path

        def refusal(e):
            return f"error: --resume: run dir {e}; wait for it to finish or stop it, then resume"
    elif recipe_path:
        recipe = load_checked_recipe(recipe_path)
        run_dir = _new_run_dir(recipe, out)
        created = now()
        run_id = new_run_id(run_dir, created)
        plan = build_plan(recipe, run_dir, run_id)
        hosts = make_hosts(recipe)
        facts = host_facts(recipe, hosts)  # before the lock makes the dir: a failed check leaves nothing behind
        check_matched_gpus(plan, facts)
        _make_run_dir(run_dir, "--out" if out else "output_dir")

        def refusal(e):
            return _run_dir_taken(run_dir, f"is held by another pipeline process (pid {e.pid})").code
    else:
        raise SystemExit("error: give a recipe (pipeline run recipe.yaml) or --resume RUN_DIR")
    with dirlock.exclusive(run_dir, refusal):
        if resume:
            recipe, manifest = _resume(run_dir, recipe_path)  # read again, now that no one else writes it
            plan = build_plan(recipe, run_dir, manifest.data.get("run_id"))
            hosts = make_hosts(recipe)
        else:
            try:
                manifest = Manifest.create(RunPaths(run_dir).manifest, recipe=recipe_to_dict(recipe),
                                           recipe_path=str(recipe_path), plan=plan.to_dict(), hosts=facts,
                                           run_id=run_id, created=created,
                                           controller=machine_facts(LocalHost()))  # where aiperf runs
            except FileExistsError:  # another run claimed the dir after the first check
                raise _run_dir_taken(run_dir, "was claimed by another `pipeline run` started at the same "
                                     "time") from None
        print(f"run dir: {run_dir}  ({'resuming' if resume else 'new'}; "
              f"{len(plan.arm_runs)} arm runs, stages {' -> '.join(plan.stages)})", flush=True)
        try:
            execute(recipe, plan, manifest, hosts)
            return _report(run_dir)
        except KeyboardInterrupt as e:
            raise RunInterrupted(str(e), run_dir) from None


def _report(run_dir: Path) -> int:
    from analysis.report import write_report

    path = write_report(run_dir)
    verdict = next((line for line in path.read_text().splitlines() if line.startswith("**Verdict:**")), "")
    print(f"report: {path}\n{verdict}")
    return 0


