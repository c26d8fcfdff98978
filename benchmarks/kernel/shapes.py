"""The benchmark shapes of KERNEL.md, and the peer numbers it records (H200, same shapes).

A shape is a batch (per-sequence KV lengths and q_lens) plus the attention config.
Lengths use k = 1000 tokens: KERNEL.md's FlashInfer rows (e.g. 16 x 35k fp8 at 207 us =
1.39 TB/s) match 35,000-token sequences, not 35,840.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

AGENTIC_BIG = 248_000  # the one long request of a skewed agentic batch
AGENTIC_SEED = 20251129


@dataclass(frozen=True)
class Shape:
    name: str
    seq_lens: tuple[int, ...]
    q_lens: tuple[int, ...]
    head_dim: int = 256
    num_q_heads: int = 16
    num_kv_heads: int = 1
    page_size: int = 16
    kv_dtype: str = "fp8"  # "fp8" | "bf16" ("fp16" in dry runs)
    q_label: str = "4"  # "1", "4", "8" or "ragged1-4"

    @property
    def batch(self) -> int:
        return len(self.seq_lens)

    @property
    def gqa(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def total_kv_tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def kv_bytes(self) -> int:
        """KV bytes the kernel must read: sum L x Hkv x D x 2 (K and V) x bytes per element."""
        return self.total_kv_tokens * self.num_kv_heads * self.head_dim * 2 * (1 if self.kv_dtype == "fp8" else 2)


def uniform(batch: int, kv_len: int, q_len: int = 4, **kw) -> Shape:
    name = kw.pop("name", f"{batch}x{_k(kv_len)}")
    return Shape(name, (kv_len,) * batch, (q_len,) * batch, q_label=str(q_len), **kw)


def _k(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else f"{n / 1000:.1f}k"


def agentic_lens(batch: int, total: int, seed: int = AGENTIC_SEED) -> list[int]:
    """One ~248k request plus a lognormal tail (seeded) summing to `total` tokens exactly; tail
    requests stay in [1k, 200k], so the 248k one is the longest (scale, clip, rescale the rest)."""
    rng = random.Random(seed)
    raw = [rng.lognormvariate(0.0, 1.0) for _ in range(batch - 1)]
    rest, lo, hi = total - AGENTIC_BIG, 1000, 200_000
    if not lo * len(raw) <= rest <= hi * len(raw):
        raise ValueError(f"total: got {total}; a tail of {len(raw)} requests in [1k, 200k] cannot hold {rest}")
    tail = [0.0] * len(raw)
    free = list(range(len(raw)))
    while free:  # water-filling: clipped entries are fixed, the free ones share what is left
        left = rest - sum(tail[i] for i in range(len(raw)) if i not in free)
        scale = left / sum(raw[i] for i in free)
        clipped = [i for i in free if not lo <= raw[i] * scale <= hi]
        for i in free:
            tail[i] = min(hi, max(lo, raw[i] * scale))
        if not clipped:
            break
        free = [i for i in free if i not in clipped]
    ints = [int(t) for t in tail]
    ints[min(range(len(ints)), key=lambda i: ints[i])] += rest - sum(ints)  # exact total
    return [AGENTIC_BIG] + ints


def agentic(batch: int, total: int, label: str) -> Shape:
    lens = tuple(agentic_lens(batch, total))
    return Shape(f"bs{batch}-agentic-{label}", lens, (4,) * batch)


def ragged(shape: Shape, seed: int = 7) -> Shape:
    """Draft-extend: q_len 1..4 per sequence, seeded."""
    rng = random.Random(seed)
    qs = tuple(rng.randint(1, 4) for _ in shape.seq_lens)
    return replace(shape, name=shape.name + "-ragged", q_lens=qs, q_label="ragged1-4")


def main_shapes() -> list[Shape]:
    """KERNEL.md's comparison shapes (hd256 fp8 GQA16 q4 page16 unless named)."""
    base = uniform(16, 35_000)
    a16, a20 = agentic(16, 1_850_000, "1.85M"), agentic(20, 2_320_000, "2.32M")
    return [
        base,
        uniform(16, 70_000),
        uniform(16, 119_000),
        uniform(4, 35_000),
        uniform(16, 35_000, num_q_heads=8, name="16x35k-gqa8"),
        uniform(32, 8_000, head_dim=128, num_q_heads=16, num_kv_heads=2, name="32x8k-hd128-gqa8"),
        a16,
        uniform(16, a16.total_kv_tokens // 16, name=f"16x{_k(a16.total_kv_tokens // 16)}-uniform-of-bs16"),
        a20,
        uniform(20, a20.total_kv_tokens // 20, name=f"20x{_k(a20.total_kv_tokens // 20)}-uniform-of-bs20"),
    ]


def variant_shapes() -> list[Shape]:
    """q_len, dtype, page-size and GQA variants on 16 x 35k."""
    base = uniform(16, 35_000)
    return [
        uniform(16, 35_000, q_len=1, name="16x35k-q1"),
        uniform(16, 35_000, q_len=8, name="16x35k-q8"),
        ragged(base),
        replace(base, name="16x35k-bf16", kv_dtype="bf16"),
        replace(base, name="16x35k-page1", page_size=1),
        replace(base, name="16x35k-page64", page_size=64),
        uniform(32, 8_000, head_dim=128, num_q_heads=8, num_kv_heads=2, name="32x8k-hd128-gqa4"),
    ]


def paired_head_shapes() -> list[Shape]:
    """Head_dim 128 with two KV heads a CTA (vattn.hopper.backend.kv_heads_per_cta): the hd128 shapes' head_dim-256
    twins, one KV head with the same bytes, pages and rows as their two heads read together, and a bf16 hd128
    batch."""
    return [uniform(32, 8_000, name="32x8k"), uniform(32, 8_000, num_q_heads=8, name="32x8k-gqa8"),
            uniform(32, 8_000, head_dim=128, num_q_heads=16, num_kv_heads=2, kv_dtype="bf16",
                    name="32x8k-hd128-gqa8-bf16")]


LONG_AMONG_SHORT = (256_000, 63, 512)  # issue 18: one long request, its count of short ones, their length


def long_among_short(q_len: int = 4, long_last: bool = False) -> Shape:
    """One 256k request among 63 of 512 tokens (hd256 fp8 page 16 GQA16, Hkv 1): the batch where one slot
    per short sequence starved the long one (issue 18); long_last puts it at the end of the batch."""
    long, n, short = LONG_AMONG_SHORT
    lens = (short,) * n + (long,) if long_last else (long,) + (short,) * n
    name = "long-among-short" + ("-last" if long_last else "") + ("" if q_len == 4 else f"-q{q_len}")
    return Shape(name, lens, (q_len,) * (n + 1), q_label=str(q_len))


def long_among_short_shapes() -> list[Shape]:
    """The long-among-short batches and their uniform twins (the same batch size and KV tokens), q4 and
    q1: `--shapes skew` times a batch and its twin in one run, so the bandwidths compare directly."""
    out = []
    for q_len in (4, 1):
        skewed = long_among_short(q_len)
        twin = skewed.total_kv_tokens // skewed.batch  # 288,256 / 64 = 4504 exactly
        suffix = "" if q_len == 4 else f"-q{q_len}"
        out += [skewed, uniform(skewed.batch, twin, q_len, name=f"long-among-short-uniform{suffix}")]
    return out + [long_among_short(4, long_last=True)]


def host_shapes() -> list[Shape]:
    """Batches of tiny sequences, whose call time is host time (`bench --host-overhead`): 64 and 1 x 128
    tokens, q4 and q1, and 64 x 24 tokens (issue 18's "every sequence under 32 tokens": its graph replay's
    device time is the record's device_us)."""
    return [uniform(64, 128, name="host-64x128"), uniform(64, 128, q_len=1, name="host-64x128-q1"),
            uniform(1, 128, name="host-1x128"), uniform(64, 24, name="host-64x24")]


def tails_rule_shapes() -> list[Shape]:
    """Batches the balanced_auto rule was not fitted to (vattn/planner.py: fitted to P117's 16x35k, 16x70k, 16x119k
    and the two agentic rows), on either side of it at the H200's 132 SMs: `tail_plans` on them says whether its
    choice of plan was the faster one. Its gain less cost: 8x35k 1.4%, 16x40k 1.3%, 16x55k 1.9% and the agentic
    ones 3-7% (packed); 16x45k 0.0%, 16x52k 1.0% (just under the margin), 32x25k -1.0% (balanced)."""
    return [uniform(8, 35_000), uniform(16, 40_000), uniform(16, 45_000), uniform(16, 52_000), uniform(16, 55_000),
            uniform(32, 25_000), agentic(16, 700_000, "0.7M"), agentic(20, 900_000, "0.9M"),
            agentic(32, 1_000_000, "1.0M")]


def uniform_grid() -> list[Shape]:
    return [uniform(b, n) for b in (1, 4, 16, 64) for n in (1_000, 8_000, 32_000, 128_000, 256_000)]


def tiny_shapes() -> list[Shape]:
    """For `--dry-run` on a CPU: small enough for Triton's interpreter."""
    return [
        Shape("tiny-fp8", (130, 0, 77), (2, 1, 3), head_dim=64, num_q_heads=4, num_kv_heads=2, q_label="ragged"),
        Shape("tiny-fp16-page1", (70, 5), (1, 1), head_dim=64, num_q_heads=2, num_kv_heads=1, page_size=1,
              kv_dtype="fp16", q_label="1"),
    ]


SHAPE_SETS = {"main": main_shapes, "variants": variant_shapes, "grid": uniform_grid, "skew": long_among_short_shapes,
              "host": host_shapes, "paired": paired_head_shapes, "tails-rule": tails_rule_shapes}

# KERNEL.md's FlashInfer 0.7.2 numbers (us) on the same H200 and shapes: fp8 prefill for q_len 4,
# decode with tensor cores for q_len 1; and its fastest configuration in time (bf16 cache) where known.
FLASHINFER_FP8_US = {"16x35k": 207, "16x70k": 385, "16x35k-gqa8": 204, "4x35k": 69, "16x119k": 638,
                     "bs16-agentic-1.85M": 619, "bs20-agentic-2.32M": 770, "32x8k-hd128-gqa8": 114,
                     "16x35k-q1": 125}
FLASHINFER_BEST_US = {"16x35k": 161, "bs20-agentic-2.32M": 595}


# Named selections across the sets. peer-table: issue 18's one-run peer table, KERNEL.md's 17 shapes with the
# tiny batches and long among short beside its uniform twin (BENCHMARKS.md's peer-table command).
SELECTIONS = {"peer-table": "main,variants,host-64x24,host-64x128,long-among-short,long-among-short-uniform"}


def select(names: str) -> list[Shape]:
    """A set's name ('main', 'variants', ...), 'all', a SELECTIONS name, or shape names, comma-separated."""
    every = {s.name: s for fn in SHAPE_SETS.values() for s in fn()}
    out: list[Shape] = []
    for item in names.split(","):
        item = item.strip()
        if item == "all":
            out += [s for fn in SHAPE_SETS.values() for s in fn()]
        elif item in SHAPE_SETS:
            out += SHAPE_SETS[item]()
        elif item in SELECTIONS:
            out += select(SELECTIONS[item])
        elif item in every:
            out.append(every[item])
        else:
            raise ValueError(f"--shapes: got {item!r}; allowed: {', '.join([*SHAPE_SETS, *SELECTIONS])}, all, "
                             f"or one of {', '.join(sorted(every))}")
    return out
