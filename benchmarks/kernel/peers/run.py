"""Check, then time: every requested peer on the batch vattn just ran, one bench record each.

Each peer's output is compared with vattn.reference first: one outside KERNEL.md's tolerance is recorded as
wrong and not timed. Everything an engine does once per batch (plan, page lists, gathers) happens before
timing; FlashInfer is also timed with plan() inside (impl "<name>+plan", host-timed, as plan() syncs).
"""
from __future__ import annotations

import sys

from benchmarks.kernel import harness
from benchmarks.kernel.peers.base import PeerUnavailable
from benchmarks.kernel.peers.registry import FACTORIES
from vattn.contract import tolerance

# A peer that rounds Q (and P) to e4m3 by design (Prepared.info["lossy"] says how) lands at 3-4e-2 on an fp8
# cache: over KERNEL.md's 2e-2, so it could not replace vattn, yet it is the kernel an engine runs, and its time
# is the baseline. It is timed and marked; above this bound an output is broken, not lossy.
LOSSY_FP8_LIMIT = 0.1


def bench_peers(shape, b, names, *, replays: int, timed_graph, ref=None, skipped: dict | None = None) -> list[dict]:
    """Records (the bench's format, impl = peer name) of every peer in `names` on one shape.

    b: harness.Batch; timed_graph(fn, replays) -> us of one replay of fn (harness.timed_graph on the batch's
    device); ref: vattn.reference's output for replica 0 (computed here if None). A peer not installed is
    printed once (skipped[name] remembers why) and yields no record; one that fails or is wrong yields an
    "error" record."""
    skipped = {} if skipped is None else skipped
    ref = b.reference() if ref is None else ref
    records = []
    for name in names:
        if name in skipped:
            continue
        try:
            prep = FACTORIES[name](shape, b)
        except PeerUnavailable as exc:
            if "not installed" in str(exc):
                skipped[name] = str(exc)
                print(f"peer {exc}; skipped", file=sys.stderr, flush=True)
                continue
            records.append(_error(shape, name, f"skipped: {exc}"))
            continue
        except Exception as exc:  # a peer that breaks on this shape must not lose the run
            records.append(_error(shape, name, f"setup failed: {type(exc).__name__}: {exc}"))
            continue
        records += _check_and_time(shape, b, name, prep, ref, replays, timed_graph)
    return records


def _check_and_time(shape, b, name, prep, ref, replays, timed_graph) -> list[dict]:
    try:
        prep.run(0)
        rel_err, nan = harness.check(prep.out, ref)
    except Exception as exc:
        return [_error(shape, name, f"run failed: {type(exc).__name__}: {exc}")]
    ok = harness.within_tolerance(rel_err, nan, shape.kv_dtype)
    limit = LOSSY_FP8_LIMIT if prep.info.get("lossy") and shape.kv_dtype == "fp8" else tolerance(shape.kv_dtype)
    if nan or not rel_err <= limit:
        why = "NaN in output" if nan else f"rel_err {rel_err:.2e} > {limit:g}"
        return [dict(_error(shape, name, f"wrong output: {why} (not timed)"), rel_err=rel_err, nan=nan)]
    reps = len(b.tables)
    all_runs = lambda: [prep.run(r) for r in range(reps)]
    try:
        us, graph = timed_graph(all_runs, replays) / reps, True
    except Exception as exc:  # capture refused (a host sync inside): time eagerly instead, and say so
        print(f"peer {name}: graph capture failed ({type(exc).__name__}: {exc}); timing eagerly", file=sys.stderr)
        try:
            us, graph = harness.eager_us(all_runs, replays) / reps, False
        except Exception as exc2:
            return [dict(_error(shape, name, f"timing failed: {type(exc2).__name__}: {exc2}"), rel_err=rel_err)]
    records = [dict(_record(shape, name, prep, b, us, 0.0, rel_err, nan, graph), within_tolerance=ok)]
    if prep.plan is not None:  # the same calls with plan() inside, host-timed (plan() syncs)
        plan_us = harness.host_us(lambda: [prep.plan(r) for r in range(reps)], replays) / reps
        both = harness.host_us(lambda: [(prep.plan(r), prep.run(r)) for r in range(reps)], replays) / reps
        records.append(dict(_record(shape, name + "+plan", prep, b, both, plan_us, rel_err, nan, False),
                            planned_inside=True, within_tolerance=ok))
    return records


def _error(shape, impl: str, message: str) -> dict:
    return dict(harness.shape_fields(shape, impl, "-"), error=message)


def _record(shape, impl, prep, b, us, plan_us, rel_err, nan, graph) -> dict:
    """The bench's record: tbps counts the bytes this peer's cache holds (bf16 copies read twice fp8's)."""
    return dict(harness.shape_fields(shape, impl, "-"), kv_dtype=prep.kv_dtype, shape_kv_dtype=shape.kv_dtype, us=us,
                plan_us=plan_us, main_us=us - plan_us, reduce_us=0.0, tbps=prep.kv_bytes / us / 1e6,
                kv_bytes=prep.kv_bytes, replicas=len(b.tables), l2_cold=b.l2_cold, rel_err=rel_err, nan=nan,
                graph=graph, page_size=1 if impl.startswith("sglang") else shape.page_size, **prep.info)
