"""The run's inputs: hashed at its start, each with whether the checkout's commit holds it."""
from __future__ import annotations

import hashlib
import shutil
import subprocess

import pytest

from pipeline import inputs
from pipeline.inputs import run_inputs


def test_the_recipe_trace_and_emulator_profiles_are_hashed(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: x\n")
    trace = tmp_path / "trace"
    trace.mkdir()
    (trace / "s0.json").write_text("{}")
    got = {e["role"]: e for e in run_inputs(str(recipe), {"engine": "emulator", "load": {"trace": str(trace)},
                                                          "server": {"args": {"hardware": "h200"}}})}
    assert got["recipe"]["sha256"] == hashlib.sha256(b"name: x\n").hexdigest()
    assert got["recipe"]["git"] == "outside the checkout"
    assert got["trace"]["files"] == 1 and len(got["trace"]["sha256"]) == 64
    assert got["hardware profile"]["file"].endswith("configs/hardware/h200.yaml")
    assert got["hardware profile"]["git"] in ("committed", "modified")
    assert got["model preset"]["sha256"]


def test_a_missing_input_gets_no_hash_and_says_why(tmp_path):
    (entry,) = run_inputs(str(tmp_path / "gone.yaml"), {})
    assert entry["sha256"] is None and "not readable here" in entry["note"]


@pytest.fixture
def repo(tmp_path, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("no git")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "kept.yaml").write_text("a: 1\n")
    subprocess.run(git + ["add", "."], cwd=tmp_path, check=True)
    subprocess.run(git + ["commit", "-qm", "x"], cwd=tmp_path, check=True)
    monkeypatch.setattr(inputs, "REPO_ROOT", tmp_path)
    return tmp_path


def test_an_untracked_recipe_is_flagged_though_the_tree_is_clean(repo):
    (repo / "recipes" / "new.yaml").write_text("b: 2\n")
    (repo / "recipes" / "traces").mkdir()
    (repo / "recipes" / "traces" / "s.json").write_text("{}")
    got = {e["role"]: e["git"] for e in run_inputs(str(repo / "recipes" / "new.yaml"),
                                                   {"load": {"trace": str(repo / "recipes" / "traces")}})}
    assert got == {"recipe": "untracked", "trace": "untracked"}
    assert run_inputs(str(repo / "recipes" / "kept.yaml"), {})[0]["git"] == "committed"
    (repo / "recipes" / "kept.yaml").write_text("a: 3\n")
    assert run_inputs(str(repo / "recipes" / "kept.yaml"), {})[0]["git"] == "modified"


def test_changed_inputs_names_what_a_resume_would_read_differently(tmp_path):
    from pipeline.inputs import changed_inputs

    trace, data = tmp_path / "trace", tmp_path / "gsm8k.jsonl"
    trace.mkdir()
    (trace / "s0.json").write_text("{}")
    data.write_text("q\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: x\n")
    recorded = run_inputs(str(recipe), {"load": {"trace": str(trace)},
                                        "accuracy": {"tasks": [{"name": "gsm8k", "data": str(data)}]}})
    assert changed_inputs(recorded) == []
    recipe.write_text("name: y\n")  # a resume runs the recipe recorded in the manifest, not the file
    (trace / "s1.json").write_text("{}")
    data.unlink()
    got = changed_inputs(recorded)
    assert len(got) == 2
    assert got[0].startswith(f"trace {trace} changed (sha256 {recorded[1]['sha256'][:12]}... at the start, ")
    assert got[1] == f"accuracy gsm8k data {data} is gone or unreadable"
    assert changed_inputs([{"role": "trace", "path": "/elsewhere", "sha256": None}]) == []  # never read here


def test_a_resume_refuses_a_trace_changed_since_the_run_started_and_takes_it_back_once_restored(tmp_path):
    import json
    import sys

    repo = inputs.REPO_ROOT
    run, trace = tmp_path / "run", tmp_path / "trace"
    shutil.copytree(repo / "tests/analysis/data/quickstart_run", run)  # a finished run: a resume only reports
    shutil.copytree(repo / "recipes/data/traces/quickstart", trace)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["recipe"]["load"]["trace"] = str(trace)
    manifest["inputs"] = run_inputs(manifest["recipe_path"], manifest["recipe"])
    (run / "manifest.json").write_text(json.dumps(manifest))
    session = sorted(trace.iterdir())[0]
    original = session.read_bytes()
    session.write_bytes(original + b"\n")

    def resume():
        return subprocess.run([sys.executable, "-m", "pipeline.cli", "run", "--resume", str(run)], cwd=repo,
                              capture_output=True, text=True, timeout=300)

    p = resume()
    assert p.returncode != 0 and "run dir:" not in p.stdout  # refused before it started anything
    assert f"error: --resume: since the run started, trace {trace} changed (sha256 " in p.stderr
    assert "restore it" in p.stderr
    session.write_bytes(original)
    p = resume()
    assert p.returncode == 0, p.stderr
    assert "report:" in p.stdout
