"""benchmarks.kernel.peers on a CPU: the SDPA floor against the reference, the correctness gate, clean skips."""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks.kernel import bench, harness, peers
from benchmarks.kernel.peers import base, sdpa_peer, table, warmup
from benchmarks.kernel.report import format_table
from benchmarks.kernel.shapes import Shape

TINY = Shape("tiny-peer", (70, 33, 16), (3, 1, 4), head_dim=32, num_q_heads=4, num_kv_heads=2, kv_dtype="fp16",
             q_label="ragged")


@pytest.fixture
def cpu_batch():
    def make(shape=TINY):
        return harness.Batch(shape, "cpu")

    return make


def _untimed(fn, replays):
    raise AssertionError("a peer was timed")


def test_parse_peers_names_the_bad_value():
    assert peers.parse_peers("sdpa, flashinfer") == ["sdpa", "flashinfer"]
    assert peers.parse_peers("") == []
    with pytest.raises(ValueError, match=r"--peers: got 'flashattn'; allowed: flashinfer, flashinfer_bf16"):
        peers.parse_peers("sdpa,flashattn")


def test_page_lists_rebuild_each_sequence(cpu_batch):
    b = cpu_batch()
    indptr, indices, last = base.pages(TINY, b.tables[1])
    assert indptr.tolist() == [0, 5, 8, 9] and last.tolist() == [6, 1, 16]
    assert indices[5:8].tolist() == b.tables[1][1, :3].tolist()
    slots, sptr = base.slots(TINY, b.tables[1], new_tokens=list(TINY.q_lens))  # the prefixes: L - q_len
    assert sptr.tolist() == [0, 67, 99, 111]
    assert slots[67].item() == b.tables[1][1, 0].item() * 16  # sequence 1, position 0


@pytest.mark.parametrize("kv_dtype", ["fp16", "fp8"])
def test_sdpa_floor_matches_the_reference_and_writes_a_bench_record(cpu_batch, kv_dtype):
    from dataclasses import replace

    shape = replace(TINY, kv_dtype=kv_dtype)
    b = cpu_batch(shape)
    calls = []

    def timed(fn, replays):
        calls.append(replays)
        return harness.timed_graph(fn, replays, "cpu")

    recs = peers.bench_peers(shape, b, ["sdpa"], replays=3, timed_graph=timed)
    assert len(recs) == 1 and calls == [3]
    r = recs[0]
    assert r["impl"] == "sdpa" and "error" not in r and r["rel_err"] < 1e-3 and r["nan"] is False
    # fp32 math, written in Q's dtype (fp16 on a CPU): only the output rounding remains
    assert r["us"] > 0 and r["tbps"] == pytest.approx(r["kv_bytes"] / r["us"] / 1e6)
    assert r["kv_bytes"] == shape.total_kv_tokens * 2 * 32 * 2 * 4  # fp32 copy on a CPU
    for key in ("shape", "batch", "total_kv_tokens", "head_dim", "gqa", "q_len", "page_size", "planner",
                "plan_us", "main_us", "reduce_us", "replicas", "l2_cold"):
        assert key in r
    harness.stamp(r, "cpu", "now", 1.0)
    assert "| sdpa " in format_table([r])


def test_a_wrong_peer_is_reported_wrong_and_not_timed(cpu_batch, monkeypatch):
    b = cpu_batch()

    def off_by_a_bit(shape, batch):
        good = sdpa_peer.sdpa(shape, batch)
        run = good.run
        good.run = lambda r: (run(r), good.out.mul_(1.1))
        return good

    monkeypatch.setitem(peers.FACTORIES, "sdpa", off_by_a_bit)
    (r,) = peers.bench_peers(TINY, b, ["sdpa"], replays=3, timed_graph=_untimed)
    assert r["impl"] == "sdpa" and "us" not in r
    assert r["error"].startswith("wrong output: rel_err 1.00e-01 > 0.005 (not timed)")


FP8_TINY = Shape("tiny-peer-fp8", (70, 33), (3, 4), head_dim=32, num_q_heads=4, num_kv_heads=2, kv_dtype="fp8")


