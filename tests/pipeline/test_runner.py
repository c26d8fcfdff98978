"""Runner pieces that a killed or resumed run depends on, with real processes and real files."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import yaml

from pipeline.hosts import LocalHost
from pipeline.manifest import Manifest
from pipeline.plan import ArmRun, build_plan
from pipeline.config.recipe import load_recipe

TRACE = str(Path(__file__).resolve().parents[2] / "recipes/data/traces/quickstart")


def _arm_run(argv: tuple[str, ...], artifact_dir: str = "/tmp") -> ArmRun:
    return ArmRun(name="on", arm="on", round=1, group=1, host="local", gpus=(), port=1, url="http://x",
                  env={}, argv=argv, artifact_dir=artifact_dir, local_dir=artifact_dir)


def test_resume_stops_a_server_left_by_a_killed_run_and_nothing_else(tmp_path):
    from pipeline.runner import _kill_leftover

    argv = (sys.executable, "-c", "import time; time.sleep(60)", "server-of-arm-on")
    ours = LocalHost().start(argv, env={}, log=str(tmp_path / "a.log"))
    other = LocalHost().start((sys.executable, "-c", "import time; time.sleep(60)"), env={},
                              log=str(tmp_path / "b.log"))
    manifest = Manifest(tmp_path / "manifest.json", {"stages": {"on": {"server": {"pid": ours.pid}}}})
    time.sleep(0.3)

    _kill_leftover(manifest, _arm_run(argv), LocalHost())
    time.sleep(0.3)
    assert ours.poll() is not None

    # A recorded pid now owned by a different command is left alone.
    manifest.data["stages"]["on"]["server"]["pid"] = other.pid
    _kill_leftover(manifest, _arm_run(argv), LocalHost())
    assert other.poll() is None
    other.stop(grace_s=1)
    ours.stop(grace_s=1)


def test_resume_stops_a_server_the_manifest_never_named_by_its_log(tmp_path):
    """A kill between a server's start and the manifest's record of its pid: the server writing to the arm's
    own server log is stopped; one writing to another run's log is not."""
    from pipeline.runner import _kill_leftover

    sleeper = (sys.executable, "-c", "import time; time.sleep(60)")
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    ours = LocalHost().start(sleeper, env={}, log=str(tmp_path / "ours/server.log"))
    theirs = LocalHost().start(sleeper, env={}, log=str(tmp_path / "theirs/server.log"))
    manifest = Manifest(tmp_path / "manifest.json", {"stages": {"on": {"server": {"status": "failed"}}}})
    time.sleep(0.3)

    _kill_leftover(manifest, _arm_run(sleeper, artifact_dir=str(tmp_path / "ours")), LocalHost())
    time.sleep(0.3)
    assert ours.poll() is not None and theirs.poll() is None
    theirs.stop(grace_s=1)


def _plan_and_manifest(tmp_path, mode: str, stages: dict):
    """A real recipe and plan, and a manifest whose stages stand where a crash left them; each arm-run folder
    holds a load_result.json."""
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({
        "name": "t", "engine": "emulator", "model": "m", "placement": {"mode": mode},
        "tokenizer": str(Path(TRACE).parents[1] / "tokenizer"),
        "arms": {"off": {"env": {"VATTN": "0"}}, "on": {"env": {"VATTN": "1"}}},
        "load": {"trace": TRACE, "benchmark_duration_s": 10, "timeout_s": 120}}))
    recipe = load_recipe(path)
    plan = build_plan(recipe, tmp_path / "run")
    for name in stages:
        (tmp_path / "run/arms" / name).mkdir(parents=True)
        (tmp_path / "run/arms" / name / "load_result.json").write_text("{}")
    return recipe, plan, Manifest(tmp_path / "run/manifest.json", {"stages": stages})


DONE = {"server": {"status": "done"}, "load": {"status": "done"}}


def test_a_group_with_every_load_done_is_left_alone(tmp_path):
    from pipeline.runner import _supersede_half_finished

    # on's accuracy failed after both loads ran together: only accuracy reruns, and it needs no partner.
    recipe, plan, manifest = _plan_and_manifest(tmp_path, "concurrent", {
        "off": DONE, "on": {**DONE, "accuracy": {"status": "failed"}}})
    _supersede_half_finished(plan, manifest, {"local": LocalHost()}, plan.groups()[0])
    assert "superseded" not in manifest.data and manifest.is_done("off", "load")
    assert (tmp_path / "run/arms/off/load_result.json").is_file()


def test_sequential_arms_resume_one_by_one(tmp_path):
    from pipeline.runner import _supersede_half_finished

    recipe, plan, manifest = _plan_and_manifest(tmp_path, "sequential", {"off": DONE, "on": {"load": {"status": "failed"}}})
    for group in plan.groups():
        _supersede_half_finished(plan, manifest, {"local": LocalHost()}, group)
    assert "superseded" not in manifest.data and manifest.is_done("off", "load")


def test_a_half_finished_concurrent_group_sets_its_finished_arm_aside(tmp_path):
    from pipeline.runner import _supersede_half_finished

    recipe, plan, manifest = _plan_and_manifest(tmp_path, "concurrent", {"off": DONE, "on": {"load": {"status": "failed"}}})
    _supersede_half_finished(plan, manifest, {"local": LocalHost()}, plan.groups()[0])
    assert not manifest.is_done("off", "load")
    assert [(e["arm_run"], e["attempt"], e["stages"]) for e in manifest.data["superseded"]] == [("off", 1, DONE)]
    assert (tmp_path / "run/superseded/off.1/load_result.json").is_file()
    assert not (tmp_path / "run/arms/off").exists()


def test_a_resume_with_nothing_left_to_run_keeps_the_finish_time_and_wall_time(tmp_path):
    """The report's wall time runs from `created` to `finished`: a no-op resume a week later must not stretch it."""
    import json
    import shutil
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    run = tmp_path / "run"
    shutil.copytree(repo / "tests/analysis/data/quickstart_run", run)  # a finished quickstart run
    finished = json.loads((run / "manifest.json").read_text())["finished"]
    p = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", "--resume", str(run)], cwd=repo,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "all stages done (resume): skipped" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    assert json.loads((run / "manifest.json").read_text())["finished"] == finished
    assert f"finished: {finished}; wall time: 191.0 s" in (run / "report.md").read_text()
