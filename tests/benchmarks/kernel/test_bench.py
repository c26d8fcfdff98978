"""benchmarks.kernel.bench's CLI on a CPU: the baseline choice, input errors, and the dry run's records
(the timing itself needs a GPU)."""

from __future__ import annotations

import json

import pytest

from benchmarks.kernel import bench, peers


def test_sglang_triton_is_the_baseline_when_sglang_imports(monkeypatch):
    monkeypatch.setattr(peers, "sglang_importable", lambda: None)
    assert bench.sglang_baseline()[0] == ["sglang_triton"]
    monkeypatch.setattr(peers, "sglang_importable", lambda: "sglang: ModuleNotFoundError: No module named 'orjson'")
    names, note = bench.sglang_baseline()
    assert names == [] and "orjson" in note and "skipped" in note


def test_bench_cli_rejects_an_unknown_planner():
    with pytest.raises(SystemExit, match=r"--planners: got 'lean'; allowed: balanced, balanced_auto, balanced_tails, length_aware, fixed"):
        bench.main(["--planners", "lean", "--shapes", "16x35k"])


@pytest.mark.slow
def test_dry_run_writes_checked_records_for_every_planner_and_the_sdpa_peer(tmp_path, interpreted):
    """The whole bench path (BatchCache, planners, graphs stand-in, reference check, peers) on tiny shapes under
    Triton's interpreter, in a subprocess (TRITON_INTERPRET must be set before triton is imported)."""
    out = tmp_path / "dry.json"
    interpreted("-m", "benchmarks.kernel.bench", "--dry-run", "--peers", "sdpa", "--out", str(out))
    records = json.loads(out.read_text())
    vattn_rows = [r for r in records if r["impl"] == "vattn"]
    assert {(r["shape"], r["planner"]) for r in vattn_rows} == {
        (s, p) for s in ("tiny-fp8", "tiny-fp16-page1") for p in bench.PLANNER_ORDER}
    assert all(r["rel_err"] < 5e-3 and r["nan"] is False and r["device"] == "cpu-interpreter" for r in vattn_rows)
    assert {r["backend"] for r in vattn_rows} == {"triton"}  # the backend that ran the timed main kernel
    # the paged-gather ceiling, once per shape, on every planner's row (its dry-run time means nothing)
    assert all(r["gather_us"] > 0 and r["gather_tbps"] > 0 for r in vattn_rows)
    assert len({(r["shape"], r["gather_us"]) for r in vattn_rows}) == 2
    assert [r["shape"] for r in records if r["impl"] == "sdpa"] == ["tiny-fp8", "tiny-fp16-page1"]


@pytest.mark.slow
def test_dry_run_rounds_time_the_planners_in_turns(tmp_path, interpreted):
    out = tmp_path / "rounds.json"
    proc = interpreted("-m", "benchmarks.kernel.bench", "--dry-run", "--rounds", "3", "--planners",
                       "balanced,balanced_tails", "--out", str(out))
    rows = [(r["planner"], r["round"]) for r in json.loads(out.read_text()) if r["shape"] == "tiny-fp8"]
    assert rows == [("balanced", 0), ("balanced_tails", 0), ("balanced_tails", 1), ("balanced", 1),
                    ("balanced", 2), ("balanced_tails", 2)]
    assert "| tiny-fp8 | triton | balanced_tails | 3 |" in proc.stdout


def test_a_run_stamps_where_when_and_how_on_every_record():
    # a committed JSON outlives the machine: each record says its device, date, read ceiling and command
    info = bench.RunInfo("NVIDIA H200", "2026-12-06T18:30:00Z", 4.55,
                         "python -m benchmarks.kernel.bench --shapes 16x35k")
    assert info.stamp({"shape": "16x35k", "us": 86.0}) == {
        "shape": "16x35k", "us": 86.0, "command": "python -m benchmarks.kernel.bench --shapes 16x35k",
        "device": "NVIDIA H200", "date": "2026-12-06T18:30:00Z", "read_ceiling_tbps": 4.55}


def test_bench_cli_rejects_rounds_below_one(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0", "--shapes", "16x35k"])
    assert "--rounds: got 0; allowed: a positive integer" in capsys.readouterr().err


@pytest.mark.slow
def test_host_overhead_dry_run_times_every_part(tmp_path, interpreted):
    """--host-overhead's plumbing on a CPU under Triton's interpreter (its times mean nothing there)."""
    out = tmp_path / "host.json"
    proc = interpreted("-m", "benchmarks.kernel.bench", "--host-overhead", "--dry-run", "--planners", "balanced",
                       "--host-calls", "2", "--out", str(out))
    records = json.loads(out.read_text())
    # each shape with vattn's Triton kernels launched natively once bound, then by Triton's launcher
    assert [(r["shape"], r["launcher"]) for r in records] == [
        ("tiny-fp8", "native"), ("tiny-fp8", "triton"), ("tiny-fp16-page1", "native"), ("tiny-fp16-page1", "triton")]
    for part in ("call", "plan", "attention", "launch_plan", "launch_main", "launch_reduce", "attention_unbounded"):
        assert all(r[f"{part}_host_us"] > 0 for r in records), part
    # Triton's main kernel writes partials only: its reduce always runs
    assert all(r["backend"] == "triton" and r["reduce_skipped"] is False for r in records)
    assert "python" in proc.stdout


def test_host_overhead_needs_a_gpu_or_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit, match=r"--host-overhead --dry-run: set TRITON_INTERPRET=1"):
        bench.main(["--host-overhead", "--dry-run"])


