"""`pipeline`: validate / plan / run a kernel A/B, report on it, or evaluate accuracy alone.

Heavy imports (pandas, torch, fabric, aiperf) happen inside the command that needs them, so `--help` is
instant.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path


def _interrupted(e: KeyboardInterrupt) -> tuple[str, int]:
    """The signal's name and the exit code a shell gives it (128 + its number). Ctrl-C raises a bare
    KeyboardInterrupt; the run's and the sweep's SIGTERM handlers raise one that names the signal."""
    sig = signal.Signals.__members__.get(str(e), signal.SIGINT)
    return sig.name, 128 + sig


def _load(path: str):
    from pipeline.launch import load_checked_recipe

    return load_checked_recipe(path)


def _load_commands(recipe, plan) -> dict[str, list[str]]:
    from pipeline.paths import RunPaths
    from pipeline.stages.load import aiperf_command

    paths = RunPaths(Path(plan.run_dir))
    return {a.name: aiperf_command(recipe.load, url=a.url, model=recipe.model, tokenizer=recipe.tokenizer,
                                   artifact_dir=paths.arm(a.name).aiperf_dir) for a in plan.arm_runs}


def cmd_validate(args) -> int:
    from pipeline.config.presets import file_kind, read_yaml
    from pipeline.plan import env_diff

    if file_kind(read_yaml(Path(args.recipe), "recipe")) == "sweep":
        from pipeline.launch import load_checked_sweep

        _, points = load_checked_sweep(args.recipe)
        print(f"{args.recipe}: ok (sweep of {len(points)} points: {', '.join(points)})")
        return 0
    recipe = _load(args.recipe)
    print(f"{args.recipe}: ok ({recipe.engine}, {recipe.placement.mode}; arms differ in "
          f"{', '.join(env_diff(recipe))})")
    return 0


def cmd_plan(args) -> int:
    from pipeline.config.presets import file_kind, read_yaml

    if file_kind(read_yaml(Path(args.recipe), "recipe")) == "sweep":
        return _plan_sweep(args.recipe, args.out)
    recipe = _load(args.recipe)
    run_dir = Path(args.out) if args.out else Path(recipe.output_dir) / f"{recipe.name}-<timestamp>"
    print(_plan_text(recipe, run_dir))
    return 0


def _plan_text(recipe, run_dir: Path) -> str:
    from pipeline.plan import build_plan, format_plan

    plan = build_plan(recipe, run_dir, run_id="<run-id>")  # the id exists once `pipeline run` creates the dir
    return format_plan(plan, recipe, _load_commands(recipe, plan))


def _plan_sweep(sweep_file: str, out: str | None) -> int:
    """Each point's plan, as `pipeline sweep` would run it: hosts, GPUs, ports and commands, before any job."""
    from pipeline.config.sweep import check_point, load_sweep, point_recipes
    from pipeline.paths import SweepPaths

    spec = load_sweep(sweep_file)
    paths = SweepPaths(Path(out) if out else Path(spec.output_dir) / f"{spec.name}-<timestamp>")
    points = point_recipes(spec, Path(sweep_file))
    for n, (point, data) in enumerate(points.items(), 1):
        print(f"== point {n}/{len(points)}: {point} ==")
        print(_plan_text(check_point(point, data), paths.run_dir(point)))  # presets merged, as the run will
    return 0


def cmd_run(args) -> int:
    from pipeline.launch import run_recipe

    return run_recipe(args.recipe, out=args.out, resume=args.resume)


def cmd_report(args) -> int:
    from analysis.report import cli_report

    return cli_report(args.run_dirs, args.out, args.arms)


def cmd_sweep(args) -> int:
    from pipeline.sweep import create_sweep, execute_sweep

    if args.resume and args.out:
        raise SystemExit("error: --out and --resume: a resume writes into SWEEP_DIR; give one of them")
    if args.resume:
        root = Path(args.resume)
        from pipeline.paths import SweepPaths

        if not SweepPaths(root).manifest.is_file():
            raise SystemExit(f"error: --resume: {root} has no sweep.json; not a sweep dir")
    elif args.sweep:
        root = create_sweep(args.sweep, args.out)
    else:
        raise SystemExit("error: give a sweep file (pipeline sweep sweep.yaml) or --resume SWEEP_DIR")
    try:
        return execute_sweep(root, replan_from=args.sweep if args.resume else None, resuming=bool(args.resume))
    except KeyboardInterrupt as e:  # a point's run is resumed by the sweep's resume, not on its own
        name, code = _interrupted(e)
        print(f"interrupted ({name}); finished points are kept: pipeline sweep --resume {root}", file=sys.stderr)
        return code


def cmd_eval(args) -> int:
    from pipeline.accuracy.cli import run_eval

    return run_eval(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipeline", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="check a recipe, or a sweep file's every point, and exit")
    v.add_argument("recipe", help="recipe.yaml or sweep.yaml")
    v.set_defaults(func=cmd_validate)

    pl = sub.add_parser("plan", help="print the resolved plan (arms, order, hosts, GPUs, ports, commands), of a "
                                     "recipe or of each point of a sweep file; launch nothing")
    pl.add_argument("recipe", help="recipe.yaml or sweep.yaml")
    pl.add_argument("--out", help="run dir (sweep dir, for a sweep file) to show in paths")
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

    sw = sub.add_parser("sweep", help="run a base recipe over a matrix of points (one run dir each) and write "
                                      "sweep_report.md, sweep_summary.csv and the Pareto plot")
    sw.add_argument("sweep", nargs="?", help="sweep.yaml (with --resume: an edited sweep file to re-plan the "
                                              "unfinished points from, and to add points)")
    sw.add_argument("--out", help="sweep dir (default: <output_dir>/<name>-<timestamp>)")
    sw.add_argument("--resume", metavar="SWEEP_DIR", help="finish a sweep: skip finished points, resume "
                                                          "started ones, start the rest")
    sw.set_defaults(func=cmd_sweep)

    e = sub.add_parser("eval", help="accuracy evaluation alone against any OpenAI-compatible endpoint")
    from pipeline.accuracy.cli import add_eval_arguments

    add_eval_arguments(e)
    e.set_defaults(func=cmd_eval)
    return p


def main(argv: list[str] | None = None) -> int:
    from pipeline.config.base import RecipeError

    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # a reader that went away fails here, not in the interpreter's own flush at exit
        return code
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        from pipeline.launch import RunInterrupted

        name, code = _interrupted(e)
        # only a run that made its dir has stages to resume; report, eval and validate just stop
        hint = (f"; finished stages are kept: pipeline run --resume {e.run_dir}" if isinstance(e, RunInterrupted)
                else "")
        print(f"interrupted ({name}){hint}", file=sys.stderr)
        return code
    except BrokenPipeError:
        # the reader went away (`pipeline plan ... | head`): stop as a Unix filter does, quietly; a run's servers
        # were stopped on the way here, its finished stages kept. Pointing stdout at devnull keeps the interpreter's
        # own flush at exit from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as e:  # a user-facing one-line error; the traceback helps nobody here
        from pipeline.hosts import HostError
        from pipeline.runner import RunError
        from pipeline.stages.load import LoadError
        from pipeline.stages.server import ServerError

        if isinstance(e, (HostError, RunError, ServerError, LoadError, ValueError, FileNotFoundError)):
            print(f"error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
