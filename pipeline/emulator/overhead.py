"""Measure the emulator's own Python cost per cycle under a heavy batch.

    python -m pipeline.emulator.overhead [--batch 64] [--max-context 256000] [--tokens 300] [--vattn 0|1]

Starts a real emulator, streams `batch` requests whose prompts range up to `max-context` tokens
(whitespace mode, cheap prefill so decode is reached quickly), then reports, over the cycles that ran
the full batch: the Python work before each sleep (admission, sampling, cost model: overhead_us),
the modelled step time, the event loop's wake-up lateness, and the server's whole CPU time per cycle
(HTTP and streaming included) as a fraction of the modelled step.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(url: str, lens: list[int], tokens: int, pid: int) -> tuple[float, float, int]:
    """Stream all requests; returns the server's CPU seconds, wall seconds and cycles of the decode phase
    (from the moment every request has its first token to the end)."""
    import httpx

    started = 0
    mark: list = []

    async def one(client, n: int, i: int):
        nonlocal started
        body = {"model": "emu", "prompt": f"r{i} " + "w " * (n - 1), "max_tokens": tokens, "stream": True,
                "ignore_eos": True}
        first = True
        async with client.stream("POST", "/v1/completions", json=body) as r:
            async for _ in r.aiter_lines():
                if first:
                    first, started = False, started + 1
                    if started == len(lens):
                        mark.extend([_cpu_s(pid), time.monotonic(), (await client.get("/server_info")).json()["cycles"]])

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await asyncio.gather(*(one(client, n, i) for i, n in enumerate(lens)))
        cycles = (await client.get("/server_info")).json()["cycles"]
    return _cpu_s(pid) - mark[0], time.monotonic() - mark[1], cycles - mark[2]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-context", type=int, default=256_000)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--vattn", choices=("0", "1"), default="1")
    ap.add_argument("--port", type=int, default=0, help="0 = a free port")
    a = ap.parse_args()
    a.port = a.port or _free_port()
    # Lengths spread geometrically from 1k to max-context: one long tail, many short, as in agentic batches.
    lens = [int(1000 * (a.max_context / 1000) ** (i / max(1, a.batch - 1))) for i in range(a.batch)]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "cycles.jsonl"
        cmd = [sys.executable, "-m", "pipeline.emulator", "--port", str(a.port), "--model", "emu", "--cycle-log",
               str(log), "--max-running-requests", str(a.batch), "--chunked-prefill-size", "1048576",
               "--prefill-attention-tflops", "100000", "--non-attn-per-token-us", "0"]
        proc = subprocess.Popen(cmd, env={**os.environ, "VATTN": a.vattn}, stderr=open(Path(tmp) / "server.log", "w"))
        try:
            _wait(f"http://127.0.0.1:{a.port}/health", proc)
            cpu, wall, n_decode = asyncio.run(_load(f"http://127.0.0.1:{a.port}", lens, a.tokens, proc.pid))
        finally:
            proc.terminate()
            proc.wait(30)
        cycles = [json.loads(x) for x in log.read_text().splitlines()]
    full = [c for c in cycles if c["batch"] == a.batch]
    step = statistics.median(c["step_us"] for c in full)
    over = [c["overhead_us"] for c in full]
    print(f"batch {a.batch}, contexts {lens[0]}..{lens[-1]} ({sum(lens)} KV tokens), VATTN={a.vattn}: "
          f"{len(cycles)} cycles, {len(full)} with the full batch")
    print(f"modelled step median {step:.0f} us; pre-sleep Python work median {statistics.median(over):.0f} us, "
          f"p90 {_pct(over, 0.9):.0f} us ({statistics.median(over) / step:.1%} of the step)")
    print(f"wake-up lateness median {statistics.median(c['lag_us'] for c in full):.0f} us; decode phase: server "
          f"CPU {cpu:.2f} s over {wall:.1f} s wall, {n_decode} cycles = {cpu / max(1, n_decode) * 1e6:.0f} us per "
          f"cycle ({cpu / max(1, n_decode) * 1e6 / step:.1%} of the step; all work incl. HTTP streaming)")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen) -> None:
    import urllib.request

    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"emulator exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("emulator did not become healthy")


if __name__ == "__main__":
    main()
