"""The paged-gather ceiling: a batch's KV read through its own page tables by the plainest Triton kernel.

The streaming-read ceiling (harness.read_ceiling_tbps) reads one contiguous buffer. An attention kernel reads
pages scattered through a pool, a few KB each (page 16 of fp8 hd256: 4 KB of K and 4 KB of V), and that alone
streams slower (KERNEL.md: ~3.8 TB/s against 4.5 on an H200). This kernel reads exactly the bytes an
attention kernel must (every row < L of every page of K and V, nothing else) and sums them, so that the bench can
give each row's bandwidth as a share of a practical ceiling for this batch's layout, measured in the same run by
the same method (cold L2, one graph over the R replicas). A practical ceiling, not a bound: a cleverer reader
(the copy engine, more bytes in flight) may stream faster.

How fast the same pages stream depends on how the reading is cut into programs (many short programs keep more
reads in flight than one long stream an SM); to compare program shapes on the GPU:

    python -m benchmarks.kernel.gather --shapes 16x35k,16x119k --pages-per-program 8,32 --programs-per-sequence 8
"""
from __future__ import annotations

import argparse
import json
import sys

import triton
import triton.language as tl

from benchmarks.kernel import harness
from benchmarks.kernel.harness import Batch
from benchmarks.kernel.shapes import Shape, select

# pages one program reads in turn (a few tens of KB): enough programs to fill the GPU on 16-sequence batches,
# few enough that each streams for a while
PAGES_PER_PROGRAM = 8


@triton.jit
def _gather_kernel(k_ptr, v_ptr, table_ptr, stride_tb, seq_lens_ptr, sums_ptr, n_chunks,
                   PAGE: tl.constexpr, ROW_WORDS: tl.constexpr, PAGES_PER_PROG: tl.constexpr, BLOCK: tl.constexpr):
    # program (b, c): sequence b's pages c * PAGES_PER_PROG ...; the caches are viewed as int32 words, a page
    # holding PAGE rows of ROW_WORDS words (all KV heads of one token)
    b = tl.program_id(0)
    c = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    first = c * PAGES_PER_PROG
    last = tl.minimum(tl.cdiv(seq_len, PAGE), first + PAGES_PER_PROG)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.int32)
    for i in range(first, last):
        page = tl.load(table_ptr + b * stride_tb + i).to(tl.int64)
        held = offs < tl.minimum(seq_len - i * PAGE, PAGE) * ROW_WORDS  # the last page's rows past L: not read
        base = page * (PAGE * ROW_WORDS)
        acc += tl.load(k_ptr + base + offs, mask=held, other=0) + tl.load(v_ptr + base + offs, mask=held, other=0)
    tl.store(sums_ptr + b * n_chunks + c, tl.sum(acc, axis=0))


def _words(cache):
    """The cache as int32 words, [pages, page * row words]: every row is whole words (head_dim x element size
    is a multiple of 4 for every shape here)."""
    import torch

    return cache.view(cache.shape[0], -1).view(torch.int32)


