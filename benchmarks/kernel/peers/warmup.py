"""FlashInfer's JIT: build every module a run needs at once, in child processes, before timing anything.

FlashInfer JIT-builds each (backend, dtypes, head_dim) module at first use, 35-40 s each on the H200's nvcc;
built one by one inside the sweep they would eat most of a 10-minute call. One child process per distinct
configuration (`python -m benchmarks.kernel.peers --warm ...`) builds them side by side (16 cores) into
FLASHINFER_WORKSPACE_BASE's cache. XQA (`xqa`) builds one module per (cache dtype, page size, head_dim, G,
q_len): its children are named by a shape of the run that needs the module (`--warm xqa SHAPE`).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import replace

from benchmarks.kernel.harness import Batch
from benchmarks.kernel.peers.base import PeerUnavailable
from benchmarks.kernel.peers.registry import FACTORIES
from benchmarks.kernel.peers.xqa_peer import module_key, unsupported
from benchmarks.kernel.shapes import Shape, select

WARM_MODULE = "benchmarks.kernel.peers"  # its __main__ builds one: --warm NAME HEAD_DIM HQ HKV KV_DTYPE Q1,
# or --warm xqa SHAPE


def importlib_find(module: str):
    return importlib.util.find_spec(module)


def _jobs(shapes, flashinfer_peers) -> list[tuple]:
    """One job per module: backend, decode or prefill, the cache's dtype, head_dim (G is a runtime value)."""
    jobs = {}
    for n in flashinfer_peers:
        for s in shapes:
            q1 = int(all(q == 1 for q in s.q_lens))
            kv = "bf16" if n == "flashinfer_bf16" else s.kv_dtype
            if not (q1 and n == "flashinfer_fa3"):  # FlashInfer's decode wrapper has no fa3 backend
                jobs.setdefault((n == "flashinfer_fa3", q1, kv, s.head_dim),
                                (n, s.head_dim, s.num_q_heads, s.num_kv_heads, s.kv_dtype, q1))
    return sorted(jobs.values())


def _xqa_jobs(shapes) -> list[tuple]:
    """One job per XQA module (xqa_peer.module_key), named by the first shape needing it; shapes XQA cannot
    run (page 1, ...) build nothing."""
    jobs = {}
    for s in shapes:
        if unsupported(s) is None:
            jobs.setdefault(module_key(s), ("xqa", s.name))
    return list(jobs.values())


def prewarm(shapes, names, timeout_s: int = 420) -> None:
    """Build the FlashInfer modules (XQA's too) that `names` need on `shapes`, side by side, within timeout_s."""
    fi = [n for n in names if n.startswith("flashinfer")]
    jobs = _jobs(shapes, fi) + (_xqa_jobs(shapes) if "xqa" in names else [])
    if not jobs or importlib_find("flashinfer") is None:
        return
    env = os.environ.copy()
    # ninja's default -j (cores + 2) in every child would start ~18 nvcc per module at once: out of memory
    env.setdefault("MAX_JOBS", str(max(2, (os.cpu_count() or 16) // len(jobs) + 1)))
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-m", WARM_MODULE, "--warm", *map(str, j)], env=env) for j in jobs]
    for j, p in zip(jobs, procs):
        try:
            rc = p.wait(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
        if rc != 0:
            print(f"peer prewarm {j}: exit {rc} (the bench builds it at first use instead)", file=sys.stderr)
    print(f"peer prewarm: {len(jobs)} FlashInfer configurations in {time.perf_counter() - t0:.0f} s", flush=True)


def warm_one(name: str, head_dim: int, hq: int, hkv: int, kv_dtype: str, q1: int) -> None:
    """One child's job: prepare and run the peer once on a tiny batch of the configuration (CUDA)."""
    q = 1 if q1 else 4
    _warm(name, Shape("warm", (100, 37), (q, q), head_dim=head_dim, num_q_heads=hq, num_kv_heads=hkv,
                      kv_dtype=kv_dtype))


def warm_shape(name: str, shape_name: str) -> None:
    """One child's job: the peer once on the named shape's configuration with 100-token sequences (CUDA)."""
    s = select(shape_name)[0]
    _warm(name, replace(s, name="warm", seq_lens=tuple(max(100, q) for q in s.q_lens)))


def _warm(name: str, shape: Shape) -> None:
    import torch

    b = Batch(shape, "cuda")
    b.tables = b.tables[:1]  # a tiny batch gets 256 replicas for cold L2; one wrapper is all a build needs
    try:
        prep = FACTORIES[name](shape, b)
    except PeerUnavailable as exc:
        print(f"peer prewarm: {exc}", file=sys.stderr)
        return
    prep.run(0)
    torch.cuda.synchronize()
