"""`python -m benchmarks.kernel.peers --warm NAME HEAD_DIM HQ HKV KV_DTYPE Q1` (or `--warm xqa SHAPE`): build
one FlashInfer configuration (the child process of warmup.prewarm)."""
from __future__ import annotations

import sys

from benchmarks.kernel.peers.warmup import warm_one, warm_shape


def main(argv: list[str]) -> int:
    if len(argv) == 7 and argv[0] == "--warm":
        name, *rest = argv[1:]
        warm_one(name, *(int(x) if x.isdigit() else x for x in rest))
        return 0
    if len(argv) == 3 and argv[0] == "--warm":
        warm_shape(argv[1], argv[2])
        return 0
    sys.exit("usage: python -m benchmarks.kernel.peers --warm NAME HEAD_DIM HQ HKV KV_DTYPE Q1\n"
             "       python -m benchmarks.kernel.peers --warm NAME SHAPE")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
