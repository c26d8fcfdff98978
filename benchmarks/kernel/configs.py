"""Main-kernel variants (vattn.kernel.MainConfig) as the benchmarks name, parse, sweep and pick them.

A config is written as integers, block_n,num_warps,num_stages,qk_fp8,prefetch_pages[,kmajor[,hoist_rows
[,split_tail[,lazy_rescale]]]] (`--config` of the bench, `--configs` of the SASS counter), and labelled
in result tables as e.g. vattn[bn64,w4,s2,qk8x2,pf,hoist].
"""
from __future__ import annotations

from dataclasses import replace

from benchmarks.kernel.harness import within_tolerance
from benchmarks.kernel.shapes import Shape

CONFIG_FIELDS = "block_n,num_warps,num_stages,qk_fp8,prefetch_pages[,kmajor[,hoist_rows[,split_tail[,lazy_rescale]]]]"

# The variants --sweep tries, as main_config's fields. BENCHMARKS.md's version log has the variants measured
# and dropped (fp8 P.V, bf16 partials, 8 warps, block_n 32/128, PDL, interleaved tiles).
SWEEP_GRID = ((64, 4, 2, 2, 1, 0, 0, 0, 0), (64, 4, 2, 2, 1, 0, 1, 0, 0), (64, 4, 2, 2, 1, 0, 1, 1, 0),
              (64, 4, 2, 2, 1, 0, 1, 0, 1), (64, 4, 2, 2, 1, 0, 1, 1, 1), (64, 4, 2, 2, 1, 1, 0, 0, 0),
              (64, 4, 2, 2, 1, 1, 1, 1, 1), (64, 4, 3, 0, 0, 0, 0, 0, 0), (64, 4, 3, 0, 0, 0, 1, 0, 0),
              (64, 4, 3, 0, 0, 0, 1, 1, 1))


def main_config(block_n, warps, stages, qk_fp8, prefetch, kmajor=0, hoist_rows=0, split_tail=0, lazy_rescale=0):
    """A MainConfig from the integers of the command-line form."""
    from vattn.kernel import MainConfig

    return MainConfig(block_n=block_n, num_warps=warps, num_stages=stages, qk_fp8=qk_fp8,
                      prefetch_pages=bool(prefetch), kmajor=bool(kmajor), hoist_rows=bool(hoist_rows),
                      split_tail=bool(split_tail), lazy_rescale=bool(lazy_rescale))


def parse_config(text: str | None):
    """`--config`'s value -> MainConfig (None for none); a malformed one exits with the expected form."""
    if not text:
        return None
    try:
        values = [int(x) for x in text.split(",")]
        if not 5 <= len(values) <= 9:
            raise ValueError
        return main_config(*values)
    except ValueError:
        raise SystemExit(f"--config: got {text!r}; expected {CONFIG_FIELDS} (integers), e.g. 64,4,2,2,1,1,1,1,1")


def label(c) -> str:
    """The config's name in result rows (impl column of a sweep)."""
    return (f"vattn[bn{c.block_n},w{c.num_warps},s{c.num_stages}"
            f"{['', ',qk8', ',qk8x2'][int(c.qk_fp8)]}{',pf' if c.prefetch_pages else ''}"
            f"{',kmaj' if c.kmajor else ''}{',hoist' if c.hoist_rows else ''}{',split' if c.split_tail else ''}"
            f"{',lazy' if c.lazy_rescale else ''}]")


def sweep_configs():
    """Main-kernel variants tried by --sweep (fp8 matrix paths only matter with fp8 KV)."""
    return [main_config(*fields) for fields in SWEEP_GRID]


def best_of_sweep(records: list[dict]):
    """Fastest swept config within KERNEL.md's tolerance for its KV dtype; None if none qualifies."""
    from vattn.kernel import MainConfig

    ok = [r for r in records if "error" not in r and within_tolerance(r.get("rel_err"), r.get("nan"), r["kv_dtype"])]
    return MainConfig(**min(ok, key=lambda r: r["us"])["config"]) if ok else None


def for_shape(config, shape: Shape):
    """A template config adapted to a shape: warps by its acc size, fp8 QK only with fp8 KV."""
    if config is None:
        return None
    from vattn.kernel import default_config

    rows = max(shape.q_lens) * shape.gqa
    warps = default_config(shape.head_dim, rows, shape.kv_dtype == "fp8").num_warps
    return replace(config, num_warps=warps, qk_fp8=config.qk_fp8 if shape.kv_dtype == "fp8" else 0)
