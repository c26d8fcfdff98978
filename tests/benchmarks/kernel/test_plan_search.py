"""benchmarks.kernel.plan_search on the CPU: every launch shape's plan is checked against plan_python."""

import json

import pytest

from benchmarks.kernel.plan_search import parse_launch


def test_every_launch_shape_plans_like_plan_python_under_interpreter(tmp_path, interpreted):
    out = tmp_path / "plan-search.json"
    interpreted("-m", "benchmarks.kernel.plan_search", "--shapes", "host-64x24", "--planners", "balanced,balanced_tails",
                "--backends", "hopper,triton", "--launch", "2:8:64,4:16:128", "--rounds", "1", "--device", "cpu",
                "--out", str(out))
    records = json.loads(out.read_text())
    assert [(r["backend"], r["planner"], r["launch"]) for r in records] == [
        (b, p, s) for b in ("hopper", "triton") for p in ("balanced", "balanced_tails")
        for s in ("default", "2:8:64", "4:16:128")]
    assert all(r["matches_plan_python"] and len(r["rounds"]) == 1 for r in records)
    assert {r["device"] for r in records} == {"cpu (Triton's interpreter)"}
    assert all(r["command"].endswith(f"--device cpu --out {out}") and r["date"].endswith("Z") for r in records)
    # host-64x24: a batch of 64 plans on 4 warps, 8 caps a round, 128 items a step
    assert {(r["num_warps"], r["ncand"], r["block_w"]) for r in records if r["launch"] == "default"} == {(4, 8, 128)}


@pytest.mark.parametrize("text", ["2:8", "3:8:64", "2:8:x", "0:8:64"])
def test_a_bad_launch_shape_names_the_flag_and_what_is_allowed(text):
    with pytest.raises(SystemExit, match=r"--launch: got .*; allowed: default or WARPS:NCAND:BLOCK_W"):
        parse_launch(text)
