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


def test_a_search_cut_short_keeps_the_shapes_it_finished(tmp_path, monkeypatch):
    """--out is rewritten after every shape, so a search killed mid-run (the GPU host's limit on a command)
    keeps the shapes it finished, stamped as a whole run's are."""
    from benchmarks.kernel import plan_search

    def run_shape(shape, device, backend, planners, launches, rounds):
        if shape.name != "host-64x24":
            raise RuntimeError("killed mid-shape")
        return [dict(shape=shape.name, backend=backend, planner="balanced", launch="default", num_warps=4, ncand=8,
                     block_w=128, items=64, matches_plan_python=True, rounds=[1.0])]

    monkeypatch.setattr(plan_search, "run_shape", run_shape)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda: "probe")
    out = tmp_path / "cut.json"
    with pytest.raises(RuntimeError, match="killed mid-shape"):
        plan_search.main(["--shapes", "host-64x24,16x35k", "--out", str(out)])
    [record] = json.loads(out.read_text())
    assert record["shape"] == "host-64x24" and record["device"] == "probe" and record["date"].endswith("Z")
