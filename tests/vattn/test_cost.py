"""Cost model: reproduces the measured tables it was built from, orders the planners on skewed batches,
is monotone in L, and is fast enough for the emulator (one call per decode cycle)."""
import json
import random
import time
from dataclasses import replace
from pathlib import Path

import pytest

from vattn.cost import kernel_path, load_profile, predict_attention_us
from vattn.planner import PLANNERS

PROFILES = Path(__file__).resolve().parents[2] / "configs" / "hardware"
H200, MI355X = load_profile("h200", PROFILES), load_profile("mi355x", PROFILES)
HD256 = dict(num_kv_heads=1, head_dim=256, gqa=16, kv_dtype="fp8", page_size=16)


def agentic(batch, total, longest=248_000, seed=0):
    """KERNEL.md's skewed batches: one ~248k request plus a lognormal tail, `total` tokens in all."""
    rng = random.Random(seed)
    tail = [rng.lognormvariate(0, 1) for _ in range(batch - 1)]
    rest = total - longest
    lens = [longest] + [max(64, int(rest * x / sum(tail))) for x in tail]
    return lens


# shape name -> (seq_lens, shape kwargs); KERNEL.md: hd256 fp8 GQA16 unless noted, one KV head per GPU
SHAPES = {
    "16x35k": ([35_000] * 16, HD256),
    "16x70k": ([70_000] * 16, HD256),
    "16x35k-gqa8": ([35_000] * 16, dict(HD256, gqa=8)),
    "4x35k": ([35_000] * 4, HD256),
    "16x119k": ([119_000] * 16, HD256),
    "bs16-agentic": (agentic(16, 1_850_000), HD256),
    "bs20-agentic": (agentic(20, 2_320_000), HD256),
    "32x8k-hd128": ([8_000] * 32, dict(HD256, num_kv_heads=2, head_dim=128, gqa=8)),
}
# KERNEL.md's H200 baseline table (us): FlashInfer prefill q4, FlashInfer decode q1, sglang verify_splitkv
KERNEL_TABLE = {
    "16x35k": (207, 125, 1902), "16x70k": (385, 218, 3815), "16x35k-gqa8": (204, 123, 1034),
    "4x35k": (69, 54, 544), "16x119k": (638, 356, 6445), "bs16-agentic": (619, 347, 7855),
    "bs20-agentic": (770, 432, 8830), "32x8k-hd128": (114, 73, 426),
}


def predict(lens, q_len, shape, *, impl="vattn", planner="balanced", profile=H200):
    return predict_attention_us(lens, [q_len] * len(lens), impl=impl, planner=planner, profile=profile, **shape)


def within(got, want, tol=0.15):
    return abs(got / want - 1) <= tol


def test_agentic_batches_match_kernel_md():
    assert sum(agentic(16, 1_850_000)) == pytest.approx(1_850_000, rel=1e-4)
    assert sum(agentic(20, 2_320_000)) == pytest.approx(2_320_000, rel=1e-4)


@pytest.mark.parametrize("name", SHAPES)
def test_h200_baselines_reproduce_kernel_md(name):
    lens, shape = SHAPES[name]
    fi_verify, fi_decode, sglang_verify = KERNEL_TABLE[name]
    assert H200.baseline == "flashinfer"
    got = predict(lens, 4, shape, impl="baseline")
    assert within(got, fi_verify), (got, fi_verify)
    got = predict(lens, 1, shape, impl="baseline")
    assert within(got, fi_decode), (got, fi_decode)
    got = predict(lens, 4, shape, impl="sglang_triton")
    assert within(got, sglang_verify), (got, sglang_verify)


def test_h200_flashinfer_bf16():
    # KERNEL.md: a bf16 cache: 16 x 35k 161 us, bs20 agentic 595 us
    bf16 = dict(HD256, kv_dtype="bf16")
    assert within(predict([35_000] * 16, 4, bf16, impl="baseline"), 161)
    assert within(predict(agentic(20, 2_320_000), 4, bf16, impl="baseline"), 595)


BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "h200-vattn.json"
_BA = ("2026-12-04 session 27 run BA (8a78fd7 + an L2 evict-first hint on the Triton main kernel's K and V loads, "
       "removed after; round {}, hint off")
# the runs the profile's vattn figures were fitted to (`python -m benchmarks.kernel.fit_cost --model vattn ...`, the
# profile's header): the Triton path since its loops were hoisted (2026-12-01), runs of three days
TRITON_RECORDS = ((BENCH.parent / "h200-hopper-k8.json", "2026-12-01 final: Triton path"),
                  (BENCH.parent / "h200-hopper-k8.json", "2026-12-01 session 9: the Triton path on the same shapes"),
                  (BENCH, _BA.format(1)), (BENCH, _BA.format(2)),
                  (BENCH, "2026-12-05 session 38 run BX (the tree after 3e7a4dc with VATTN_QK: Triton path, "
                          "VATTN_QK=split)"))
TINY = "host-64x24"  # left out of that fit: the profile's header says why


def triton_row(r) -> bool:
    """A balanced call that the Triton path served in its accurate mode."""
    return (r.get("impl") == "vattn" and r.get("planner") == "balanced" and r.get("backend") == "triton"
            and r.get("qk", "split") == "split")


def predict_triton_row(r, planner="balanced"):
    """The model's call for a bench row, planned with the occupancy its kernel had (programs_per_sm), as the
    emulator plans with the compiled kernel's."""
    from benchmarks.kernel.shapes import select

    s = select(r["shape"])[0]
    assert s.total_kv_tokens == r["total_kv_tokens"]
    return predict_attention_us(list(s.seq_lens), list(s.q_lens), impl="vattn", planner=planner,
                                profile=replace(H200, slots_per_sm=r["programs_per_sm"]), num_kv_heads=s.num_kv_heads,
                                head_dim=s.head_dim, gqa=s.gqa, kv_dtype=s.kv_dtype, page_size=s.page_size)


def test_h200_vattn_fits_its_triton_rows():
    # the fit's 31 rows (13 shapes) within 5%, their rms within 3% (the profile's: 4.3%, 2.3%)
    rows = [r for path, run in TRITON_RECORDS for r in json.loads(path.read_text())
            if r.get("run", "").startswith(run) and triton_row(r) and r["shape"] != TINY]
    assert len(rows) == 31
    errors = {(r["run"][:40], r["shape"]): predict_triton_row(r) / r["us"] - 1 for r in rows}
    assert max(map(abs, errors.values())) <= 0.05, errors
    assert (sum(e * e for e in errors.values()) / len(errors)) ** 0.5 <= 0.03


def test_h200_vattn_fits_every_triton_path_run_since():
    """Every balanced call of the Triton path's own runs since its loop was hoisted (2026-12-01), fitted or not
    (16x35k at page 1 in 19 runs, q8, bf16, long among short, the tiny batch) within 10%. The Triton calls
    of VATTN_HOPPER=1 runs are left out: that backend's workspace planned them."""
    rows = [r for path in sorted(BENCH.parent.glob("h200-*.json")) for r in json.loads(path.read_text())
            if triton_row(r) and r.get("date", "") >= "2026-12-01" and "VATTN_HOPPER=1" not in r.get("run", "")]
    assert len(rows) >= 70 and len({r["shape"] for r in rows}) >= 15
    bad = [(r["run"][:40], r["shape"], round(predict_triton_row(r), 1), round(r["us"], 1))
           for r in rows if not within(predict_triton_row(r), r["us"], 0.10)]
    assert not bad, bad


