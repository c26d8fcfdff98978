"""`pipeline plan`'s text: every stage of every arm run, with what it reads and writes."""
from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.cli import main

REPO = Path(__file__).resolve().parents[2]


def _recipe(tmp_path: Path, **over) -> Path:
    recipe = yaml.safe_load((REPO / "recipes/quickstart.yaml").read_text())
    recipe.update(tokenizer=str(REPO / "recipes/data/tokenizer"), **over)
    recipe["load"]["trace"] = str(REPO / "recipes/data/traces/short")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_the_plan_shows_each_arms_accuracy_tasks_and_records(tmp_path, capsys):
    data = REPO / "recipes/data/accuracy/gsm8k_synthetic.jsonl"
    path = _recipe(tmp_path, accuracy={"tasks": [
        {"name": "gsm8k", "data": str(data), "limit": 20, "max_tokens": 64},
        {"name": "gpqa_diamond", "repeats": 2, "temperature": 0.5}]})
    assert main(["plan", str(path), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "stages    server -> load -> accuracy" in out
    for arm in ("off", "on"):
        assert (f"    accuracy: gsm8k: data={data} shots=5 limit=20 repeats=1 max_tokens=64 temperature=0.0 "
                f"concurrency=32 -> {tmp_path}/run/arms/{arm}/accuracy/gsm8k.jsonl\n") in out
        assert (f"    accuracy: gpqa_diamond: data=HF hub shots=0 limit=all repeats=2 max_tokens=8192 temperature=0.5 "
                f"concurrency=32 -> {tmp_path}/run/arms/{arm}/accuracy/gpqa_diamond.jsonl") in out


def test_a_plan_without_accuracy_shows_none(tmp_path, capsys):
    assert main(["plan", str(_recipe(tmp_path, accuracy=None))]) == 0
    out = capsys.readouterr().out
    assert "stages    server -> load\n" in out and "accuracy" not in out
