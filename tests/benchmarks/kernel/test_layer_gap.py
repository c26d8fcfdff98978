"""benchmarks.kernel.layer_gap on a CPU: what each chain runs between its replicas, the dry run's records and the
CLI's input errors (the timing itself needs a GPU)."""

from __future__ import annotations

import json
import re
import statistics

import pytest

from benchmarks.kernel import layer_gap


def test_each_chain_puts_its_kernel_between_one_replicas_attention_and_the_next(monkeypatch):
    """The probe's point: the three chains differ only in what runs before each replica's attention call (nothing,
    a one-element add, the plan), each replica reading the pool through its own page table, on the one plan."""
    torch = pytest.importorskip("torch")
    import vattn
    from benchmarks.kernel import harness
    from benchmarks.kernel.shapes import tiny_shapes

    shape = tiny_shapes()[0]
    b = harness.BatchCache("cpu").get(shape)
    calls, plans = [], []

    def plan(*args, **kwargs):
        plans.append(object())
        calls.append("plan")
        return plans[-1]

    def attention(*args, plan, out):
        replica = [r for r in range(b.replicas) if args[3] is b.tables[r]]  # its own page table
        calls.append(("attention", replica, plan, out is b.out))

    monkeypatch.setattr(vattn, "plan", plan)
    monkeypatch.setattr(vattn, "attention", attention)
    tick = torch.zeros(1)
    fns = layer_gap.chains(shape, b, tick)
    assert list(fns) == list(layer_gap.VARIANTS) and calls == ["plan"]  # the one plan every chain runs on
    each = [("attention", [r], plans[0], True) for r in range(b.replicas)]
    for name, between in zip(layer_gap.VARIANTS, ([], [], ["plan"])):
        calls.clear()
        fns[name]()
        assert calls == [c for r in each for c in between + [r]], name
    assert tick.item() == b.replicas  # the add ran once before each replica, in its chain only


@pytest.mark.slow
def test_dry_run_writes_a_record_per_chain_with_each_rounds_time(tmp_path, interpreted):
    out = tmp_path / "gap.json"
    interpreted("-m", "benchmarks.kernel.layer_gap", "--dry-run", "--rounds", "2", "--replays", "1", "--out", str(out))
    records = json.loads(out.read_text())
    assert [(r["shape"], r["variant"]) for r in records] == [("tiny-fp8", v) for v in layer_gap.VARIANTS]
    assert all(len(r["rounds"]) == 2 and r["us"] == statistics.median(r["rounds"]) and r["us"] > 0
               and r["device"] == "cpu-interpreter" and "--rounds 2" in r["command"] for r in records)


@pytest.mark.parametrize("args, message", [
    (["--rounds", "0"], r"--rounds: got 0; allowed: a positive integer"),
    (["--replays", "-1"], r"--replays: got -1; allowed: a positive integer"),
    (["--dry-run"], r"--dry-run: set TRITON_INTERPRET=1"),
])
def test_bad_input_names_the_field_and_what_is_allowed(args, message, capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit):
        layer_gap.main(args)
    assert re.search(message, capsys.readouterr().err)