def test_h200_vattn_orders_the_planners_as_measured():
    """fixed and length_aware were last timed on the Triton kernel before its loop was hoisted (runs B, E and F,
    2026-11-29), beside balanced in each invocation: the model's ratio of each to balanced is within 7% of the
    measured, but on bs20 agentic under fixed, measured 2.95x balanced, which the model puts at 2.3x (as the
    profile before it did): slower by far either way."""
    rows = [r for r in json.loads(BENCH.read_text()) if r.get("default_config") and r["impl"] == "vattn"]
    balanced = {(r["run"], r["shape"]): r for r in rows if r["planner"] == "balanced"}
    ratios = {}
    for r in rows:
        if r["planner"] != "balanced":
            b = balanced[r["run"], r["shape"]]
            ratios[r["shape"], r["planner"]] = (predict_triton_row(r, r["planner"]) / predict_triton_row(b),
                                                r["us"] / b["us"])
    assert len(ratios) == 34
    far = ratios.pop(("bs20-agentic-2.32M", "fixed"))
    assert far[1] > 2.9 and far[0] > 2.2
    bad = {k: (round(m, 3), round(g, 3)) for k, (m, g) in ratios.items() if not within(m, g, 0.07)}
    assert not bad, bad


def bench_batch(r):
    """seq_lens as measured (agentic rows) or uniform; ragged q_lens as benchmarks.kernel.shapes.ragged draws them."""
    lens = r.get("seq_lens") or [r["total_kv_tokens"] // r["batch"]] * r["batch"]
    assert sum(lens) == r["total_kv_tokens"]
    if r["q_len"] == "ragged1-4":
        rng = random.Random(7)
        return lens, [rng.randint(1, 4) for _ in lens]
    return lens, [int(r["q_len"])] * len(lens)


# the runs the profile's vattn_hopper figures were fitted to (`python -m benchmarks.kernel.fit_cost --run ...`): the
# one-run peer table on the CUDA reduce, taken twice on one machine
HOPPER_RECORDS = (("h200-peers.json", "2026-12-04 session 31 run BG"),  # KERNEL.md's 17 shapes, the tiny batches
                  ("h200-peers.json", "2026-12-04 session 31 run BH"))  # and long among short, in each run


def hopper_records():
    """vattn's VATTN_HOPPER=1 balanced rows of the fitted runs."""
    rows = []
    for name, run in HOPPER_RECORDS:
        rows += [r for r in json.loads((BENCH.parent / name).read_text())
                 if r.get("run", "").startswith(run) and r["impl"] == "vattn"]
    assert len(rows) == 42 and {r["planner"] for r in rows} == {"balanced"}
    return rows


def test_h200_vattn_hopper_fits_its_bench_rows():
    # every row the Hopper kernels served within 7%, their rms within 3% (the profile's: 6.2%, 2.6%); the largest
    # error is 16x119k's, whose call took 276.2 us in one run and 256.0 in the other (the call's spread on the long
    # rows, BENCHMARKS.md). Page 1 took the Triton path on the GPU, and takes the Triton model here.
    from vattn.hopper.backend import covers_shape

    bad, errors = [], []
    for r in hopper_records():
        lens, qs = bench_batch(r)
        shape = dict(num_kv_heads=r["num_kv_heads"], head_dim=r["head_dim"], gqa=r["gqa"], kv_dtype=r["kv_dtype"],
                     page_size=r["page_size"])
        got = predict_attention_us(lens, qs, impl="vattn_hopper", planner="balanced", profile=H200, **shape)
        if not covers_shape(r["kv_dtype"], r["head_dim"], r["page_size"], max(qs) * r["gqa"], r["gqa"]):
            assert r["backend"] != "hopper_sm90"
            assert got == predict_attention_us(lens, qs, impl="vattn", planner="balanced", profile=H200, **shape)
            continue
        assert r["backend"] == "hopper_sm90"
        errors.append(got / r["us"] - 1)
        if not within(got, r["us"], 0.07):
            bad.append((r["shape"], round(got, 1), round(r["us"], 1)))
    assert not bad, bad
    assert len(errors) == 40 and (sum(e * e for e in errors) / len(errors)) ** 0.5 <= 0.03


# balanced against balanced_tails on both paths, the layer (main + reduce) timed in alternating rounds on one
# H200 (`benchmarks.kernel.tail_plans`, session 43)
TAILS = BENCH.parent / "h200-balanced-tails.json"


def tails_burst_changes() -> dict[tuple[str, str], tuple[float, float]]:
    """(shape, impl) -> (the model's change of balanced_tails against balanced, the burst rounds' change)."""
    from benchmarks.kernel.shapes import select

    rows = [r for r in json.loads(TAILS.read_text())
            if r["run"] == "2026-12-06 session 43 tail_plans" and r["sustained_s"] is None]
    us = {(r["shape"], r["backend"], r["plan"]): r["us"] for r in rows}
    out = {}
    for shape_name, backend, _ in (k for k in us if k[2] == "balanced"):
        s = select(shape_name)[0]
        impl = "vattn_hopper" if backend == "hopper_sm90" else "vattn"
        model = [predict_attention_us(list(s.seq_lens), list(s.q_lens), impl=impl, planner=p, profile=H200,
                                      num_kv_heads=s.num_kv_heads, head_dim=s.head_dim, gqa=s.gqa,
                                      kv_dtype=s.kv_dtype, page_size=s.page_size)
                 for p in ("balanced", "balanced_tails")]
        out[shape_name, impl] = (model[1] / model[0] - 1,
                                 us[shape_name, backend, "balanced_tails"] / us[shape_name, backend, "balanced"] - 1)
    return out


def test_h200_model_follows_balanced_tails_in_the_burst_rounds():
    """The model orders the two planners as the bursts did: within 2 points of each row's measured change (0 to
    -5.2%; the largest miss 16x70k's on the Hopper path, -1.8% against -0.2%), and no change where the plans are
    the same. The model has no power cap: at the cap a call's time is its joules (P110), and there the packed
    plan's 16 more CTAs gained less or lost (the same file's sustained rows: 16x119k +0.7%, bs20 -1.7%, against
    the model's -2.3% and -4.5%), so on a loaded server the emulator overstates its gain by up to ~3 points of
    attention time."""
    burst = tails_burst_changes()
    assert len(burst) == 12
    bad = {k: (round(m, 4), round(g, 4)) for k, (m, g) in burst.items() if abs(m - g) > 0.02}
    assert not bad, bad
    for same_plan in (("long-among-short", "vattn_hopper"), ("32x8k-hd128-gqa8", "vattn_hopper")):
        assert burst[same_plan][0] == 0.0 and abs(burst[same_plan][1]) < 0.005


def test_vattn_hopper_models_two_kv_heads_a_cta_at_head_dim_128(monkeypatch):
    """Where the backend reads two KV heads of 128 a CTA, the model plans half the programs on the head_dim-256
    kernel's path: faster than one head a CTA, as measured (run AM: 54.7 -> 50.9 us, 52.5 -> 49.7)."""
    from vattn.hopper import backend

    shape = dict(num_kv_heads=2, head_dim=128, kv_dtype="fp8", page_size=16)
    times = {}
    for pack in (False, True):
        monkeypatch.setattr(backend, "PACK_KV_HEADS", pack)
        # GQA 8 and 4, and GQA 16, whose twice 64 rows at q_len 4 exceed a CTA: one head a CTA either way
        times[pack] = [predict_attention_us([8_000] * 32, [4] * 32, impl="vattn_hopper", planner="balanced",
                                            profile=H200, gqa=g, **shape) for g in (8, 4, 16)]
    assert all(p < 0.97 * u for p, u in zip(times[True][:2], times[False][:2])), times
    assert times[True][2] == times[False][2]


def test_vattn_hopper_needs_a_profile_that_models_it():
    assert MI355X.vattn_hopper is None
    with pytest.raises(ValueError, match=r"impl: got 'vattn_hopper'; profile mi355x has no vattn_hopper model"):
        predict([35_000] * 16, 4, HD256, impl="vattn_hopper", profile=MI355X)
    # on the H200 the Hopper path is the faster one, as measured (16x35k: 98.6 against 131.6 us)
    assert predict([35_000] * 16, 4, HD256, impl="vattn_hopper") < 0.8 * predict([35_000] * 16, 4, HD256)


def test_the_lossy_qk_mode_has_its_own_kernel_paths():
    """VATTN_QK=e4m3: the split-Q paths become one-pass paths, timed by their own figures (run BO's and run BX's
    main kernels: ~3% faster on the Hopper path, 7-12% on the Triton path) or refused by name where the profile
    has none."""
    from vattn.kernel import default_config

    assert kernel_path([4] * 3, 16, "fp8", 256, "e4m3") == ("fp8x1", 64)
    assert kernel_path([1], 16, "fp8", 256, "e4m3") == ("fp8x1_kmajor", 16)
    assert kernel_path([4, 1], 8, "fp8", 256, "e4m3") == ("fp8to16", 32)  # K widened: Q not split, nothing to drop
    assert default_config(256, 64, True, "e4m3").qk_fp8 == 1 and default_config(256, 32, True, "e4m3").qk_fp8 == 0
    lens = [35_000] * 16
    split = predict_attention_us(lens, [4] * 16, impl="vattn_hopper", planner="balanced", profile=H200, **HD256)
    fast = predict_attention_us(lens, [4] * 16, impl="vattn_hopper", planner="balanced", profile=H200, qk="e4m3",
                                **HD256)
    assert 0.95 * split < fast < 0.99 * split
    triton = {qk: predict_attention_us(lens, [4] * 16, impl="vattn", planner="balanced", profile=H200, qk=qk, **HD256)
              for qk in ("split", "e4m3")}
    assert 0.88 * triton["split"] < triton["e4m3"] < 0.95 * triton["split"]  # run BX: 133.0 -> 122.8 us
    no_figures = replace(H200, vattn=replace(H200.vattn, dot_tflops={k: v for k, v in H200.vattn.dot_tflops.items()
                                                                     if not k.startswith("fp8x1")}))
    with pytest.raises(ValueError, match=r"kernel path: fp8x1 \(64 rows, fp8 cache\) has no path_tbps/dot_tflops in "
                                         r"the profile; .*VATTN_QK=e4m3's"):
        predict_attention_us(lens, [4] * 16, impl="vattn", planner="balanced", profile=no_figures, qk="e4m3",
                             **HD256)


def test_h200_kernel_paths_follow_the_default_config():
    # vattn.kernel.default_config: split-Q fp8 from 64 packed rows (K-major at 16 rows and hd256), fp8
    # widened otherwise, bf16 as stored; the loops whose row offsets it hoists are paths of their own
    from vattn.kernel import default_config

    for q_lens, gqa, kv, hd, want in (([4] * 3, 16, "fp8", 256, ("fp8x2", 64)), ([4, 1], 8, "fp8", 256, ("fp8to16", 32)),
                                      ([1], 16, "fp8", 256, ("fp8x2_kmajor", 16)),
                                      ([1], 4, "fp8", 128, ("fp8to16_hoisted", 16)),
                                      ([4], 4, "fp8", 128, ("fp8to16_hoisted", 16)), ([8], 16, "fp8", 256, ("fp8x2_wide", 128)),
                                      ([4], 16, "bf16", 256, ("bf16", 64))):
        assert kernel_path(q_lens, gqa, kv, hd) == want
        cfg = default_config(hd, max(q_lens) * gqa, kv == "fp8")
        assert (cfg.qk_fp8 == 2, cfg.kmajor) == (want[0].startswith("fp8x2"), want[0] == "fp8x2_kmajor")
        assert cfg.hoist_rows == (want[0] in ("fp8x2", "fp8to16_hoisted"))  # the hoisted loops have their own paths
    # GQA8 q4 reads fewer bytes per row than GQA16 q4 but is slower per byte (BENCHMARKS.md: 1.45 vs 1.90 TB/s)
    gqa8 = predict([35_000] * 16, 4, dict(HD256, gqa=8))
    assert gqa8 > predict([35_000] * 16, 4, HD256)


def test_mi355x_reproduces_design_md():
    # DESIGN.md per-layer times: sglang Triton 131.6 / 261 / 197 us; reference kernel 67 / 105 us;
    # bs20 agentic: fixed planner 482 us -> length-aware 254 us.
    assert MI355X.baseline == "sglang_triton"
    for lens, shape, want in (([35_000] * 16, HD256, 131.6), ([70_000] * 16, HD256, 261),
                              ([35_000] * 16, dict(HD256, gqa=8), 197)):
        assert within(predict(lens, 4, shape, impl="baseline", profile=MI355X), want)
    assert within(predict([35_000] * 16, 4, HD256, profile=MI355X, planner="length_aware"), 67)
    assert within(predict([70_000] * 16, 4, HD256, profile=MI355X, planner="length_aware"), 105)
    bs20 = agentic(20, 2_320_000)
    fixed = predict(bs20, 4, HD256, profile=MI355X, planner="fixed")
    aware = predict(bs20, 4, HD256, profile=MI355X, planner="length_aware")
    assert within(fixed, 482) and within(aware, 254)
    assert fixed / aware == pytest.approx(482 / 254, rel=0.1)


@pytest.mark.parametrize("profile", [H200, MI355X], ids=["h200", "mi355x"])
@pytest.mark.parametrize("lens", [agentic(16, 1_850_000), agentic(20, 2_320_000), [248_000] + [5] * 15],
                         ids=["bs16-agentic", "bs20-agentic", "248k+15x5"])
def test_skewed_batches_order_the_planners(profile, lens):
    t = {p: predict(lens, 4, HD256, planner=p, profile=profile) for p in PLANNERS}
    assert t["fixed"] > 1.2 * t["length_aware"]
    assert t["balanced"] <= t["length_aware"]


def test_balanced_beats_length_aware_when_seg_max_binds():
    # one 248k request among short ones: length_aware is stuck at SEG_MAX pieces of the long one
    lens = [248_000] + [5] * 15
    assert predict(lens, 4, HD256, planner="balanced") < 0.8 * predict(lens, 4, HD256, planner="length_aware")


LENGTHS = [1, 63, 64, 65, 1000, 2000, 4096, 4097, 8000, 16_000, 35_000, 70_000, 131_072, 262_144]


def sweep(batch, impl, planner, profile, lengths=LENGTHS):
    return [predict([L] * batch, 4, HD256, impl=impl, planner=planner, profile=profile) for L in lengths]


@pytest.mark.parametrize("profile", [H200, MI355X], ids=["h200", "mi355x"])
def test_monotone_in_seq_len(profile):
    for batch in (1, 4, 16):
        times = sweep(batch, "baseline", "fixed", profile)
        assert all(a < b for a, b in zip(times, times[1:])), times
        # vattn's plans change granularity with L (piece counts and sizes jump at tile boundaries), so a
        # longer batch may plan differently: balanced is only held within 10% of monotone.
        times = sweep(batch, "vattn", "balanced", profile)
        assert all(a <= b * 1.1 for a, b in zip(times, times[1:])), times
        for planner in PLANNERS:  # once the pieces are long, only bytes matter
            times = sweep(batch, "vattn", planner, profile, LENGTHS[-5:])
            assert all(a < b for a, b in zip(times, times[1:])), (planner, times)
    # growing one sequence of a skewed batch never makes the call faster
    base = agentic(20, 2_320_000)
    for impl, planner in [("baseline", "fixed")] + [("vattn", p) for p in PLANNERS]:
        times = [predict(base[:5] + [L] + base[6:], 4, HD256, impl=impl, planner=planner, profile=profile)
                 for L in (1, 10_000, 50_000, 100_000, 200_000, 300_000)]
        assert all(a <= b * (1 + 1e-9) for a, b in zip(times, times[1:])), (impl, planner, times)


def test_empty_and_absent_sequences():
    for impl in ("vattn", "baseline"):
        empty = predict([0, 0], 4, HD256, impl=impl)
        assert 0 < empty < 50
        # q_len 0: the sequence is absent from the call, whatever its L
        with_absent = predict_attention_us([35_000, 200_000], [4, 0], impl=impl, planner="balanced",
                                           profile=H200, **HD256)
        assert with_absent == pytest.approx(predict([35_000], 4, HD256, impl=impl))


def test_fast_enough_for_the_emulator():
    rng = random.Random(1)
    batches = [[int(rng.lognormvariate(10.5, 1.2)) + 1 for _ in range(64)] for _ in range(20)]
    for planner in PLANNERS:
        start = time.perf_counter()
        for lens in batches:
            predict(lens, 4, HD256, planner=planner)
        per_call_us = (time.perf_counter() - start) / len(batches) * 1e6
        # measured 50-300 us (B=16..64) on this 2-core box under load 6; 2 ms leaves room for CI
        assert per_call_us < 2000, (planner, per_call_us)
    # 8 KV heads x 64 sequences = 512 programs > 264 slots: the queueing path, ~0.8 ms under load here
    hkv8 = dict(HD256, num_kv_heads=8, head_dim=128, gqa=2)
    start = time.perf_counter()
    for lens in batches:
        predict(lens, 4, hkv8)
    assert (time.perf_counter() - start) / len(batches) < 5e-3


def test_profile_errors(tmp_path):
    with pytest.raises(ValueError, match=r"profile: got 'h100'; no file .*h100.yaml; known: h200, mi355x"):
        load_profile("h100", PROFILES)
    with pytest.raises(ValueError, match=r"profile: got 'h200', a name; pass profiles_dir to look it up"):
        load_profile("h200")
    with pytest.raises(ValueError, match=r"impl: got 'fa3'; allowed: vattn, vattn_hopper, baseline, flashinfer, sglang_triton"):
        predict([10], 4, HD256, impl="fa3")
    with pytest.raises(ValueError, match=r"planner: got 'lean'; allowed: fixed, length_aware, balanced"):
        predict([10], 4, HD256, planner="lean")
    with pytest.raises(ValueError, match=r"kv_dtype: got 'int8'; allowed: fp8, fp8_e4m3, bf16, fp16"):
        predict([10], 4, dict(HD256, kv_dtype="int8"))
    with pytest.raises(ValueError, match=r"page_size: got 8; profile h200 knows \[1, 16, 64\]"):
        predict([10], 4, dict(HD256, page_size=8))
    with pytest.raises(ValueError, match=r"kv_dtype/phase: got fp8/decode; profile h200 baseline sglang_triton "
                                         r"was measured for fp8/verify"):
        predict([10], 1, HD256, impl="sglang_triton")
    config_dir = PROFILES
    fast = tmp_path / "fast.yaml"  # the MI355X profile is still solved from one calibration point
    fast.write_text((config_dir / "mi355x.yaml").read_text().replace("tbps: 4.279", "tbps: 7.9"))
    with pytest.raises(ValueError, match=r"calibration: 7.9 TB/s at 16 x 35000 needs a .* TB/s wave, above the "
                                         r"read ceiling"):
        load_profile(str(fast))
    text = (config_dir / "h200.yaml").read_text()
    nopath = tmp_path / "nopath.yaml"
    nopath.write_text(text.replace("    bf16: 436.0", ""))
    with pytest.raises(ValueError, match=r"kernel path: bf16 \(64 rows, bf16 cache\) has no path_tbps/dot_tflops "
                                         r"in the profile; it knows \['fp8to16', 'fp8to16_hoisted', 'fp8x1', "
                                         r"'fp8x1_kmajor', 'fp8x1_wide', 'fp8x2', 'fp8x2_kmajor', 'fp8x2_wide'\]"):
        predict([10], 4, dict(HD256, kv_dtype="bf16"), profile=load_profile(str(nopath)))
    broken = tmp_path / "broken.yaml"
    broken.write_text(text.replace("baseline: flashinfer", "baseline: fa3"))
    with pytest.raises(ValueError, match=r"broken.yaml.baseline: got 'fa3'; allowed: flashinfer, sglang_triton"):
        load_profile(str(broken))
    broken.write_text(text.replace("phase: decode", "phase: extend"))
    with pytest.raises(ValueError, match=r"broken.yaml.baselines.flashinfer\[1\]: got phase 'extend', kv_dtype 'fp8'; "
                                         r"allowed: phase verify, decode, any"):
        load_profile(str(broken))
    broken.write_text(text.replace("  piece_latency_us:", "  piece_latency_seconds:"))
    with pytest.raises(ValueError, match=r"broken.yaml.vattn: .*unexpected keyword argument 'piece_latency_seconds'"):
        load_profile(str(broken))


def test_profile_is_frozen():
    with pytest.raises(AttributeError):
        H200.sms = 1
    slower = replace(H200, vattn=replace(H200.vattn, dot_tflops={k: f / 2 for k, f in H200.vattn.dot_tflops.items()}))
    assert predict([35_000] * 16, 4, HD256, profile=slower) > predict([35_000] * 16, 4, HD256)


def test_makespan_hand_worked():
    from vattn.cost import _makespan_us

    # one wave, 4 slots, wave 4 bytes/us: no boost -> each program at 1 byte/us, the longer one sets the time
    assert _makespan_us([(10, 1), (20, 1)], 1, 4, 4.0, 1.0) == pytest.approx(20)
    # boost 4: both at 2 until the short one ends (t=5), then the long one alone at 4: 10 more bytes in 2.5 us
    assert _makespan_us([(10, 1), (20, 1)], 1, 4, 4.0, 4.0) == pytest.approx(7.5)
    # two slots, three programs: the third waits for a slot (launch order), then runs alone
    assert _makespan_us([(10, 3)], 1, 2, 2.0, 1.0) == pytest.approx(20)
    assert _makespan_us([(10, 3)], 1, 2, 2.0, 2.0) == pytest.approx(15)
    # copies are the KV heads, the fast axis: 2 heads x 2 runs on 3 slots -> launch order a0 a1 b0 | b1
    assert _makespan_us([(6, 1), (12, 1)], 2, 3, 3.0, 1.0) == pytest.approx(18)


def test_makespan_sm_sharing_hand_worked():
    from vattn.cost import _makespan_us

    # 3 SMs x 2 slots, wave 6 bytes/us (1 per slot), boost 1.5: with a programs running each streams at
    # 1 + 0.5 x max(0, (3 - a) / 2). Three programs of 10 bytes: 3 >= SMs, no boost, 10 us
    assert _makespan_us([(10, 3)], 1, 6, 6.0, 1.5, sms=3) == pytest.approx(10)
    # a lone program gets the whole boost: 20 bytes at 1.5
    assert _makespan_us([(20, 1)], 1, 6, 6.0, 1.5, sms=3) == pytest.approx(20 / 1.5)
    # 10 and 30 bytes: both at 1.25 until the short one ends (8 us), then 20 more bytes alone at 1.5
    assert _makespan_us([(10, 1), (30, 1)], 1, 6, 6.0, 1.5, sms=3) == pytest.approx(8 + 20 / 1.5)
    # one slot per SM: nothing to share, no boost
    assert _makespan_us([(20, 1)], 1, 2, 2.0, 1.5, sms=2) == pytest.approx(20)
