"""benchmarks.kernel.gather on a CPU, under Triton's interpreter: the ceiling kernel reads exactly the bytes an
attention kernel must (every row < L of every page of K and V, through the replica's page table), no others."""

from __future__ import annotations

import json

import pytest


# TRITON_INTERPRET must be set before triton is first imported: the kernel runs in a fresh process. It prints,
# per shape, the kernel's sums and the same sums computed by torch from the pages the table names
# (gather.reference_sums).
SCRIPT = r"""
import json
import torch
from benchmarks.kernel import gather, harness
from benchmarks.kernel.shapes import Shape, tiny_shapes

shapes = tiny_shapes() + [
    # sequences over several programs (8 pages each), one ending inside a page, one of a single token
    Shape("gather-chunks", (300, 1, 129), (1, 1, 1), head_dim=32, num_q_heads=2, num_kv_heads=1, q_label="1"),
]

out = {}
for shape in shapes:
    b = harness.Batch(shape, "cpu")
    r = b.replicas - 1  # not the first replica: each replica has its own pages
    got = torch.full((shape.batch, gather.chunks(shape)), 12345, dtype=torch.int32)
    gather.gather_sums(shape, b, r, got)
    out[shape.name] = dict(got=got.tolist(), want=gather.reference_sums(shape, b, r), chunks=gather.chunks(shape))
# the same reads cut into programs of 3 pages, on 2 warps
shape = shapes[-1]
b = harness.Batch(shape, "cpu")
got = torch.full((shape.batch, gather.chunks(shape, 3)), 12345, dtype=torch.int32)
gather.gather_sums(shape, b, 0, got, pages_per_program=3, num_warps=2)
out["gather-chunks-3"] = dict(got=got.tolist(), want=gather.reference_sums(shape, b, 0, 3), chunks=gather.chunks(shape, 3))
print(json.dumps(out))
"""


def test_the_gather_ceiling_reads_each_sequences_rows_through_its_page_table(interpreted):
    proc = interpreted("-c", SCRIPT)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(res) == {"tiny-fp8", "tiny-fp16-page1", "gather-chunks", "gather-chunks-3"}
    assert res["gather-chunks"]["chunks"] == 3  # 300 tokens: 19 pages of 16, over programs of 8 pages
    assert res["gather-chunks-3"]["chunks"] == 7  # ... over programs of 3 pages
    for name, r in res.items():
        assert r["got"] == r["want"], name
        assert any(v != 0 for row in r["want"] for v in row), name  # the sums are of real data, not zeros


@pytest.mark.gpu
def test_the_gather_ceiling_kernel_on_a_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from benchmarks.kernel import gather, harness
    from benchmarks.kernel.shapes import Shape

    for shape in (Shape("gather-fp8", (3000, 1, 129, 700), (4,) * 4),  # hd256 fp8 page 16, GQA 16
                  Shape("gather-hd128", (2000, 33), (4, 4), head_dim=128, num_q_heads=16, num_kv_heads=2),
                  Shape("gather-bf16-page1", (500, 7), (1, 1), kv_dtype="bf16", page_size=1)):
        b = harness.Batch(shape, "cuda")
        got = torch.zeros(shape.batch, gather.chunks(shape), dtype=torch.int32, device="cuda")
        gather.gather_sums(shape, b, 1, got)
        assert got.tolist() == gather.reference_sums(shape, b, 1), shape.name
        assert gather.gather_us(shape, b, 3) > 0


def test_program_shapes_cut_the_longest_sequence_as_asked():
    from benchmarks.kernel import gather
    from benchmarks.kernel.shapes import select

    shape = select("16x35k")[0]  # 35,000 tokens: 2188 pages of 16
    assert gather.program_shapes(shape, [8, 32], [8, 1]) == [8, 32, 274, 2188]
    with pytest.raises(SystemExit, match="--warps: got '4,x'; allowed: comma-separated positive integers"):
        gather.main(["--warps", "4,x"])
    with pytest.raises(SystemExit, match="--pages-per-program: got '0'"):
        gather.main(["--pages-per-program", "0"])


def test_the_gather_cli_keeps_every_row_when_one_fails(tmp_path, monkeypatch):
    """A failing program shape is a row with its error; the others are timed and every row is on disk."""
    from benchmarks.kernel import gather

    def timed(shape, b, replays, pages, warps):
        if pages == 32:
            raise RuntimeError("out of memory")
        return 100.0

    monkeypatch.setattr(gather, "gather_us", timed)
    monkeypatch.setattr(gather.harness, "BatchCache", lambda device: {})
    out = tmp_path / "g.json"
    gather.main(["--shapes", "16x35k", "--pages-per-program", "8,32", "--programs-per-sequence", "8",
                 "--out", str(out)])
    rows = json.loads(out.read_text())
    assert [(r["pages_per_program"], "error" in r) for r in rows] == [(8, False), (32, True), (274, False)]
    assert rows[1]["error"] == "RuntimeError: out of memory" and rows[0]["tbps"] == pytest.approx(
        286_720_000 / 100.0 / 1e6)


def test_a_failing_gather_ceiling_keeps_vattns_rows(monkeypatch, capsys):
    """The ceiling is a reference: when it fails, the shape's vattn rows stay, without its fields. The planners'
    timing (GPU only) is stubbed; bench_shape's own bookkeeping runs."""
    from types import SimpleNamespace

    pytest.importorskip("triton")
    from benchmarks.kernel import bench, gather

    def broken(shape, b, replays):
        raise RuntimeError("no gather today")

    plan = SimpleNamespace(tensors={"num_items": SimpleNamespace(item=lambda: 128)})
    times = dict(us=1.0, plan_us=0.1, main_us=0.8, reduce_us=0.1, layer_us=0.9)
    monkeypatch.setattr(gather, "gather_us", broken)
    monkeypatch.setattr(bench, "_time_planner", lambda shape, mode, b, ws, replays: (times, lambda: plan))
    monkeypatch.setattr(bench, "_workspace", lambda shape, b, config: SimpleNamespace(
        slots=132, programs_per_sm=1, kernel_info={}, config=SimpleNamespace(), qk="split"))
    monkeypatch.setattr(bench, "_backend_name", lambda ws, b: "triton")
    batch = SimpleNamespace(device="cpu", replicas=4, l2_cold=True, gather_us=None)
    shape = bench.select("16x35k")[0]
    recs = bench.bench_shape(shape, ["balanced"], SimpleNamespace(get=lambda s: batch), replays=1, check=False)
    assert [r["planner"] for r in recs] == ["balanced"] and "gather_tbps" not in recs[0]
    assert "gather ceiling on 16x35k failed: RuntimeError: no gather today" in capsys.readouterr().err
