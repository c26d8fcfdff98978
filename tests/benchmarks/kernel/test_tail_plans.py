"""benchmarks.kernel.tail_plans' command line on a CPU (the plans it compares are vattn.planner's balanced and
balanced_tails, tested in tests/vattn/test_planner.py)."""

from __future__ import annotations

import json
import re
import statistics

import pytest

from benchmarks.kernel import tail_plans


@pytest.mark.parametrize("args, message", [
    (["--sustained", "-1"], r"--sustained: got -1.0; allowed: seconds >= 0"),
    (["--sustained", "3", "--rest", "-2"], r"--rest: got -2.0; allowed: seconds >= 0"),
    (["--sustained", "3", "--dry-run"], r"--sustained: needs a CUDA GPU"),
])
def test_sustained_input_errors_name_the_field(args, message, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SystemExit):
        tail_plans.main(args)
    assert re.search(message, capsys.readouterr().err)


def test_dry_run_times_both_planners_and_checks_them_against_the_reference(tmp_path, interpreted):
    out = tmp_path / "tails.json"
    interpreted("-m", "benchmarks.kernel.tail_plans", "--dry-run", "--rounds", "2", "--replays", "1", "--out", str(out))
    records = json.loads(out.read_text())
    assert [r["plan"] for r in records] == list(tail_plans.PLANS)
    assert all(len(r["rounds"]) == 2 and r["us"] == statistics.median(r["rounds"]) and r["rel_err"] < 2e-2
               and not r["nan"] and re.fullmatch(r"\d+ pieces, largest \d+ tiles", r["pieces"]) for r in records)
    assert records[0]["faster_rounds"] is None and records[1]["faster_rounds"][1] == 2


def test_a_run_cut_short_keeps_the_records_it_measured(tmp_path, monkeypatch):
    """The probes rewrite --out after every record, so one killed mid-run (the GPU host's 10-minute limit on a
    command) keeps each shape it finished, stamped as a whole run's are."""
    from benchmarks.kernel import harness

    monkeypatch.setenv("TRITON_INTERPRET", "1")

    def measure(shapes, device, rounds, replays, sustained):
        yield dict(shape="finished", us=1.0)
        raise RuntimeError("killed mid-shape")

    out = tmp_path / "cut.json"
    with pytest.raises(RuntimeError, match="killed mid-shape"):
        harness.rounds_cli(["--dry-run", "--out", str(out)], module="benchmarks.kernel.tail_plans",
                           doc=tail_plans.__doc__, default_shapes="16x35k", default_rounds=1,
                           default_out="unused.json", header="", measure=measure, sustained=True)
    [record] = json.loads(out.read_text())
    assert record["shape"] == "finished" and record["device"] == "cpu-interpreter"
    assert record["command"] == f"python -m benchmarks.kernel.tail_plans --dry-run --out {out}"


def test_a_failed_save_leaves_the_last_whole_list(tmp_path):
    """harness.save_records writes whole or not at all: a record that cannot be written (here one JSON cannot
    encode; on the GPU host, a kill mid-write) leaves --out as the previous save left it."""
    from benchmarks.kernel import harness

    out = tmp_path / "records.json"
    harness.save_records(str(out), [dict(shape="16x35k", us=88.0)])
    with pytest.raises(TypeError):
        harness.save_records(str(out), [dict(shape="16x35k", us=88.0), dict(shape="16x119k", us=object())])
    assert json.loads(out.read_text()) == [dict(shape="16x35k", us=88.0)]
    assert [p.name for p in tmp_path.iterdir()] == ["records.json"]
