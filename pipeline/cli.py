"""`pipeline`: validate / plan / run a kernel A/B, report on it, or evaluate accuracy alone.

Heavy imports (pandas, torch, fabric, aiperf) happen inside the command that needs them, so `--help` is
instant.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _load(path: str):
    from pipeline.config.recipe import load_recipe

    return load_recipe(path)


def _run_dir_taken(run_dir: Path, why: str) -> SystemExit:
    return SystemExit(f"error: --out: run dir {run_dir} {why}; a run never overwrites or shares another's dir. "
                      f"Use `pipeline run --resume {run_dir}` to finish that run, or another --out")


def _new_run_dir(recipe, out: str | None) -> Path:
    """A fast first check; the atomic claim is the exclusive write of the manifest (Manifest.create)."""
    run_dir = Path(out) if out else Path(recipe.output_dir) / f"{recipe.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if run_dir.exists() and any(run_dir.iterdir()):
        raise _run_dir_taken(run_dir, "already exists and is not empty")
    return run_dir


def _load_commands(recipe, plan) -> dict[str, list[str]]:
    from pipeline.paths import RunPaths
    from pipeline.stages.load import aiperf_command

    paths = RunPaths(Path(plan.run_dir))
    return {a.name: aiperf_command(recipe.load, url=a.url, model=recipe.model, tokenizer=recipe.tokenizer,
                                   artifact_dir=paths.arm(a.name).aiperf_dir) for a in plan.arm_runs}


def cmd_validate(args) -> int:
    from pipeline.plan import env_diff

    recipe = _load(args.recipe)
    print(f"{args.recipe}: ok ({recipe.engine}, {recipe.placement.mode}; arms differ in "
          f"{', '.join(env_diff(recipe))})")
    return 0


def cmd_plan(args) -> int:
    from pipeline.plan import build_plan, format_plan

    recipe = _load(args.recipe)
    run_dir = Path(args.out) if args.out else Path(recipe.output_dir) / f"{recipe.name}-<timestamp>"
    plan = build_plan(recipe, run_dir, run_id="<run-id>")  # the id exists once `pipeline run` creates the dir
    print(format_plan(plan, recipe, _load_commands(recipe, plan)))
    return 0


def _resume(run_dir: Path, recipe_path: str | None):
    from pipeline.config.recipe import Recipe, recipe_to_dict
    from pipeline.manifest import Manifest
    from pipeline.paths import RunPaths

    paths = RunPaths(run_dir)
    if not paths.manifest.is_file():
        raise SystemExit(f"error: --resume: {run_dir} has no manifest.json; not a run directory")
    manifest = Manifest.load(paths.manifest)
    recipe = Recipe.model_validate(manifest.data["recipe"])
    if recipe_path and recipe_to_dict(_load(recipe_path)) != manifest.data["recipe"]:
        raise SystemExit(f"error: {recipe_path} differs from the recipe recorded in {paths.manifest}; "
                         f"resume runs the recorded recipe: drop the recipe argument or start a new run")
    return recipe, manifest


def cmd_run(args) -> int:
    from pipeline.config.recipe import recipe_to_dict
    from pipeline.manifest import Manifest, new_run_id, now
    from pipeline.paths import RunPaths
    from pipeline.plan import build_plan
    from pipeline.runner import check_matched_gpus, execute, host_facts, make_hosts

    if args.resume:
        recipe, manifest = _resume(Path(args.resume), args.recipe)
        run_dir, run_id = Path(args.resume), manifest.data.get("run_id")
    elif args.recipe:
        recipe = _load(args.recipe)
        run_dir = _new_run_dir(recipe, args.out)
        created = now()
        run_id = new_run_id(run_dir, created)
    else:
        raise SystemExit("error: give a recipe (pipeline run recipe.yaml) or --resume RUN_DIR")
    plan = build_plan(recipe, run_dir, run_id)
    hosts = make_hosts(recipe)
    if not args.resume:
        facts = host_facts(recipe, hosts)
        check_matched_gpus(plan, facts)
        try:
            manifest = Manifest.create(RunPaths(run_dir).manifest, recipe=recipe_to_dict(recipe),
                                       recipe_path=str(args.recipe), plan=plan.to_dict(), hosts=facts,
                                       run_id=run_id, created=created)
        except FileExistsError:  # another run claimed the dir after the first check
            raise _run_dir_taken(run_dir, "was claimed by another `pipeline run` started at the same time") from None
    print(f"run dir: {run_dir}  ({'resuming' if args.resume else 'new'}; "
          f"{len(plan.arm_runs)} arm runs, stages {' -> '.join(plan.stages)})", flush=True)
    execute(recipe, plan, manifest, hosts)
    return _report(run_dir)


def _report(run_dir: Path) -> int:
    from analysis.report import write_report

    path = write_report(run_dir)
    verdict = next((line for line in path.read_text().splitlines() if line.startswith("**Verdict:**")), "")
    print(f"report: {path}\n{verdict}")
    return 0


def cmd_report(args) -> int:
    from analysis.report import cli_report

    return cli_report(args.run_dirs, args.out, args.arms)


def cmd_eval(args) -> int:
    from pipeline.accuracy.cli import run_eval

    return run_eval(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipeline", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="check a recipe and exit")
    v.add_argument("recipe")
    v.set_defaults(func=cmd_validate)

    pl = sub.add_parser("plan", help="print the resolved plan (arms, order, hosts, GPUs, ports, commands); "
                                     "launch nothing")
    pl.add_argument("recipe")
    pl.add_argument("--out", help="run dir to show in paths")
    pl.set_defaults(func=cmd_plan)

    r = sub.add_parser("run", help="run the A/B and write a run dir and report")
    r.add_argument("recipe", nargs="?", help="recipe.yaml (omit with --resume)")
    r.add_argument("--out", help="run dir (default: <output_dir>/<name>-<timestamp>); never overwritten")
    r.add_argument("--resume", metavar="RUN_DIR", help="finish an interrupted run: redo only unfinished stages")
    r.set_defaults(func=cmd_run)

    rep = sub.add_parser("report", help="write report.md for a run dir, or compare two runs' arms")
    rep.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="one run dir, or two to compare")
    rep.add_argument("--out", help="report file (default RUN_DIR/report.md)")
    rep.add_argument("--arms", nargs=2, metavar=("A_ARM", "B_ARM"), help="arms compared across two runs "
                                                                        "(default: on on)")
    rep.set_defaults(func=cmd_report)

    e = sub.add_parser("eval", help="accuracy evaluation alone against any OpenAI-compatible endpoint")
    from pipeline.accuracy.cli import add_eval_arguments

    add_eval_arguments(e)
    e.set_defaults(func=cmd_eval)
    return p


def main(argv: list[str] | None = None) -> int:
    from pipeline.config.base import RecipeError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"interrupted ({e}); finished stages are kept: pipeline run --resume RUN_DIR", file=sys.stderr)
        return 130
    except Exception as e:  # a user-facing one-line error; the traceback helps nobody here
        from pipeline.hosts import HostError
        from pipeline.runner import RunError
        from pipeline.stages.server import ServerError

        if isinstance(e, (HostError, RunError, ServerError, ValueError, FileNotFoundError)):
            print(f"error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