def longest_pages(shape: Shape) -> int:
    return max((-(-n // shape.page_size) for n in shape.seq_lens), default=0)


def chunks(shape: Shape, pages_per_program: int = PAGES_PER_PROGRAM) -> int:
    """Programs per sequence: its longest page count over pages_per_program."""
    return max(1, -(-longest_pages(shape) // pages_per_program))


def gather_sums(shape: Shape, b: Batch, replica: int, sums, pages_per_program: int = PAGES_PER_PROGRAM,
                num_warps: int = 4) -> None:
    """One launch: sums[seq, chunk] = the int32 sum (mod 2^32) of the K and V words that sequence's rows
    < L hold in its pages chunk * pages_per_program ... (through replica `replica`'s page table)."""
    table = b.tables[replica]
    k, v = _words(b.k), _words(b.v)
    page_words = k.shape[1]
    row_words = page_words // shape.page_size
    n = chunks(shape, pages_per_program)
    _gather_kernel[(shape.batch, n)](k, v, table, table.stride(0), b.seq_lens, sums, n, PAGE=shape.page_size,
                                    ROW_WORDS=row_words, PAGES_PER_PROG=pages_per_program,
                                    BLOCK=triton.next_power_of_2(page_words), num_warps=num_warps)


def reference_sums(shape: Shape, b: Batch, replica: int, pages_per_program: int = PAGES_PER_PROGRAM) -> list[list[int]]:
    """gather_sums' values computed by torch on the host from the pages the table names: its oracle."""
    import torch

    page = shape.page_size
    words = [_words(c).cpu().to(torch.int64) for c in (b.k, b.v)]
    row_words = words[0].shape[1] // page
    table = b.tables[replica].cpu()
    sums = torch.zeros(shape.batch, chunks(shape, pages_per_program), dtype=torch.int64)
    for s, n in enumerate(shape.seq_lens):
        for i in range(-(-n // page)):
            held = min(n - i * page, page) * row_words
            pid = int(table[s, i])
            sums[s, i // pages_per_program] += words[0][pid, :held].sum() + words[1][pid, :held].sum()
    return ((sums + 2**31) % 2**32 - 2**31).tolist()  # the kernel's int32 sums wrap


def gather_us(shape: Shape, b: Batch, replays: int, pages_per_program: int = PAGES_PER_PROGRAM,
              num_warps: int = 4) -> float:
    """Per replica: the median time of reading the batch's KV through every replica's page table, in one graph
    (harness.timed_graph; on a CPU one eager pass, which means nothing)."""
    import torch

    sums = torch.empty(shape.batch, chunks(shape, pages_per_program), dtype=torch.int32, device=b.device)

    def all_replicas():
        for r in range(b.replicas):
            gather_sums(shape, b, r, sums, pages_per_program, num_warps)

    return harness.timed_graph(all_replicas, replays, b.device) / b.replicas


def program_shapes(shape: Shape, pages_per_program: list[int], programs_per_sequence: list[int]) -> list[int]:
    """The pages a program reads, for each --pages-per-program and each --programs-per-sequence (the longest
    sequence cut into that many programs, as the main kernel cuts a sequence into pieces)."""
    return list(pages_per_program) + [-(-longest_pages(shape) // n) for n in programs_per_sequence]


def _ints(flag: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{flag}: got {text!r}; allowed: comma-separated positive integers")
    if any(v < 1 for v in values):
        raise SystemExit(f"{flag}: got {text!r}; allowed: comma-separated positive integers")
    return values


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="The paged-gather ceiling by program shape, on a GPU")
    ap.add_argument("--shapes", default="16x35k", help="shape names or sets, as benchmarks.kernel.bench's")
    ap.add_argument("--pages-per-program", default=str(PAGES_PER_PROGRAM), help="comma-separated page counts")
    ap.add_argument("--programs-per-sequence", default="", help="comma-separated program counts a sequence")
    ap.add_argument("--warps", default="4", help="comma-separated num_warps")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--out", default="gather.json")
    a = ap.parse_args(argv)
    per_program = _ints("--pages-per-program", a.pages_per_program)
    per_sequence = _ints("--programs-per-sequence", a.programs_per_sequence)
    warps = _ints("--warps", a.warps)
    batches = harness.BatchCache("cuda")
    records = []
    for shape in select(a.shapes):
        for pages in program_shapes(shape, per_program, per_sequence):
            for nw in warps:
                rec = dict(shape=shape.name, pages_per_program=pages, programs=shape.batch * chunks(shape, pages),
                           num_warps=nw)
                try:
                    rec["us"] = gather_us(shape, batches.get(shape), a.replays, pages, nw)
                    rec["tbps"] = shape.kv_bytes / rec["us"] / 1e6
                except Exception as e:  # keep the other rows
                    rec["error"] = f"{type(e).__name__}: {e}"
                records.append(rec)
                print(json.dumps(rec), flush=True)
                with open(a.out, "w") as f:  # after every row: a crash keeps the rows before it
                    json.dump(records, f, indent=1)
    print(f"{'shape':24s} {'pages/program':>13s} {'programs':>8s} {'warps':>5s} {'us':>8s} {'TB/s':>5s}")
    for r in records:
        timing = f"{r['us']:8.1f} {r['tbps']:5.2f}" if "us" in r else f"error: {r['error'][:200]}"
        print(f"{r['shape']:24s} {r['pages_per_program']:13d} {r['programs']:8d} {r['num_warps']:5d} {timing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
