"""Spec validation, dataset loading (local files, offline hub) and the synthetic generator."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.accuracy import gpqa, gsm8k, synthetic
from pipeline.accuracy.data import DataError, read_rows
from pipeline.config.accuracy import AccuracySpec, TaskSpec

DATA = Path(__file__).resolve().parents[3] / "recipes" / "data" / "accuracy"
GSM, GPQA = DATA / "gsm8k_synthetic.jsonl", DATA / "gpqa_synthetic.jsonl"


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_spec_defaults_per_task():
    g, q = TaskSpec(name="gsm8k"), TaskSpec(name="gpqa_diamond")
    assert (g.num_shots, g.repeats, g.max_tokens, g.temperature) == (5, 1, 2048, 0.0)
    assert (q.num_shots, q.repeats, q.max_tokens) == (0, 8, 8192)


def test_spec_errors_name_the_field():
    with pytest.raises(ValidationError, match="num_shots: 3 for gpqa_diamond; it is zero-shot"):
        TaskSpec(name="gpqa_diamond", num_shots=3)
    with pytest.raises(ValidationError, match=r"tasks.1.name: 'gsm8k' appears twice"):
        AccuracySpec(tasks=[{"name": "gsm8k"}, {"name": "gsm8k"}])
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        AccuracySpec(tasks=[{"name": "gsm8k", "shots": 5}])
    with pytest.raises(ValidationError, match="Input should be 'gsm8k' or 'gpqa_diamond'"):
        TaskSpec(name="mmlu")


def test_offline_without_file_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    with pytest.raises(DataError, match=r"^accuracy.tasks.0.data: no local data file and the HF "
                                        r"hub is unreachable \(dataset Idavidrein/gpqa/gpqa_diamond\)"
                                        r"; set accuracy.tasks.0.data to a local file with fields"):
        gpqa.load(TaskSpec(name="gpqa_diamond"), "accuracy.tasks.0.data")


def test_offline_cli_prints_one_line_and_fails(tmp_path):
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_DATASETS_OFFLINE", None)
    proc = subprocess.run([sys.executable, "-m", "pipeline.accuracy", "--url", "http://127.0.0.1:1",
                           "--model", "m", "--task", "gsm8k", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    # A CLI user is told about the flag, not about a recipe path the CLI does not have.
    assert proc.stderr.startswith("pipeline eval: error: --data: no local data "
                                  "file and the HF hub is unreachable (dataset openai/gsm8k/main)")
    assert "set --data to a local file" in proc.stderr and "accuracy.tasks" not in proc.stderr


def test_cli_flag_error_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipeline.accuracy", "--url", "http://x",
                           "--model", "m", "--task", "gsm8k", "--data", str(GSM),
                           "--repeats", "0", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr == ("pipeline eval: error: --repeats: Input should be greater than "
                           "or equal to 1 (got 0)\n")


def test_a_task_names_a_missing_or_unreadable_data_file_before_anything_runs(tmp_path):
    """The recipe (and `pipeline eval`) reject the file when validated: the accuracy stage reads it only after
    an arm's load has run."""

    txt = tmp_path / "x.txt"
    txt.write_text("a,b\n")
    for field, value, why in (("data", tmp_path / "nope.jsonl", r"no such file; allowed: a local \.jsonl"),
                              ("data", tmp_path, r"no such file \(it is a directory\)"),
                              ("shots_data", tmp_path / "nope.jsonl", "no such file"),
                              ("data", txt, r"unsupported file type '\.txt'; allowed: \.jsonl, \.json, \.csv")):
        with pytest.raises(ValidationError, match=rf"{field}\n  Value error, {why}"):
            TaskSpec(name="gsm8k", **{field: value})


