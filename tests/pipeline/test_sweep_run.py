"""pipeline sweep without a cluster: points whose server cannot start fail alone, the sweep goes on, the
report says which failed and why, and --resume retries only them (the Slurm e2e test runs a full sweep)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ports import free_port

REPO = Path(__file__).resolve().parents[2]


def _pipeline(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", *args]


def test_failed_points_are_reported_and_retried(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "f", "base": str(REPO / "recipes/quickstart.yaml"),
        # a hardware profile path that does not exist passes validation (the server reads it where it runs)
        # and stops the emulator at start, so no load ever starts
        "overrides": {"accuracy": None, "server": {"args": {"hardware": "/nonexistent/hardware-profile.yaml"},
                                                   "port": 30431}},
        "matrix": {"conc": {"c1": {"load": {"concurrency": 1}}, "c2": {"load": {"concurrency": 2}}}}}))
    out = tmp_path / "s"
    p = subprocess.run(_pipeline("sweep", str(sweep), "--out", str(out)), cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads((out / "sweep.json").read_text())
    assert [e["status"] for e in doc["points"].values()] == ["failed", "failed"]
    assert "server exited with code 2" in doc["points"]["c1"]["error"]
    assert (out / "recipes/c1.yaml").is_file() and (out / "runs/c2/manifest.json").is_file()
    report = (out / "sweep_report.md").read_text()
    assert report.count("| failed: ServerError: server exited with code 2") == 2
    assert "No point has finished yet" in report and not (out / "sweep_summary.csv").exists()

    p = subprocess.run(_pipeline("sweep", "--resume", str(out)), cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1 and p.stdout.count(": resuming ") == 2 and ": new run " not in p.stdout


def test_sweep_errors_name_the_fix(tmp_path):
    p = subprocess.run(_pipeline("sweep", "--resume", str(tmp_path)), cwd=REPO, capture_output=True, text=True)
    assert p.returncode != 0 and f"{tmp_path} has no sweep.json; not a sweep dir" in p.stderr
    p = subprocess.run(_pipeline("sweep"), cwd=REPO, capture_output=True, text=True)
    assert "give a sweep file (pipeline sweep sweep.yaml) or --resume SWEEP_DIR" in p.stderr


def test_a_later_points_unusable_accuracy_file_stops_the_sweep_before_any_point_runs(tmp_path):
    """As `pipeline validate` of the sweep file says: not after the first points' loads."""
    (tmp_path / "empty.jsonl").write_text("")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "f", "base": str(REPO / "recipes/quickstart.yaml"), "overrides": {"server": {"port": free_port()}},
        "matrix": {"conc": {"c1": {"load": {"concurrency": 1}},
                            "c2": {"load": {"concurrency": 2},
                                   "accuracy": {"tasks": [{"name": "gsm8k", "data": str(tmp_path / "empty.jsonl")}]}}}}}))
    out = tmp_path / "s"
    p = subprocess.run(_pipeline("sweep", str(sweep), "--out", str(out)), cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "sweep point 'c2': invalid recipe\naccuracy.tasks.0.data" in p.stderr, p.stderr
    assert not out.exists()


RECORDED_RUN = REPO / "tests/analysis/data/quickstart_run"  # a finished quickstart run


def _failing_sweep(tmp_path: Path, **fields) -> Path:
    """A sweep whose points, if they ever ran, fail at once (the emulator's hardware profile is missing)."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "f", "base": str(REPO / "recipes/quickstart.yaml"),
        "overrides": {"accuracy": None, "server": {"args": {"hardware": "/nonexistent/hardware-profile.yaml"},
                                                   "port": 30431}},
        "matrix": {"conc": {"c1": {"load": {"concurrency": 1}}, "c2": {"load": {"concurrency": 2}}}}, **fields},
        sort_keys=False))
    return sweep


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_resume_from_another_cwd_or_of_a_moved_sweep_dir_finds_the_finished_runs(tmp_path, monkeypatch):
    from pipeline.sweep import create_sweep

    sweep = _failing_sweep(tmp_path)
    made_in, elsewhere = tmp_path / "a", tmp_path / "b"
    made_in.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(made_in)
    root = create_sweep(str(sweep), "s")  # a relative --out, as the default runs/<name>-<ts> is
    monkeypatch.chdir(REPO)
    for point in ("c1", "c2"):  # both points finished
        shutil.copytree(RECORDED_RUN, made_in / "s/runs" / point)
    p = subprocess.run(_pipeline("sweep", "--resume", str(made_in / root)), cwd=elsewhere, env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert p.stdout.count("finished before (resume): skipped") == 2 and not list(elsewhere.iterdir())
    moved = tmp_path / "moved"
    (made_in / "s").rename(moved)
    doc = json.loads((moved / "sweep.json").read_text())
    assert [e["run_dir"] for e in doc["points"].values()] == ["runs/c1", "runs/c2"]
    for point, e in doc["points"].items():  # as older sweeps recorded it: relative to the cwd they were made in
        e["run_dir"] = f"s/runs/{point}"
    (moved / "sweep.json").write_text(json.dumps(doc))
    p = subprocess.run(_pipeline("sweep", "--resume", str(moved)), cwd=elsewhere, env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.count("finished before (resume): skipped") == 2, p.stdout + p.stderr
    assert (moved / "sweep_report.md").read_text().count("| done | 2 (tp_size of model preset qwen3.5-397b-a17b-tp2) "
                                                         "| runs/c") == 2


def test_per_gpu_throughput_divides_by_the_gpus_a_preset_gives(tmp_path):
    import pandas as pd

    from pipeline.sweep import create_sweep, write_sweep_report

    base = yaml.safe_load((REPO / "recipes/mi355x-tp2-c8.yaml").read_text())
    del base["placement"]["gpus_per_arm"]  # left to the server preset each point names
    base.update(presets=[], accuracy=None)
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "g", "base": "base.yaml", "gpus_per_server": 1, "points": {
        "tp2": {"presets": ["servers/qwen3.5-397b-a17b-mtp-tp2"]},
        "tp4": {"presets": ["servers/qwen3.5-397b-a17b-mtp-tp4"]}}}))
    root = create_sweep(str(sweep), str(tmp_path / "s"))
    for point in ("tp2", "tp4"):
        shutil.copytree(RECORDED_RUN, root / "runs" / point)
    write_sweep_report(root)
    df = pd.read_csv(root / "sweep_summary.csv")
    assert df.groupby("point")["gpus"].first().to_dict() == {"tp2": 2, "tp4": 4}
    on = df[df["arm"] == "on"].set_index("point")["tput_per_gpu"]
    assert on["tp2"] == pytest.approx(2 * on["tp4"])  # the same recorded run, divided by 2 and by 4


def test_per_gpu_throughput_of_an_emulator_tp_axis_divides_by_each_points_tp(tmp_path):
    """The README's TP axis on the emulator: each point's model preset says the TP of the server it stands for."""
    import pandas as pd

    from pipeline.sweep import write_sweep_report

    root = _matrix_2x2_done(tmp_path)
    write_sweep_report(root)
    df = pd.read_csv(root / "sweep_summary.csv")
    assert df.groupby("point", sort=False)["gpus"].first().to_dict() == {
        "tp2-c4": 2, "tp2-c8": 2, "tp4-c4": 4, "tp4-c8": 4}
    on = df[df["arm"] == "on"].set_index("point")["tput_per_gpu"]
    assert on["tp2-c4"] == pytest.approx(2 * on["tp4-c4"])  # the same recorded run, divided by 2 and by 4
    report = (root / "sweep_report.md").read_text()
    assert "| tp4-c8 | done | 4 (tp_size of model preset qwen3.5-397b-a17b-tp4) | runs/tp4-c8 |" in report
    assert "| tp2-c4 | done | 2 (tp_size of model preset qwen3.5-397b-a17b-tp2) | runs/tp2-c4 |" in report


def test_gpus_per_server_set_in_the_sweep_file_overrides_the_emulators_tp(tmp_path):
    import pandas as pd

    from pipeline.sweep import create_sweep, write_sweep_report

    root = create_sweep(str(_failing_sweep(tmp_path, gpus_per_server=8, matrix={
        "tp": {"tp2": {"server": {"args": {"model_preset": "qwen3.5-397b-a17b-tp2"}}},
               "tp4": {"server": {"args": {"model_preset": "qwen3.5-397b-a17b-tp4"}}}}})), str(tmp_path / "s"))
    for point in ("tp2", "tp4"):
        shutil.copytree(RECORDED_RUN, root / "runs" / point)
    write_sweep_report(root)
    assert set(pd.read_csv(root / "sweep_summary.csv")["gpus"]) == {8}
    assert (root / "sweep_report.md").read_text().count("| done | 8 (gpus_per_server of the sweep file) |") == 2


@pytest.mark.parametrize("engine,args,placed,expect", [
    ("sglang", {"tp_size": 4}, 0, (4, "--tp-size 4")),
    ("sglang", ["--tp", "2", "--pp-size=2"], 0, (4, "--tp 2 x --pp-size 2")),
    ("sglang", {}, 0, (1, "no --tp-size")),
    ("sglang", {"tp_size": 4}, 8, (8, "placement.gpus_per_arm")),   # the GPUs the server was given
    ("vllm", ["-tp", "4"], 0, (4, "-tp 4")),
    ("emulator", {"tp_size": 8}, 0, (8, "--tp-size 8")),
    ("emulator", {"model_preset": "qwen3.5-397b-a17b-tp4"}, 1, (4, "tp_size of model preset qwen3.5-397b-a17b-tp4")),
])
def test_point_gpus_come_from_the_engines_own_tp(engine, args, placed, expect):
    """A real engine spans the GPUs placement gives it, else its TP flags; the emulator stands for its preset's TP
    server whatever GPUs it is lent (one, to run the kernel)."""
    from types import SimpleNamespace

    from pipeline.config.arms import ArmSpec
    from pipeline.config.server import ServerSpec
    from pipeline.sweep import point_gpus

    recipe = SimpleNamespace(engine=engine, server=ServerSpec(args=args), arms={"on": ArmSpec()},
                             placement=SimpleNamespace(gpus_per_arm=placed))
    assert point_gpus(recipe, None) == expect


def test_the_summary_names_run_dirs_relative_to_the_sweep_dir_from_any_cwd(tmp_path, monkeypatch):
    import pandas as pd

    from pipeline.sweep import create_sweep, write_sweep_report

    root = create_sweep(str(_failing_sweep(tmp_path)), str(tmp_path / "s"))
    for point in ("c1", "c2"):
        shutil.copytree(RECORDED_RUN, root / "runs" / point)
    monkeypatch.chdir(tmp_path)
    for given in (Path("s"), root.resolve()):  # as --resume s and --resume /abs/s leave it
        write_sweep_report(given)
        assert list(pd.read_csv(root / "sweep_summary.csv")["run_dir"].unique()) == ["runs/c1", "runs/c2"], given


def test_a_finished_point_that_cannot_be_analysed_leaves_the_others_reported(tmp_path):
    """A point whose run finished but whose export is gone (or whose own report failed) is named with its reason;
    the other points still get their summary, plot and tables, and the exit status says something failed."""
    import pandas as pd

    from pipeline.sweep import create_sweep

    root = create_sweep(str(_failing_sweep(tmp_path)), str(tmp_path / "s"))
    for point in ("c1", "c2"):
        shutil.copytree(RECORDED_RUN, root / "runs" / point)
    (root / "runs/c1/arms/on/aiperf/profile_export.jsonl").unlink()
    p = subprocess.run(_pipeline("sweep", "--resume", str(root)), cwd=REPO, env=_env(), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    why = "run dir runs/c1: arm 'on' has no aiperf export at arms/on/aiperf/profile_export.jsonl"
    assert f"c1: analysis failed, left out of the summary and plot: {why}, though its load stage" in p.stdout
    status_table, tables = (root / "sweep_report.md").read_text().split("## Per-point table")
    c1, c2 = [r for r in status_table.splitlines() if r.startswith("| c")]
    assert c1.startswith(f"| c1 | analysis failed: {why}") and c1.count("|") == 5, c1
    assert c2.startswith("| c2 | done |") and "| c2 | " in tables and "| c1 | " not in tables
    assert list(pd.read_csv(root / "sweep_summary.csv")["point"].unique()) == ["c2"]
    assert (root / "plots/pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_point_that_run_refuses_fails_alone(tmp_path):
    from pipeline.sweep import create_sweep

    root = create_sweep(str(_failing_sweep(tmp_path)), str(tmp_path / "s"))
    (root / "runs/c1").mkdir(parents=True)
    (root / "runs/c1/notes.txt").write_text("not a run\n")  # `pipeline run` refuses a non-empty dir it did not make
    p = subprocess.run(_pipeline("sweep", "--resume", str(root)), cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    points = json.loads((root / "sweep.json").read_text())["points"]
    assert points["c1"]["status"] == "failed"
    assert points["c1"]["error"].startswith(f"--out: run dir {root}/runs/c1 already exists and is not empty")
    assert points["c2"]["status"] == "failed" and "server exited with code 2" in points["c2"]["error"]
    assert "c1: failed: --out: run dir" in p.stdout and "2 point(s) failed: c1, c2" in p.stdout


def test_out_that_is_a_file_is_one_error_line(tmp_path):
    sweep, taken = _failing_sweep(tmp_path), tmp_path / "notes.txt"
    taken.write_text("a file\n")
    for out, says in ((taken, f"error: --out: {taken} is a file, not a folder; give a sweep dir that does not exist"),
                      (taken / "s", f"error: --out: cannot make sweep dir {taken}/s: Not a directory")):
        p = subprocess.run(_pipeline("sweep", str(sweep), "--out", str(out)), cwd=REPO, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 1 and p.stderr.startswith(says) and p.stderr.count("\n") == 1, p.stderr
    assert taken.read_text() == "a file\n"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_sweep_reports_what_finished_and_names_the_sweep_resume(tmp_path, wait_for, sig):
    from pipeline.sweep import create_sweep

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "i", "base": str(REPO / "recipes/quickstart.yaml"),
        "overrides": {"accuracy": None, "server": {"port": free_port()},
                      "load": {"trace": str(REPO / "recipes/data/traces/short"), "warmup_requests": 4, "benchmark_duration_s": 60}},
        "matrix": {"conc": {"c1": {"load": {"concurrency": 1}}, "c2": {"load": {"concurrency": 2}}}}}))
    root = create_sweep(str(sweep), str(tmp_path / "s"))
    shutil.copytree(RECORDED_RUN, root / "runs/c1")  # finished before
    # SIGINT at its default in the child, as in a terminal (a background test run hands it down ignored)
    proc = subprocess.Popen(_pipeline("sweep", "--resume", str(root)), cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    c2 = root / "runs/c2/manifest.json"
    wait_for(lambda: c2.is_file() and json.loads(c2.read_text())["stages"].get("off", {}).get("load", {})
             .get("status") == "running", 120, proc)
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 128 + sig, out[-2000:] + err[-2000:]  # 130 for SIGINT, 143 for SIGTERM
    assert f"finished points are kept: pipeline sweep --resume {root}" in err and "pipeline run --resume" not in err
    report = (root / "sweep_report.md").read_text()
    assert "| c1 | done |" in report and "| c2 | unfinished |" in report and "Per-point table" in report
    assert json.loads((root / "sweep.json").read_text())["points"]["c2"]["status"] == "interrupted"


def test_a_failed_point_shows_its_run_dir_and_its_cut_error_keeps_the_row_whole(tmp_path):
    from pipeline.sweep import write_sweep_report

    out = tmp_path / "s"
    p = subprocess.run(_pipeline("sweep", str(_failing_sweep(tmp_path)), "--out", str(out)), cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and (out / "runs/c1/manifest.json").is_file(), p.stdout[-2000:] + p.stderr[-2000:]
    rows = [r for r in (out / "sweep_report.md").read_text().splitlines() if r.startswith("| c")]
    assert [r.rsplit("|", 2)[1].strip() for r in rows] == ["runs/c1", "runs/c2"]
    doc = json.loads((out / "sweep.json").read_text())
    # the cut at 160 falls inside the code span, which holds a '|'; the second line is the run's traceback
    doc["points"]["c1"]["error"] = "RunError: " + "x" * 140 + " `python -m a | grep b` " + "y" * 50 + "\nline 2"
    (out / "sweep.json").write_text(json.dumps(doc))
    write_sweep_report(out)
    row = next(r for r in (out / "sweep_report.md").read_text().splitlines() if r.startswith("| c1 |"))
    assert row.count("`") % 2 == 0 and row.count("|") == 5 and "line 2" not in row, row
    assert row.startswith("| c1 | failed: RunError: xxx") and row.endswith("... | 2 (tp_size of model preset "
                                                                            "qwen3.5-397b-a17b-tp2) | runs/c1 |"), row


def _matrix_2x2_done(tmp_path: Path) -> Path:
    """A 2 x 2 sweep (conc x tp) whose four points finished: each the recorded quickstart run."""
    from pipeline.sweep import create_sweep

    root = create_sweep(str(_failing_sweep(tmp_path, matrix={
        "tp": {"tp2": {"server": {"args": {"model_preset": "qwen3.5-397b-a17b-tp2"}}},
               "tp4": {"server": {"args": {"model_preset": "qwen3.5-397b-a17b-tp4"}}}},
        "conc": {"c4": {"load": {"concurrency": 4}}, "c8": {"load": {"concurrency": 8}}}})), str(tmp_path / "s"))
    for point in ("tp2-c4", "tp2-c8", "tp4-c4", "tp4-c8"):
        shutil.copytree(RECORDED_RUN, root / "runs" / point)
    return root


def test_the_summary_has_a_column_per_matrix_axis(tmp_path):
    import pandas as pd

    from pipeline.sweep import write_sweep_report

    root = _matrix_2x2_done(tmp_path)
    write_sweep_report(root)
    df = pd.read_csv(root / "sweep_summary.csv")
    assert list(df.columns[:4]) == ["point", "tp", "conc", "gpus"]
    assert df[["point", "tp", "conc"]].drop_duplicates().values.tolist() == [
        ["tp2-c4", "tp2", "c4"], ["tp2-c8", "tp2", "c8"], ["tp4-c4", "tp4", "c4"], ["tp4-c8", "tp4", "c8"]]


def test_pareto_lines_stay_within_one_series_of_a_matrix(tmp_path):
    import pandas as pd

    from analysis.sweep import pareto_lines
    from pipeline.config.sweep import line_axis
    from pipeline.sweep import write_sweep_report

    root = _matrix_2x2_done(tmp_path)
    write_sweep_report(root)
    assert (root / "plots/pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    matrix = json.loads((root / "sweep.json").read_text())["spec"]["matrix"]
    assert line_axis(matrix) == "conc"  # the axis that sets load.concurrency, though not the last
    assert line_axis({"tp": matrix["tp"], "hw": {"h200": {}, "mi355x": {}}}) == "hw"  # none does: the last
    df = pd.read_csv(root / "sweep_summary.csv")
    lines = [(arm, series, list(rows["point"])) for arm, series, rows in pareto_lines(df, list(matrix), "conc")]
    assert lines == [("off", "tp2", ["tp2-c4", "tp2-c8"]), ("off", "tp4", ["tp4-c4", "tp4-c8"]),
                     ("on", "tp2", ["tp2-c4", "tp2-c8"]), ("on", "tp4", ["tp4-c4", "tp4-c8"])]
    # explicit points (no axes): one line per arm through every point, in sweep order, as before
    assert [(arm, list(rows["point"])) for arm, _, rows in pareto_lines(df)] == \
        [(arm, ["tp2-c4", "tp2-c8", "tp4-c4", "tp4-c8"]) for arm in ("off", "on")]


def test_a_second_sweep_in_a_sweep_dir_that_another_process_holds_is_refused(tmp_path):
    """Two sweeps in one dir would run each point twice, into the same run dirs."""
    from pipeline.sweep import create_sweep

    root = create_sweep(str(_failing_sweep(tmp_path)), str(tmp_path / "s"))
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pipeline import dirlock\n"
                               "with dirlock.exclusive(sys.argv[1]):\n    print('held', flush=True)\n"
                               "    time.sleep(120)\n", str(root)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        p = subprocess.run(_pipeline("sweep", "--resume", str(root)), cwd=REPO, capture_output=True, text=True,
                           timeout=120)
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert p.returncode != 0 and (f"error: sweep dir {root} is held by another pipeline process (pid {holder.pid}); "
                                  "wait for it to finish or stop it, then resume") in p.stderr
    assert "sweep dir:" not in p.stdout, p.stdout  # the refused process never worked in it
    assert {e["status"] for e in json.loads((root / "sweep.json").read_text())["points"].values()} == {"pending"}


def test_an_edited_sweep_file_replans_the_unfinished_points_and_keeps_the_finished(tmp_path):
    """A failed point's fix: `pipeline sweep sweep.yaml --resume DIR` takes the edited recipe of every point
    that has not finished (its earlier run set aside), adds new points, and refuses to change a finished one."""
    from pipeline.sweep import create_sweep

    root = create_sweep(str(_failing_sweep(tmp_path)), str(tmp_path / "s"))
    shutil.copytree(RECORDED_RUN, root / "runs/c1")  # c1 finished
    p = subprocess.run(_pipeline("sweep", "--resume", str(root)), cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 1 and (root / "runs/c2/manifest.json").is_file(), p.stdout[-2000:] + p.stderr[-2000:]

    def edited(name: str, **matrix) -> Path:
        path = tmp_path / f"{name}.yaml"
        doc = yaml.safe_load(_failing_sweep(tmp_path).read_text())
        doc["matrix"]["conc"] = matrix
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    before = (root / "sweep.json").read_text()
    other = "/nonexistent/other-profile.yaml"  # c2 still fails at once, now naming the new profile in its recipe
    for bad, says in (
            (edited("changes-c1", c1={"load": {"concurrency": 5}}, c2={"load": {"concurrency": 2}}),
             "it changes points c1, which finished in"),
            (edited("drops-c2", c1={"load": {"concurrency": 1}}), "points c2 of")):
        p = subprocess.run(_pipeline("sweep", str(bad), "--resume", str(root)), cwd=REPO, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 1 and says in p.stderr, p.stderr[-2000:]
        assert (root / "sweep.json").read_text() == before  # refused before anything changed

    fixed = edited("fixed", c1={"load": {"concurrency": 1}},
                   c2={"load": {"concurrency": 2}, "server": {"args": {"hardware": other}}},
                   c3={"load": {"concurrency": 3}})
    p = subprocess.run(_pipeline("sweep", str(fixed), "--resume", str(root)), cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert f"c2: re-planned from {fixed}; its earlier run is kept in {root}/superseded/c2.1" in p.stdout
    assert f"c3: new point from {fixed}" in p.stdout and "c1: finished before (resume): skipped" in p.stdout
    assert "c2: new run " in p.stdout  # not a resume of the run made under the old recipe
    doc = json.loads((root / "sweep.json").read_text())
    assert list(doc["points"]) == ["c1", "c2", "c3"] and doc["sweep_file"] == str(fixed)
    assert doc["points"]["c2"]["superseded"][0]["run_dir"] == "superseded/c2.1"
    assert (root / "superseded/c2.1/manifest.json").is_file()
    run = json.loads((root / "runs/c2/manifest.json").read_text())
    assert run["recipe"]["server"]["args"]["hardware"] == other
    assert [doc["points"][c]["status"] for c in ("c1", "c2", "c3")] == ["done", "failed", "failed"]


@pytest.mark.ssh
def test_a_point_on_an_unreachable_ssh_host_leaves_no_run_dir_and_reruns_once_fixed(sshd, tmp_path):
    """The point fails alone with the host's error and leaves no run dir, whose manifest would hold the bad recipe;
    a resume with the fixed sweep file starts the point's run afresh, with nothing to set aside."""
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({
        "name": "b", "engine": "emulator", "model": "m", "placement": {"hosts": ["box"]},
        "tokenizer": str(REPO / "recipes/data/tokenizer"),
        "hosts": {"box": {"kind": "ssh", "address": "127.0.0.1", "port": sshd["port"], "user": sshd["user"],
                          "key": sshd["key"], "workdir": str(tmp_path / "remote"), "python": "echo"}},
        "arms": {"off": {"env": {"VATTN": "0"}}, "on": {"env": {"VATTN": "1"}}},
        "server": {"port": free_port(), "startup_timeout_s": 30},
        "load": {"trace": str(REPO / "recipes/data/traces/quickstart"), "benchmark_duration_s": 10,
                 "timeout_s": 120}}))
    closed = free_port()

    def sweep_file(ssh_port: int) -> str:
        path = tmp_path / f"sweep-{ssh_port}.yaml"
        path.write_text(yaml.safe_dump({"name": "u", "base": str(base), "points": {"p1": {}},
                                        "overrides": {"hosts": {"box": {"port": ssh_port}}}}))
        return str(path)

    out = tmp_path / "s"
    p = subprocess.run(_pipeline("sweep", sweep_file(closed), "--out", str(out)), cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    [point] = json.loads((out / "sweep.json").read_text())["points"].values()
    assert point["status"] == "failed", point
    assert point["error"].startswith(f"HostError: host 'box' ({sshd['user']}@127.0.0.1:{closed}) is unreachable")
    assert not (out / "runs/p1").exists()

    p = subprocess.run(_pipeline("sweep", sweep_file(sshd["port"]), "--resume", str(out)), cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "p1: new run" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    [point] = json.loads((out / "sweep.json").read_text())["points"].values()
    assert "server exited with code 0 before becoming healthy" in point["error"] and "superseded" not in point
    assert json.loads((out / "runs/p1/manifest.json").read_text())["hosts"]["box"]["gpus"] == []
