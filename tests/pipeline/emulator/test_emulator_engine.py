"""Engine behaviour seen from outside: acceptance statistics, shutdown, disconnects, batching limits."""
from __future__ import annotations

import asyncio
import json
import math
import time

import httpx
import pytest
from emu_harness import MODEL

CYCLE_FIELDS = {"cycle", "t", "batch", "prefill_reqs", "prefill_tokens", "running", "waiting", "kv_tokens",
                "max_kv", "q_len", "q_tokens", "impl", "planner", "attn_us", "verify_us", "draft_us",
                "prefill_attn_us", "non_attn_us", "step_us", "accepted", "emitted", "overhead_us", "lag_us"}


async def stream_all(emu, n: int, max_tokens: int, prompt: str = "hello world") -> list[tuple[int, int]]:
    """n concurrent streaming chats; returns (content chunks, usage completion_tokens) per request."""
    import openai

    client = openai.AsyncOpenAI(base_url=emu.url + "/v1", api_key="none", max_retries=0)

    async def one(i: int):
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"{prompt} {i}"}], max_tokens=max_tokens,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        chunks, usage = 0, None
        async for c in stream:
            if c.choices and c.choices[0].delta.content:
                chunks += 1
            if c.usage:
                usage = c.usage.completion_tokens
        return chunks, usage

    try:
        return await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()


def metric(emu, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(emu.get("/metrics")[1]):
        for s in fam.samples:
            if s.name == name:
                return s.value
    raise KeyError(name)


def test_spec_decode_acceptance_matches_configured_distribution(emulator):
    probs = [0.8, 0.6, 0.45]
    emu = emulator("--seed", "7", "--time-scale", "0.01", "--non-attn-base-us", "2000",
                   "--accept-probs", *map(str, probs))
    results = asyncio.run(stream_all(emu, 8, 400))
    assert results == [(400, 400)] * 8  # one SSE chunk per token; usage agrees
    # P(emit k) = p1..p_{k-1} * (1 - p_k); all drafts accepted -> draft_tokens + 1
    expect = [1 - probs[0], probs[0] * (1 - probs[1]), probs[0] * probs[1] * (1 - probs[2]),
              probs[0] * probs[1] * probs[2]]
    mean = sum((k + 1) * p for k, p in enumerate(expect))
    assert abs(metric(emu, "sglang:spec_accept_length") - mean) < 0.15
    cycles_seen = json.loads(emu.get("/server_info")[1])["cycles"]
    assert emu.stop() == 0  # SIGTERM: clean exit, cycle log flushed
    lines = emu.cycles()
    assert len(lines) == cycles_seen and CYCLE_FIELDS <= set(lines[0])
    samples = [a for line in lines for a in line["accepted"]]
    n = len(samples)
    assert n >= 1000 and set(samples) <= {1, 2, 3, 4}
    for k, p in enumerate(expect, start=1):
        freq = samples.count(k) / n
        assert abs(freq - p) < 4 * math.sqrt(p * (1 - p) / n), (k, freq, p)
    assert abs(sum(samples) / n - mean) < 0.1
    assert sum(line["emitted"] for line in lines) == 8 * 400


def test_client_disconnect_frees_the_slot(emulator):
    emu = emulator("--time-scale", "0.1")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": 100000,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", emu.url + "/v1/chat/completions", json=body, timeout=30) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 5:
                break
    assert metric(emu, "sglang:num_running_reqs") <= 1
    deadline = time.monotonic() + 10
    while metric(emu, "sglang:num_running_reqs") > 0:
        assert time.monotonic() < deadline, "the aborted request still holds its slot"
        time.sleep(0.05)
    ok = emu.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=3)
    assert ok.usage.completion_tokens == 3


def test_batch_limit_queues_the_rest_fifo(emulator):
    emu = emulator("--max-running-requests", "2", "--time-scale", "0.02")
    results = asyncio.run(stream_all(emu, 5, 30))
    assert results == [(30, 30)] * 5
    emu.stop()
    lines = emu.cycles()
    assert max(line["batch"] + line["prefill_reqs"] for line in lines) <= 2
    assert max(line["waiting"] for line in lines) >= 1