def test_local_file_errors(tmp_path):
    """A file gone or broken by the time the stage reads it still gets one line naming it."""
    with pytest.raises(DataError, match=r"^w: file not found: .*nope.jsonl$"):
        read_rows(tmp_path / "nope.jsonl", "w")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"Question": "q", "answer": "#### 1"}) + "\n")
    with pytest.raises(DataError, match=r"w: row 0 of .*bad.jsonl lacks field\(s\) \['question'\]"):
        gsm8k.load(TaskSpec(name="gsm8k", data=bad), "w")
    txt = tmp_path / "x.txt"
    txt.write_text("a,b\n")
    with pytest.raises(DataError, match=r"w: unsupported file type '.txt' .*; use .jsonl, .json, .csv or .parquet"):
        read_rows(txt, "w")


def test_shots_without_split_come_from_first_rows_and_are_excluded(tmp_path):
    rows = [r for r in map(json.loads, GSM.read_text().splitlines()) if r["split"] == "test"]
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n"
                             for r in rows))
    evals, shots = gsm8k.load(TaskSpec(name="gsm8k", data=plain, limit=10), "w")
    assert [s.id for s in shots] == ["0", "1", "2", "3", "4"]
    assert [q.id for q in evals] == [str(i) for i in range(5, 15)]
    # Split-tagged file: shots from train, all 40 test rows evaluated.
    evals, shots = gsm8k.load(TaskSpec(name="gsm8k", data=GSM), "w")
    assert len(evals) == 40 and all(s.id.startswith("syn-gsm-train") for s in shots)


def test_parquet_equals_jsonl(tmp_path):
    import pandas as pd

    pq = tmp_path / "gpqa.parquet"
    pd.read_json(GPQA, lines=True).to_parquet(pq)
    a = gpqa.load(TaskSpec(name="gpqa_diamond", data=GPQA), "w")
    b = gpqa.load(TaskSpec(name="gpqa_diamond", data=pq), "w")
    assert a == b and len(a) == 24


def test_json_file_holds_an_array_of_objects_or_json_lines(tmp_path):
    rows = [json.loads(x) for x in GSM.read_text().splitlines()]
    array, lines = tmp_path / "gsm_array.json", tmp_path / "gsm_lines.json"
    array.write_text(json.dumps(rows, indent=2))  # an array spread over many lines, as json.dump writes it
    lines.write_text(GSM.read_text())             # JSON Lines under a .json name, as `datasets`' to_json writes it
    assert read_rows(array, "w") == read_rows(lines, "w") == read_rows(GSM, "w") == rows
    expected = gsm8k.load(TaskSpec(name="gsm8k", data=GSM), "w")
    assert gsm8k.load(TaskSpec(name="gsm8k", data=array), "w") == expected
    assert gsm8k.load(TaskSpec(name="gsm8k", data=lines), "w") == expected


@pytest.mark.parametrize("text, where", [
    ('[{"question": "q", "answer": "#### 1"},\n 3]', r": item 1 of the array is 3, not an object"),
    ('[{"question": "q", "answer": "#### 1"},\n {"question": }]', r":2 is not valid JSON \(Expecting value\)"),
    ('{\n  "question": "q"\n}', r":1 is not valid JSON \(Expecting property name enclosed in double quotes\)"),
    ('"q"', r":1 is a str, expected a JSON object per line"),
])
def test_a_bad_json_file_is_told_what_a_json_file_holds(tmp_path, text, where):
    bad = tmp_path / "gsm.json"
    bad.write_text(text)
    with pytest.raises(DataError, match=rf"^w: .*gsm\.json{where}; a \.json file holds one JSON array of objects, "
                                        r"or one JSON object per line \(JSON Lines\)$"):
        read_rows(bad, "w")


def test_shuffle_is_deterministic_and_seeded():
    (q,) = gpqa.load(TaskSpec(name="gpqa_diamond", data=GPQA, limit=1), "w")
    assert gpqa.messages(q, 3, 0) == gpqa.messages(q, 3, 0)
    orders = {tuple(gpqa.shuffled_options(q, r, 0)[0]) for r in range(16)}
    assert len(orders) > 4
    assert [gpqa.shuffled_options(q, r, 0) for r in range(8)] != \
        [gpqa.shuffled_options(q, r, 1) for r in range(8)]


