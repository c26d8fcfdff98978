"""The paged-gather ceiling: a batch's KV read through its own page tables by the plainest Triton kernel.

The streaming-read ceiling (harness.read_ceiling_tbps) reads one contiguous buffer. An attention kernel reads
pages scattered through a pool, a few KB each (page 16 of fp8 hd256: 4 KB of K and 4 KB of V), and that alone
streams slower (KERNEL.md: ~3.8 TB/s against 4.5 on an H200). This kernel reads exactly the bytes an
attention kernel must (every row < L of every page of K and V, nothing else) and sums them, so that the bench can
give each row's bandwidth as a share of a practical ceiling for this batch's layout, measured in the same run by
the same method (cold L2, one graph over the R replicas). A practical ceiling, not a bound: a cleverer reader
(the copy engine, more bytes in flight) may stream faster.
"""
from __future__ import annotations

import triton
import triton.language as tl

from benchmarks.kernel import harness
from benchmarks.kernel.harness import Batch
from benchmarks.kernel.shapes import Shape

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


def chunks(shape: Shape) -> int:
    """Programs per sequence: its longest page count over PAGES_PER_PROGRAM."""
    longest = max((-(-n // shape.page_size) for n in shape.seq_lens), default=0)
    return max(1, -(-longest // PAGES_PER_PROGRAM))


def gather_sums(shape: Shape, b: Batch, replica: int, sums) -> None:
    """One launch: sums[seq, chunk] = the int32 sum (mod 2^32) of the K and V words that sequence's rows
    < L hold in its pages chunk * PAGES_PER_PROGRAM ... (through replica `replica`'s page table)."""
    table = b.tables[replica]
    k, v = _words(b.k), _words(b.v)
    page_words = k.shape[1]
    row_words = page_words // shape.page_size
    n = chunks(shape)
    _gather_kernel[(shape.batch, n)](k, v, table, table.stride(0), b.seq_lens, sums, n, PAGE=shape.page_size,
                                    ROW_WORDS=row_words, PAGES_PER_PROG=PAGES_PER_PROGRAM,
                                    BLOCK=triton.next_power_of_2(page_words), num_warps=4)


def reference_sums(shape: Shape, b: Batch, replica: int) -> list[list[int]]:
    """gather_sums' values computed by torch on the host from the pages the table names: its oracle."""
    import torch

    page = shape.page_size
    words = [_words(c).cpu().to(torch.int64) for c in (b.k, b.v)]
    row_words = words[0].shape[1] // page
    table = b.tables[replica].cpu()
    sums = torch.zeros(shape.batch, chunks(shape), dtype=torch.int64)
    for s, n in enumerate(shape.seq_lens):
        for i in range(-(-n // page)):
            held = min(n - i * page, page) * row_words
            pid = int(table[s, i])
            sums[s, i // PAGES_PER_PROGRAM] += words[0][pid, :held].sum() + words[1][pid, :held].sum()
    return ((sums + 2**31) % 2**32 - 2**31).tolist()  # the kernel's int32 sums wrap


def gather_us(shape: Shape, b: Batch, replays: int) -> float:
    """Per replica: the median time of reading the batch's KV through every replica's page table, in one graph
    (harness.timed_graph; on a CPU one eager pass, which means nothing)."""
    import torch

    sums = torch.empty(shape.batch, chunks(shape), dtype=torch.int32, device=b.device)

    def all_replicas():
        for r in range(b.replicas):
            gather_sums(shape, b, r, sums)

    return harness.timed_graph(all_replicas, replays, b.device) / b.replicas
