"""Arm `on` (VATTN=1) beats arm `off` (VATTN=0) on a skewed batch, measured from the client side."""
from __future__ import annotations

import asyncio
import json
import statistics
import time

import httpx
from emu_harness import MODEL

# Attention-dominated cycles (small non-attention time) so the kernel is what differs between arms;
# prefill made cheap so the 200k-token prompt does not dominate the test's wall time.
FLAGS = ("--non-attn-base-us", "500", "--non-attn-per-token-us", "0", "--prefill-attention-tflops", "100000",
         "--chunked-prefill-size", "262144", "--time-scale", "2")
# A skewed agentic batch: one 200k context among 30k ones. (Against 300-token neighbours vattn's verify only
# ties FlashInfer's on the H200 bench, and its q1 draft decode is slower, so that batch would test nothing.)
LONG, SHORT, N_SHORT, SHORT_TOKENS = 200_000, 30_000, 7, 60


async def token_times(client: httpx.AsyncClient, prompt: str, max_tokens: int, first: asyncio.Event | None = None):
    """Arrival time of each streamed token."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    times = []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                if json.loads(line[6:])["choices"][0]["text"]:
                    times.append(time.monotonic())
                    if first is not None:
                        first.set()
    return times


async def skewed_batch_itl(url: str) -> float:
    """One 200k-token request decoding while 7 shorter ones run; mean inter-token latency of the shorter ones."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        started = asyncio.Event()
        long_task = asyncio.create_task(token_times(client, "w " * LONG, 100_000, started))
        await asyncio.wait_for(started.wait(), 60)
        shorts = await asyncio.gather(*(token_times(client, f"s{i} " * SHORT, SHORT_TOKENS) for i in range(N_SHORT)))
        long_task.cancel()
    assert all(len(t) == SHORT_TOKENS for t in shorts)
    return statistics.mean((t[-1] - t[0]) / (len(t) - 1) for t in shorts)


def test_on_arm_has_lower_inter_token_latency_on_skewed_batch(emulator):
    itl, step = {}, {}
    for arm, env in (("off", {"VATTN": "0"}), ("on", {"VATTN": "1", "VATTN_PLAN": "balanced"})):
        emu = emulator(*FLAGS, env=env, name=arm)
        itl[arm] = asyncio.run(skewed_batch_itl(emu.url))
        emu.stop()
        busy = [c for c in emu.cycles() if c["batch"] == 1 + N_SHORT]
        assert busy and {c["impl"] for c in busy} == {"baseline" if arm == "off" else "vattn"}
        step[arm] = statistics.mean(c["step_us"] for c in busy)
    print(f"ITL off {itl['off'] * 1e3:.3f} ms, on {itl['on'] * 1e3:.3f} ms; "
          f"modelled step off {step['off']:.0f} us, on {step['on']:.0f} us")
    assert step["on"] < step["off"]
    assert itl["on"] < 0.95 * itl["off"]