@pytest.mark.parametrize("scale,timed", [(1.035, True), (1.5, False)])
def test_a_lossy_peer_is_timed_and_marked_up_to_its_bound(cpu_batch, monkeypatch, scale, timed):
    """A peer that rounds Q to e4m3 by design (info["lossy"]) is timed with its error marked over KERNEL.md's
    tolerance; past LOSSY_FP8_LIMIT it is wrong like any other."""
    def lossy(shape, batch):
        good = sdpa_peer.sdpa(shape, batch)
        run = good.run
        good.run = lambda r: (run(r), good.out.mul_(scale))
        good.info["lossy"] = "e4m3 Q"
        return good

    monkeypatch.setitem(peers.FACTORIES, "sdpa", lossy)
    (r,) = peers.bench_peers(FP8_TINY, cpu_batch(FP8_TINY), ["sdpa"], replays=1, timed_graph=lambda fn, n: 1.0)
    if timed:
        assert r["us"] > 0 and r["within_tolerance"] is False and r["lossy"] == "e4m3 Q"
        assert "**over tolerance**" in table._cell(dict(r, read_ceiling_tbps=4.5))
    else:
        assert "us" not in r and r["error"].startswith("wrong output: rel_err 5.00e-01 > 0.1 (not timed)")


def test_a_peer_that_raises_is_an_error_record(cpu_batch, monkeypatch):
    def boom(shape, batch):
        def run(r):
            raise RuntimeError("illegal memory access")

        return peers.Prepared(run, batch.out, shape.kv_dtype, shape.kv_bytes)

    monkeypatch.setitem(peers.FACTORIES, "sdpa", boom)
    (r,) = peers.bench_peers(TINY, cpu_batch(), ["sdpa"], replays=1, timed_graph=_untimed)
    assert r["error"] == "run failed: RuntimeError: illegal memory access"


def test_fa3_and_fa4_each_take_only_their_own_library(monkeypatch):
    """sglang-kernel's FA3 installed, FA4 not: fa3 is FA3 and fa4 says it is not installed (once one `fa3` peer
    took whichever of the two imported first)."""
    import sys
    import types

    from benchmarks.kernel.peers import fa3_peer

    fake = types.ModuleType("sgl_kernel.flash_attn")
    fake.flash_attn_with_kvcache = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "sgl_kernel", types.ModuleType("sgl_kernel"))
    monkeypatch.setitem(sys.modules, "sgl_kernel.flash_attn", fake)
    for absent in ("flash_attn_interface", "flash_attn_3", "flash_attn", "flash_attn.cute"):
        monkeypatch.setitem(sys.modules, absent, None)  # None in sys.modules: the import fails
    assert fa3_peer.fa_module("fa3") == (fake, "flash_attn_with_kvcache")
    with pytest.raises(peers.PeerUnavailable, match=r"^fa4: not installed \(flash_attn.cute: ModuleNotFoundError"):
        fa3_peer.fa_module("fa4")


@pytest.mark.parametrize("name,module", [("flashinfer", "flashinfer"), ("flashinfer_bf16", "flashinfer"),
                                         ("fa3", "flash_attn_interface"), ("fa4", "flash_attn"),
                                         ("xqa", "flashinfer")])
def test_missing_peers_skip_with_a_not_installed_line(cpu_batch, capsys, name, module):
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    skipped = {}
    recs = peers.bench_peers(TINY, cpu_batch(), [name], replays=1, timed_graph=_untimed, skipped=skipped)
    assert recs == [] and "not installed" in skipped[name]
    assert f"peer {name}: not installed" in capsys.readouterr().err
    # remembered: the next shape does not try the import again, nor print again
    assert peers.bench_peers(TINY, cpu_batch(), [name], replays=1, timed_graph=_untimed, skipped=skipped) == []
    assert capsys.readouterr().err == ""


def test_gpu_only_peers_say_so_on_a_cpu(cpu_batch):
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed here")
    (r,) = peers.bench_peers(TINY, cpu_batch(), ["sglang_triton"], replays=1, timed_graph=_untimed)
    assert r["error"] == "skipped: sglang_triton: needs a CUDA device (Triton kernels)"


def test_bench_cli_rejects_an_unknown_peer():
    with pytest.raises(SystemExit, match=r"--peers: got 'fi'; allowed: flashinfer"):
        bench.main(["--peers", "fi", "--shapes", "16x35k"])