def test_whitespace_mode_counts_words(emulator):
    emu = emulator("--time-scale", "0.02")
    r = emu.client().completions.create(model=MODEL, prompt="one two three four five", max_tokens=7,
                                        extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 7
    assert len(r.choices[0].text.split()) == 7
    info = json.loads(emu.get("/server_info")[1])
    assert info["tokenizer"]["mode"] == "whitespace"


def test_two_processes_answer_a_prompt_alike_in_whitespace_mode(emulator):
    """The off and on arms are two emulator processes: with the same seed they must see a prompt as the same
    ids, so answer it word for word alike and draw the same speculative acceptances (Python salts str hashes
    per process; PYTHONHASHSEED differs here to make that salt differ for certain)."""
    answers, accepted = [], []
    for salt in ("1", "2"):
        emu = emulator("--seed", "3", "--time-scale", "0.01", "--accept-probs", "0.7", "0.5", "0.4",
                       env={"PYTHONHASHSEED": salt}, name=f"salt{salt}")
        r = emu.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "name three rivers of the north"}], max_tokens=40)
        answers.append(r.choices[0].message.content)
        assert emu.stop() == 0
        accepted.append([a for line in emu.cycles() for a in line["accepted"]])
    assert len(answers[0].split()) == 40 and answers[0] == answers[1]
    assert len(accepted[0]) >= 10 and accepted[0] == accepted[1]


def test_chunked_prefill_splits_a_long_prompt(emulator):
    emu = emulator("--chunked-prefill-size", "1000", "--time-scale", "0.02")
    r = emu.client().completions.create(model=MODEL, prompt="w " * 4500, max_tokens=2, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == 4500
    emu.stop()
    chunks = [line["prefill_tokens"] for line in emu.cycles() if line["prefill_tokens"]]
    assert chunks == [1000, 1000, 1000, 1000, 500]


def test_non_streaming_client_timeout_frees_the_slot(emulator):
    emu = emulator("--time-scale", "0.1")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": 100000, "ignore_eos": True}
    try:
        httpx.post(emu.url + "/v1/chat/completions", json=body, timeout=0.5)
    except httpx.TimeoutException:
        pass
    deadline = time.monotonic() + 10
    while metric(emu, "sglang:num_running_reqs") > 0:
        assert time.monotonic() < deadline, "the abandoned request still holds its slot"
        time.sleep(0.05)


def test_sigint_is_a_clean_shutdown_too(emulator):
    import signal

    emu = emulator("--time-scale", "0.05")
    emu.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=9)
    emu.proc.send_signal(signal.SIGINT)
    assert emu.proc.wait(timeout=15) == 0
    assert sum(line["emitted"] for line in emu.cycles()) == 9


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_stop_signal_mid_request_ends_it_and_exits_promptly(emulator, sig):
    """The runner SIGKILLs a server still up 10 s after SIGTERM (hosts.LocalHost.stop): requests in flight
    must end at once, a stream with a last chunk and [DONE], a plain reply with what was generated so far."""
    import signal
    import threading

    emu = emulator("--time-scale", "0.05")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": 250000, "ignore_eos": True}
    plain = {}
    worker = threading.Thread(target=lambda: plain.update(
        r=httpx.post(emu.url + "/v1/chat/completions", json=body, timeout=30)))
    worker.start()
    with httpx.stream("POST", emu.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30) as r:
        lines = r.iter_lines()
        seen = [next(lines) for _ in range(8)]
        deadline = time.monotonic() + 10
        while metric(emu, "sglang:num_running_reqs") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        t0 = time.monotonic()
        emu.proc.send_signal(getattr(signal, sig))
        seen += list(lines)
    assert emu.proc.wait(timeout=15) == 0
    took = time.monotonic() - t0
    worker.join(15)
    assert took < 3, f"{sig}: exit took {took:.1f} s"
    data = [line[6:] for line in seen if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and json.loads(data[-2])["choices"][0]["finish_reason"] == "abort"
    streamed = sum(1 for d in data[:-1] if json.loads(d)["choices"][0]["delta"].get("content"))
    reply = plain["r"].json()
    assert plain["r"].status_code == 200 and reply["choices"][0]["finish_reason"] == "abort"
    n = reply["usage"]["completion_tokens"]
    assert n > 0 and len(reply["choices"][0]["message"]["content"].split()) == n
    assert "emulator stopped after" in emu.log.read_text()
    assert sum(line["emitted"] for line in emu.cycles()) == streamed + n  # the cycle log was flushed whole


def test_kv_capacity_limits_admission(emulator):
    emu = emulator("--max-total-tokens", "3000", "--time-scale", "0.02")
    results = asyncio.run(stream_all(emu, 4, 20, prompt="w " * 1200))  # ~1200-token prompts: two fit
    assert results == [(20, 20)] * 4
    emu.stop()
    lines = emu.cycles()
    assert max(line["batch"] + line["prefill_reqs"] for line in lines) == 2
    assert max(line["waiting"] for line in lines) >= 1
