"""benchmarks/e2e/sglang_smoke.py --across on a CPU: two finished smoke runs compared server by server (the A/A
across launches against off vs on), from the files a GPU run writes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("sglang_smoke", ROOT / "benchmarks/e2e/sglang_smoke.py")
smoke = importlib.util.module_from_spec(spec)
spec.loader.exec_module(smoke)


def _answer(tokens, logprobs):
    return {"output": "".join(tokens), "tokens": tokens, "token_logprobs": logprobs}


def _run(folder: Path, off: list[dict], on: list[dict]) -> Path:
    folder.mkdir()
    for arm, answers in (("off", off), ("on", on)):
        (folder / f"{arm}.json").write_text(json.dumps({"arm": arm, "passes": [answers, answers]}))
    return folder


def test_across_pairs_each_arm_with_the_other_runs_same_arm_and_off_with_on(tmp_path, capsys):
    same = [_answer([" the", " cat"], [-1.0, -2.0]), _answer([" a", " dog"], [-0.5, -0.25])]
    drifted = [_answer([" the", " cat"], [-1.0, -2.0]), _answer([" a", " dog"], [-0.5, -0.5])]
    changed = [_answer([" the", " cow"], [-1.25, -3.0]), _answer([" a", " dog"], [-0.5, -0.25])]
    a = _run(tmp_path / "a", off=same, on=changed)
    b = _run(tmp_path / "b", off=drifted, on=changed)
    assert smoke.main(["--across", str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out/across.json").read_text())
    assert result["runs"] == {"A": str(a), "B": str(b)}
    off_aa, on_aa, off_on = result["off A vs off B"], result["on A vs on B"], result["off A vs on B"]
    assert (off_aa["identical"], off_aa["logprobs"]["moved"], off_aa["logprobs"]["max_abs"]) == (2, 1, 0.25)
    assert (on_aa["identical"], on_aa["logprobs"]["moved"]) == (2, 0)
    # " cat" against " cow": the first pair differs at its second token, over a shared " the" whose logprob moved
    assert (off_on["identical"], off_on["first_differing_token"], off_on["logprobs"]["max_abs"]) == (1, [1], 0.25)
    assert "off B vs on A: greedy outputs identical 1/2" in capsys.readouterr().out


def test_across_names_a_folder_without_a_finished_run(tmp_path, capsys):
    with pytest.raises(SystemExit):
        smoke.main(["--across", str(tmp_path), str(tmp_path), "--out", str(tmp_path / "out")])
    assert f"--across: {tmp_path} has no off.json" in capsys.readouterr().err
