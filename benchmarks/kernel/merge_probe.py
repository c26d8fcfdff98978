"""What a reduce fused into the main kernel would cost: one program merging a whole sequence's partials.

vattn's reduce is a kernel of its own behind the main kernel: on 16x35k it adds ~4 us to each call (NOTES P65),
most of it waiting for the whole main grid and starting its programs. Fused, the last CTA of each sequence to
finish would merge the sequence's partials itself (P pieces of ROWS x D fp32, in L2 since the main kernel just
wrote them), on one SM. This probe times exactly that merge, one program a sequence, next to vattn's reduce on
the same partials, both with the partials in L2 (each graph replays the same launch, so the first leaves them
there); with one sequence alone, the program's rate is one SM's read rate from L2.

    python -m benchmarks.kernel.merge_probe --sequences 1,16 --pieces 8 --rows 64 --head-dim 256
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import triton
import triton.language as tl

from benchmarks.kernel import harness

LAUNCHES = 8  # launches a graph: the graph's own launch is spread over them


@triton.jit
def _merge_kernel(o_part_ptr, lse_part_ptr, out_ptr, PIECES: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr,
                  BLOCK_R: tl.constexpr):
    # program s merges sequence s's PIECES partials [ROWS, D] (rows s * PIECES ...), BLOCK_R rows at a time with
    # every piece's rows loaded at once (PIECES x BLOCK_R x D values in flight), as vattn's reduce weighs them
    s = tl.program_id(0)
    p = tl.arange(0, PIECES)
    r = tl.arange(0, BLOCK_R)
    d = tl.arange(0, D)
    first = s * PIECES
    for r0 in range(0, ROWS, BLOCK_R):
        rows = r0 + r
        lse = tl.load(lse_part_ptr + (first + p)[:, None] * ROWS + rows[None, :])  # [PIECES, BLOCK_R]
        o = tl.load(o_part_ptr + ((first + p)[:, None, None] * ROWS + rows[None, :, None]) * D + d[None, None, :])
        m = tl.max(lse, axis=0)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        w = tl.math.exp2(lse - m_safe[None, :])  # [PIECES, BLOCK_R]
        acc = tl.sum(w[:, :, None] * o, axis=0)
        l = tl.sum(w, axis=0)
        res = tl.where(l[:, None] > 0.0, acc / tl.where(l > 0.0, l, 1.0)[:, None], 0.0)
        tl.store(out_ptr + (s * ROWS + rows[:, None]) * D + d[None, :], res.to(out_ptr.dtype.element_ty))


def merge(o_part, lse_part, out, pieces: int, block_r: int = 4, num_warps: int = 8) -> None:
    """o_part [S * pieces, rows, D] fp32, lse_part [S * pieces, rows] (log2 units), out [S, rows, D]: one program a
    sequence."""
    seqs, rows, d = out.shape
    _merge_kernel[(seqs,)](o_part, lse_part, out, PIECES=pieces, ROWS=rows, D=d, BLOCK_R=block_r,
                           num_warps=num_warps)


def reference(o_part, lse_part, pieces: int):
    """vattn.rounding's merge of each sequence's partials, in float64."""
    import torch

    from vattn.rounding import merge_partials

    o, lse = o_part.double(), lse_part.double()
    seqs = range(o_part.shape[0] // pieces)
    return torch.stack([merge_partials([(o[s * pieces + p], lse[s * pieces + p]) for p in range(pieces)])
                        for s in seqs]).float()


def run(seqs: int, pieces: int, rows: int, head_dim: int, gqa: int, replays: int, device: str = "cuda") -> dict:
    """The probe's merge and vattn's reduce (launch_reduce as the Hopper path calls it) on the same partials."""
    import torch

    from vattn import kernel as K

    g = torch.Generator(device="cpu").manual_seed(0)
    o_part = torch.randn(seqs * pieces, rows, head_dim, generator=g).to(device)
    lse_part = (torch.randn(seqs * pieces, rows, generator=g) * 4).to(device)
    out = torch.empty(seqs, rows, head_dim, dtype=torch.bfloat16, device=device)
    merge(o_part, lse_part, out, pieces)
    ref = reference(o_part, lse_part, pieces)
    rec = dict(sequences=seqs, pieces=pieces, rows=rows, head_dim=head_dim, partial_bytes=o_part.numel() * 4,
               rel_err_probe=harness.check(out, ref)[0])
    # vattn's reduce reads [W, Hkv, QROWS, D] partials and writes [T, Hq, D]: one KV head, rows = q_len x gqa
    q_len = rows // gqa
    cu = torch.arange(seqs + 1, dtype=torch.int32, device=device) * q_len
    part_start = torch.arange(seqs + 1, dtype=torch.int32, device=device) * pieces
    out_red = torch.empty(seqs * q_len, gqa, head_dim, dtype=torch.bfloat16, device=device)
    o4, lse3 = o_part.view(seqs * pieces, 1, rows, head_dim), lse_part.view(seqs * pieces, 1, rows)

    def reduce():
        K.launch_reduce(o4, lse3, part_start, cu, out_red, gqa=gqa, max_q_len=q_len, skip_whole=True)

    reduce()
    rec["rel_err_reduce"] = harness.check(out_red.view(seqs, rows, head_dim), ref)[0]
    if device == "cuda":
        rec["probe_us"] = harness.timed_graph(lambda: [merge(o_part, lse_part, out, pieces)
                                                        for _ in range(LAUNCHES)], replays) / LAUNCHES
        rec["reduce_us"] = harness.timed_graph(lambda: [reduce() for _ in range(LAUNCHES)], replays) / LAUNCHES
        rec["probe_gbps_per_program"] = pieces * rows * head_dim * 4 / rec["probe_us"] / 1e3
        rec["device"] = torch.cuda.get_device_name(0)
    rec["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sequences", default="1,16", help="comma-separated: sequences (one program each) at once; "
                    "their partials must fit in L2 (60 MB on an H200) for the timing to mean what it says")
    ap.add_argument("--pieces", type=int, default=8, help="partials a sequence (16x35k: 8)")
    ap.add_argument("--rows", type=int, default=64, help="rows a partial: q_len x GQA (16x35k: 64)")
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--gqa", type=int, default=16, help="for vattn's reduce: rows = q_len x gqa")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--out", default=None, help="write the records as a JSON list")
    a = ap.parse_args(argv)
    if a.rows % a.gqa or a.rows % 4:
        ap.error(f"--rows: got {a.rows}; must be a multiple of 4 and of --gqa ({a.gqa})")
    if a.pieces & (a.pieces - 1) or a.head_dim & (a.head_dim - 1):
        ap.error(f"--pieces, --head-dim: got {a.pieces}, {a.head_dim}; each must be a power of two (Triton's ranges)")
    recs = []
    for seqs in (int(x) for x in a.sequences.split(",")):
        r = run(seqs, a.pieces, a.rows, a.head_dim, a.gqa, a.replays)
        recs.append(r)
        print(f"{seqs} sequences x {a.pieces} pieces of {a.rows}x{a.head_dim}: probe {r['probe_us']:.1f} us "
              f"({r['probe_gbps_per_program']:.0f} GB/s a program), vattn reduce {r['reduce_us']:.1f} us, rel_err "
              f"{r['rel_err_probe']:.1e} / {r['rel_err_reduce']:.1e}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(recs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