def test_prewarm_builds_each_flashinfer_module_once(monkeypatch, capsys):
    import subprocess

    from benchmarks.kernel.shapes import select

    started = []

    class Child:
        def __init__(self, argv, env):
            assert argv[1:3] == ["-m", "benchmarks.kernel.peers"]  # its __main__ builds one configuration
            started.append(argv[3:])
            assert int(env["MAX_JOBS"]) >= 2

        def wait(self, timeout):
            return 0

    monkeypatch.setattr(warmup, "importlib_find", lambda module: object())
    monkeypatch.setattr(subprocess, "Popen", Child)
    monkeypatch.delenv("MAX_JOBS", raising=False)
    peers.prewarm(select("16x35k,16x35k-gqa8,16x35k-q1,16x35k-bf16"), ["flashinfer", "flashinfer_bf16",
                                                                      "flashinfer_fa3", "sdpa"])
    # fa2 prefill fp8 / bf16 (GQA8 shares GQA16's module), fa2 decode fp8 / bf16, fa3 prefill fp8 / bf16;
    # no fa3 decode (FlashInfer's decode wrapper has no fa3 backend)
    assert sorted(started) == [
        ["--warm", "flashinfer", "256", "16", "1", "bf16", "0"], ["--warm", "flashinfer", "256", "16", "1", "fp8", "0"],
        ["--warm", "flashinfer", "256", "16", "1", "fp8", "1"],
        ["--warm", "flashinfer_bf16", "256", "16", "1", "fp8", "1"],
        ["--warm", "flashinfer_fa3", "256", "16", "1", "bf16", "0"],
        ["--warm", "flashinfer_fa3", "256", "16", "1", "fp8", "0"]]
    assert "peer prewarm: 6 FlashInfer configurations" in capsys.readouterr().out


def test_peer_table_names_the_best_peer_and_says_why_a_peer_has_no_time():
    base = dict(shape="16x35k", read_ceiling_tbps=4.5, rel_err=1e-3)
    recs = [dict(base, impl="vattn", planner="balanced", us=150.0, tbps=1.9, kv_dtype="fp8", layer_us=140.0),
            dict(base, impl="vattn", planner="fixed", us=145.0, tbps=1.97, kv_dtype="fp8", layer_us=140.0),
            dict(base, impl="flashinfer", us=207.0, tbps=1.39, kv_dtype="fp8"),
            dict(base, impl="flashinfer+plan", us=260.0, tbps=1.1, kv_dtype="fp8"),
            dict(base, impl="flashinfer_bf16", us=161.0, tbps=3.6, kv_dtype="bf16"),
            dict(shape="16x35k", impl="fa3", error="wrong output: rel_err 3.00e-01 > 0.02 (not timed)"),
            dict(base, impl="sglang_triton", us=120.0, tbps=2.3, kv_dtype="fp8", rel_err=3.5e-2, within_tolerance=False)]
    text = peers.peer_table(recs)
    head, _, row = text.splitlines()
    assert head == ("| shape | vattn (best planner) | vattn per layer | flashinfer | flashinfer+plan | flashinfer_bf16 | fa3 "
                    "| sglang_triton | best peer | vattn / best peer | per layer |")
    assert row.startswith("| 16x35k | 145.0 (1.97, 44%; err 1e-03) fixed | 140.0 | 207.0 (1.39, 31%; err 1e-03) |")
    assert "| **wrong** rel_err 3.00e-01 > 0.02 |" in row
    assert "| 120.0 (2.30, 51%; err 4e-02 **over tolerance**) |" in row
    # 161 / 145 with vattn's plan, 161 / 140 without: +plan rows and peers over tolerance (the faster sglang
    # here) never count as best
    assert row.endswith("| flashinfer_bf16 (bf16) | 1.11x | 1.15x |")


def test_peer_table_without_a_per_layer_time_says_so():
    base = dict(shape="4x35k", read_ceiling_tbps=4.5, rel_err=1e-3, kv_dtype="fp8")
    recs = [dict(base, impl="vattn", planner="balanced", us=40.0, tbps=1.8),  # a record from before layer_us
            dict(base, impl="flashinfer", us=60.0, tbps=1.2)]
    row = peers.peer_table(recs).splitlines()[2]
    assert row.startswith("| 4x35k | 40.0 (1.80, 40%; err 1e-03) balanced | - |")
    assert row.endswith("| flashinfer (fp8) | 1.50x | - |")


def test_a_peer_whose_graph_capture_fails_is_timed_eagerly_and_says_so(cpu_batch, capsys):
    def no_capture(fn, replays):
        raise RuntimeError("operation not permitted when stream is capturing")

    (r,) = peers.bench_peers(TINY, cpu_batch(), ["sdpa"], replays=2, timed_graph=no_capture)
    assert r["graph"] is False and r["us"] > 0 and "error" not in r
    assert "peer sdpa: graph capture failed (RuntimeError: operation not permitted" in capsys.readouterr().err