def test_host_overhead_names_a_launcher_it_does_not_know(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(SystemExit, match=r"--launchers: got 'native,ctypes'; allowed: native, triton"):
        bench.main(["--host-overhead", "--dry-run", "--launchers", "native,ctypes"])
    with pytest.raises(SystemExit, match=r"--launchers: got 'triton,triton'; .* each at most once"):
        bench.main(["--host-overhead", "--dry-run", "--launchers", "triton,triton"])


def test_enqueue_us_times_its_calls_in_turns(monkeypatch):
    """The host-time parts are timed chunk by chunk in ABBA turns, so a host that slows down mid-measurement
    slows each alike: here a clock that runs 3x slower from the middle on moves both medians the same way."""
    from benchmarks.kernel import harness

    order, now = [], [0.0]
    monkeypatch.setattr(harness.time, "perf_counter", lambda: now[0])

    def fn(name, cost_us):
        def call():
            order.append(name)
            now[0] += cost_us * 1e-6 * (3 if len(order) > 2 + 40 else 1)  # halfway through the timed calls
        return call

    us = harness.enqueue_us({"a": fn("a", 2.0), "b": fn("b", 1.0)}, calls=40, device="cpu", chunk=10)
    assert order[:2] == ["a", "b"]  # one warm-up call each
    chunks = ["".join(order[i:i + 10]) for i in range(2, len(order), 10)]
    assert chunks == ["a" * 10, "b" * 10, "b" * 10, "a" * 10, "a" * 10, "b" * 10, "b" * 10, "a" * 10]
    # each median is the mean of one slow and one fast chunk: the 2:1 cost ratio survives the slowdown
    assert us["a"] == pytest.approx(2.0 * 2, rel=1e-6) and us["b"] == pytest.approx(1.0 * 2, rel=1e-6)


def test_prebuild_compiles_each_build_the_shapes_take_once(tmp_path, monkeypatch, capsys):
    """--prebuild: one build per distinct model_build among the shapes (16x35k and its ragged twin share one),
    page 1 named as Triton's, and the CUDA reduce once per head_dim; the compiles themselves stubbed (the nvcc
    builds are test_hopper's)."""
    from vattn.hopper import backend, build, prebuild, reduce
    from vattn.native import cuda
    from benchmarks.kernel.shapes import select

    compiled, reduce_head_dims = [], []

    def compile_cubin(defines):
        compiled.append(defines)
        return tmp_path / f"{len(compiled)}.cubin"

    def compile_reduce(head_dim):
        reduce_head_dims.append(head_dim)
        return tmp_path / f"reduce{head_dim}.cubin"

    monkeypatch.setattr(cuda, "CACHE", cuda.CACHE)  # --prebuild points it at its folder
    monkeypatch.setattr(build, "compile_cubin", compile_cubin)
    monkeypatch.setattr(reduce, "compile_cubin", compile_reduce)
    monkeypatch.setattr(prebuild, "ptxas_summary", lambda cubin, kernel: kernel)
    names = "16x35k,16x35k-ragged,16x35k-page1,32x8k-hd128-gqa8,16x35k-bf16"
    assert bench.main(["--shapes", names, "--prebuild", str(tmp_path)]) == 0
    assert cuda.CACHE == tmp_path
    want = {tuple(sorted(build.main_defines(**backend.model_build(s.kv_dtype, s.head_dim, s.num_q_heads,
                                                                  s.num_kv_heads, s.page_size, max(s.q_lens))).items()))
            for s in select(names) if s.page_size != 1}
    assert len(want) == 3 and {tuple(sorted(d.items())) for d in compiled} == want and len(compiled) == 3
    out = capsys.readouterr().out
    assert reduce_head_dims == [128, 256]
    assert "16x35k-page1: not covered by the Hopper kernels" in out
    assert f"3 main builds and 2 reduce builds in {tmp_path}" in out


def test_help_says_the_bench_needs_a_cuda_gpu():
    text = " ".join(bench.build_parser().format_help().split())
    assert "Needs a CUDA GPU" in text and "without one only --dry-run runs" in text
