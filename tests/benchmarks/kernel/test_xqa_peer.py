"""benchmarks.kernel.peers.xqa_peer on a CPU: vattn's batch as flashinfer.xqa.xqa's arguments (views, page
table, seq lens, draft mask, scales), the shapes it refuses, its kernel choice, registration and prewarm; the
call itself on a GPU with FlashInfer >= 0.7 (skipped cleanly elsewhere)."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from benchmarks.kernel import bench, harness, peers
from benchmarks.kernel.peers import warmup, xqa_peer
from benchmarks.kernel.peers.xqa_peer import draft_mask, rounds_q_to_e4m3, unsupported, xqa_call
from benchmarks.kernel.shapes import Shape, select
from vattn.contract import tolerance

HAND = Shape("hand-q4", (37, 20), (4, 4), head_dim=64, num_q_heads=4, num_kv_heads=2, kv_dtype="fp8")
TABLE = torch.tensor([[5, 2, 9], [7, 1, 0]], dtype=torch.int32)  # 37 tokens: 3 pages of 16; 20: 2 pages


def hand_batch(shape):
    """q/out [T, Hq, D] with q[t, h, d] = 1000 t + 10 h + d (each element names itself), cu, seq_lens."""
    t = sum(shape.q_lens)
    q = (1000 * torch.arange(t).view(t, 1, 1) + 10 * torch.arange(shape.num_q_heads).view(1, -1, 1)
         + torch.arange(shape.head_dim).view(1, 1, -1)).float()
    cu = torch.tensor([0] + [sum(shape.q_lens[:i + 1]) for i in range(shape.batch)], dtype=torch.int32)
    return q, torch.empty_like(q), torch.tensor(shape.seq_lens, dtype=torch.int32), cu


def low_high(mask):
    return mask.to(torch.int32).tolist()


def test_uniform_q4_is_a_view_of_vattns_q_with_a_causal_draft_mask():
    q, out, lens, cu = hand_batch(HAND)
    c = xqa_call(HAND, q, out, TABLE, lens, cu, 0.125, 0.9, 1.1)
    assert c.q.shape == (2, 1, 4, 4, 64) and c.q.data_ptr() == q.data_ptr()  # [B, beam 1, n, Hq, D], no copy
    assert c.q[1, 0, 2, 3, 5].item() == 1000 * 6 + 10 * 3 + 5  # sequence 1, token 2 = row 4 + 2 of vattn's q
    assert c.out.shape == c.q.shape and c.out.data_ptr() == out.data_ptr()
    assert c.page_table is TABLE
    assert c.seq_lens.dtype == torch.uint32 and c.seq_lens.shape == (2, 1) and c.seq_lens.is_contiguous()
    assert c.seq_lens.to(torch.int64).tolist() == [[37], [20]]  # the new tokens counted, as vattn's
    assert c.q_seq_len == 4 and c.q_cu_seq_lens is None
    # [B, n, 2] uint16: one 32-bit word per row, low half first; token i sees draft tokens 0..i
    assert c.mask.dtype == torch.uint16 and c.mask.shape == (2, 4, 2)
    assert low_high(c.mask) == [[[1, 0], [3, 0], [7, 0], [15, 0]]] * 2
    # one kv_scale for K and V: logits scale q_scale x kv_scale / sqrt(D) = softmax scale x k_descale
    assert c.kv_scale == pytest.approx(1.1)
    assert c.q_scale * c.kv_scale / math.sqrt(64) == pytest.approx(0.125 * 0.9)


def test_ragged_q_stays_packed_with_cumulative_lengths_and_per_sequence_mask_rows():
    shape = Shape("hand-ragged", (70, 33, 16), (3, 1, 4), head_dim=32, num_q_heads=4, num_kv_heads=2,
                  kv_dtype="fp8", q_label="ragged")
    q, out, lens, cu = hand_batch(shape)
    c = xqa_call(shape, q, out, TABLE, lens, cu, 0.2, 0.9, 1.1)
    assert c.q is q and c.out is out  # [T, Hq, D] as is
    assert c.q_cu_seq_lens.tolist() == [0, 3, 4, 8] and c.q_cu_seq_lens.dtype == torch.int32
    assert c.q_seq_len == 4  # the batch's maximum
    assert low_high(c.mask) == [[1, 0], [3, 0], [7, 0], [1, 0], [1, 0], [3, 0], [7, 0], [15, 0]]
    assert c.seq_lens.to(torch.int64).view(-1).tolist() == [70, 33, 16]


def test_decode_q1_has_no_mask_and_a_16_bit_cache_no_kv_scale():
    shape = replace(HAND, name="hand-q1", q_lens=(1, 1), kv_dtype="bf16", q_label="1")
    q, out, lens, cu = hand_batch(shape)
    c = xqa_call(shape, q.to(torch.bfloat16), out.to(torch.bfloat16), TABLE, lens, cu, 0.125, None, None)
    assert c.q.shape == (2, 1, 4, 64) and c.mask is None and c.q_seq_len == 1 and c.q_cu_seq_lens is None
    assert c.kv_scale == 1.0 and c.q_scale == pytest.approx(0.125 * 8)


def test_draft_mask_fills_the_high_half_and_further_words():
    assert low_high(draft_mask([20], 20))[19] == [0xFFFF, 0xF]  # bits 0..19
    m = draft_mask([40], 40)
    assert m.shape == (40, 4)  # two 32-bit words per row
    assert low_high(m)[0] == [1, 0, 0, 0] and low_high(m)[39] == [0xFFFF, 0xFFFF, 0xFF, 0]
    # decoded as little-endian words, bit j of row i is vattn's rule: token i sees KV L - n + j for j <= i
    for n in range(1, 9):
        rows = low_high(draft_mask([n], n))
        for i, (lo, hi) in enumerate(rows):
            word = lo | hi << 16
            assert [bool(word >> j & 1) for j in range(n)] == [j <= i for j in range(n)]


@pytest.mark.parametrize("change,why", [
    (dict(page_size=1), "page_size 1: XQA takes 16, 32, 64, 128"),
    (dict(head_dim=72), "head_dim 72: XQA takes multiples of 16 in [16, 512]"),
    (dict(head_dim=512), "head_dim 512 > 256: XQA takes q_len 1 and G <= 16 only"),
    (dict(kv_dtype="fp16"), "kv_dtype fp16 with bf16 Q: XQA takes a 16-bit cache of Q's dtype, or e4m3"),
    (dict(seq_lens=(37, 3)), "seq_lens[1] = 3 < q_len 4: XQA's draft tokens are the last q_len positions"),
    (dict(q_lens=(1, 0)), "ragged q_lens [0, 1]: XQA's ragged path needs a maximum q_len > 1"),
    (dict(q_lens=(0, 0)), "no query tokens"),
])
def test_unsupported_shapes_say_why(change, why):
    assert unsupported(HAND) is None
    assert unsupported(replace(HAND, **change)).startswith(why)
    q, out, lens, cu = hand_batch(HAND)
    with pytest.raises(ValueError, match=r"shape hand-q4: "):
        xqa_call(replace(HAND, **change), q, out, TABLE, lens, cu, 0.1, 1.0, 1.0)


def test_a_gpu_without_xqa_kernels_is_named():
    assert unsupported(HAND, 8) == "sm8x: XQA runs on sm90, sm100 and sm12x only"
    assert unsupported(HAND, 9) is None


@pytest.mark.parametrize("name,sm,hopper", [
    ("16x35k", 9, True),  # q_len 4 x G 16 = 64 rows > 32: the Hopper fp8 kernel
    ("16x35k-q1", 9, True), ("16x35k-q8", 9, True), ("16x35k-page64", 9, True),
    ("16x35k-gqa8", 9, False),  # 4 x 8 = 32 rows: the generic kernel
    ("32x8k-hd128-gqa4", 9, False), ("16x35k-ragged", 9, False), ("16x35k-bf16", 9, False),
    ("16x35k", 10, False),
])
def test_the_hopper_fp8_kernel_is_picked_as_flashinfer_dispatches(name, sm, hopper):
    assert rounds_q_to_e4m3(select(name)[0], sm) is hopper


def test_ragged_q_builds_its_own_module_only_where_it_compiles_swap_ab_out():
    ragged16, uniform16 = select("16x35k-ragged")[0], select("16x35k")[0]
    assert max(ragged16.q_lens) == 4 and xqa_peer.module_key(ragged16) == xqa_peer.module_key(uniform16)
    ragged8, uniform8 = replace(ragged16, num_q_heads=8), replace(uniform16, num_q_heads=8)  # 4 x 8 <= 32 rows
    assert xqa_peer.module_key(ragged8) != xqa_peer.module_key(uniform8)


def test_xqa_is_a_registered_peer():
    assert "xqa" in peers.PEERS and peers.parse_peers("xqa,flashinfer") == ["xqa", "flashinfer"]


def fake_flashinfer(monkeypatch, version: str, has_xqa: bool = True):
    mods = {"flashinfer": SimpleNamespace(__version__=version),
            "flashinfer.xqa": SimpleNamespace(xqa=lambda *a, **k: None) if has_xqa else SimpleNamespace()}
    monkeypatch.setattr(xqa_peer, "import_peer", lambda module, peer: mods[module])


def test_flashinfer_before_0_7_counts_as_not_installed(monkeypatch, capsys):
    fake_flashinfer(monkeypatch, "0.6.18")
    assert xqa_peer.xqa_importable() == "xqa: not installed (flashinfer 0.6.18; needs >= 0.7)"
    b = harness.Batch(HAND, "cpu")
    assert peers.bench_peers(HAND, b, ["xqa"], replays=1, timed_graph=None) == []
    assert "peer xqa: not installed (flashinfer 0.6.18" in capsys.readouterr().err


def test_on_a_cpu_xqa_says_it_needs_cuda(monkeypatch):
    fake_flashinfer(monkeypatch, "0.7.2.post1")
    assert xqa_peer.xqa_importable() is None
    (r,) = peers.bench_peers(HAND, harness.Batch(HAND, "cpu"), ["xqa"], replays=1, timed_graph=None)
    assert r["error"] == "skipped: xqa: needs a CUDA device"


def test_default_peers_add_xqa_when_flashinfer_0_7_imports(monkeypatch):
    monkeypatch.setattr(peers, "sglang_importable", lambda: None)
    monkeypatch.setattr(peers, "xqa_importable", lambda: None)
    assert bench.default_peers()[0] == ["sglang_triton", "xqa"]
    monkeypatch.setattr(peers, "xqa_importable", lambda: "xqa: not installed (flashinfer 0.6.18; needs >= 0.7)")
    names, note = bench.default_peers()
    assert names == ["sglang_triton"] and "xqa skipped: not importable (xqa: not installed (flashinfer 0.6.18" in note


def test_prewarm_builds_one_xqa_module_per_configuration(monkeypatch):
    import subprocess

    started = []

    class Child:
        def __init__(self, argv, env):
            started.append(argv[3:])

        def wait(self, timeout):
            return 0

    monkeypatch.setattr(warmup, "importlib_find", lambda module: object())
    monkeypatch.setattr(subprocess, "Popen", Child)
    peers.prewarm(select("main,variants"), ["xqa"])
    # the hd256 G16 q4 page-16 fp8 module serves 16x35k, the agentic batches and ragged (4 x 16 > 32 rows);
    # page 1 builds nothing
    assert started == [["--warm", "xqa", s] for s in ("16x35k", "16x35k-gqa8", "32x8k-hd128-gqa8", "16x35k-q1",
                                                        "16x35k-q8", "16x35k-bf16", "16x35k-page64",
                                                        "32x8k-hd128-gqa4")]


def gpu_xqa_ready() -> bool:
    return torch.cuda.is_available() and xqa_peer.xqa_importable() is None


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_xqa_ready(), reason="needs a CUDA GPU and FlashInfer >= 0.7")
@pytest.mark.parametrize("name", ["16x35k", "16x35k-q1", "16x35k-ragged", "16x35k-bf16", "16x35k-page64",
                                  "32x8k-hd128-gqa8", "32x8k-hd128-gqa4"])
def test_xqa_matches_the_reference_on_a_gpu(name):
    """The bench's configurations (so the JIT modules built here serve the bench) on short, unequal lengths."""
    s = select(name)[0]
    shape = replace(s, name="gpu-xqa", seq_lens=tuple(200 + 131 * i for i in range(s.batch)))
    b = harness.Batch(shape, "cuda")
    prep = peers.FACTORIES["xqa"](shape, b)
    prep.run(1)  # a permuted replica: the page table matters
    rel_err, nan = harness.check(prep.out, vattn_reference(b, 1))
    lossy = rounds_q_to_e4m3(shape, torch.cuda.get_device_capability()[0])
    assert ("lossy" in prep.info) is lossy
    assert not nan and rel_err <= (peers.LOSSY_FP8_LIMIT if lossy else tolerance(shape.kv_dtype)), rel_err


def vattn_reference(b, replica):
    import vattn

    return vattn.reference(*b.attention_args(replica))