def test_synthetic_is_deterministic_and_matches_committed_files(tmp_path):
    assert synthetic.gsm8k_rows(3, 2, 5) == synthetic.gsm8k_rows(3, 2, 5)
    assert synthetic.gsm8k_rows(3, 2, 5) != synthetic.gsm8k_rows(4, 2, 5)
    synthetic.main(["--out", str(tmp_path)])
    for name in ("gsm8k_synthetic.jsonl", "gpqa_synthetic.jsonl"):
        assert (tmp_path / name).read_text() == (DATA / name).read_text()
    golds = [gsm8k.gold_of(r["answer"], "w", r["id"])
             for r in synthetic.gsm8k_rows(0, 8, 40)]
    assert any("." in g for g in golds) and any(g.startswith("-") for g in golds)
    assert any(int(float(g)) >= 1000 for g in golds)


def test_hub_rows_map_to_splits(monkeypatch):
    # The hub itself is out of reach here; `datasets.load_dataset` is replaced below our
    # interface by real `datasets.Dataset` objects, to pin repo/config/split and the mapping.
    import datasets

    rows = [json.loads(x) for x in GSM.read_text().splitlines()]
    gpqa_rows = [json.loads(x) for x in GPQA.read_text().splitlines()]
    published = {  # the hub's GSM8K has no id or split column
        ("openai/gsm8k", "main", "test"): [{"question": r["question"], "answer": r["answer"]}
                                           for r in rows if r["split"] == "test"],
        ("openai/gsm8k", "main", "train"): [{"question": r["question"], "answer": r["answer"]}
                                            for r in rows if r["split"] == "train"],
        ("Idavidrein/gpqa", "gpqa_diamond", "train"): gpqa_rows}
    calls = []

    def load_dataset(repo, config, split):
        calls.append((repo, config, split))
        return datasets.Dataset.from_list(published[(repo, config, split)])

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")   # skips the reachability probe
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    evals, shots = gsm8k.load(TaskSpec(name="gsm8k", limit=3), "w")
    assert calls == [("openai/gsm8k", "main", "test"), ("openai/gsm8k", "main", "train")]
    assert [q.id for q in evals] == ["0", "1", "2"] and len(shots) == 5
    assert shots[0].question == rows[0]["question"]   # first train row
    qs = gpqa.load(TaskSpec(name="gpqa_diamond"), "w")
    assert calls[-1] == ("Idavidrein/gpqa", "gpqa_diamond", "train")
    assert len(qs) == 24 and qs[0].id == "syn-gpqa-000"

    def gated(repo, config, split):
        raise FileNotFoundError("Dataset 'Idavidrein/gpqa' is a gated dataset on the Hub.")

    monkeypatch.setattr(datasets, "load_dataset", gated)
    with pytest.raises(DataError, match=r"w: could not load Idavidrein/gpqa/gpqa_diamond from the "
                                        r"HF hub \(FileNotFoundError: Dataset 'Idavidrein/gpqa' is "
                                        r"a gated dataset on the Hub.\); set w to a local file"):
        gpqa.load(TaskSpec(name="gpqa_diamond"), "w")


def test_duplicate_ids_refused(tmp_path):
    from pipeline.accuracy.stage import run_accuracy

    row = {"Record ID": "r1", "Question": "q", "Correct Answer": "1", "Incorrect Answer 1": "2",
           "Incorrect Answer 2": "3", "Incorrect Answer 3": "4"}
    f = tmp_path / "dup.jsonl"
    f.write_text((json.dumps(row) + "\n") * 2)
    spec = AccuracySpec(tasks=[{"name": "gpqa_diamond", "data": f}])
    with pytest.raises(DataError, match=r"accuracy.tasks.0.data: question id 'r1' appears more "
                                        "than once; ids must be unique"):
        run_accuracy(spec, url="http://127.0.0.1:1", model="m", out_dir=tmp_path)
