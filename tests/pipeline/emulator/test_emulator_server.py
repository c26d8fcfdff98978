"""The real emulator over HTTP, driven by the official openai client (no doubles)."""
from __future__ import annotations

import json
import re

import openai
import pytest
from emu_harness import MODEL, TOKENIZER, start_emulator
from tokenizers import Tokenizer

FLAGS = ("--tokenizer", str(TOKENIZER), "--time-scale", "0.05", "--eos-after-tokens", "10",
         "--max-context-tokens", "4096")


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    emu = start_emulator(tmp_path_factory.mktemp("srv"), *FLAGS, env={"VATTN": "0"})
    yield emu
    emu.stop()


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))


def n_tokens(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False).ids)


def chat_prompt_tokens(tok, messages) -> int:
    """The emulator's documented count: '<role>:' + content per message, then 'assistant:'."""
    return sum(n_tokens(tok, f"{m['role']}:") + n_tokens(tok, m["content"]) for m in messages) + n_tokens(tok, "assistant:")


MESSAGES = [{"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": "Count the tokens in this request, please."}]


def test_chat_non_streaming_usage_equals_requested_tokens(srv, tok):
    r = srv.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=37,
                                             temperature=0.7, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 37
    assert n_tokens(tok, r.choices[0].message.content) == 37  # a client re-tokenizing gets the same count
    assert r.usage.prompt_tokens == chat_prompt_tokens(tok, MESSAGES)
    assert r.usage.total_tokens == r.usage.prompt_tokens + 37


def test_chat_streaming_one_chunk_per_token_and_usage_chunk(srv, tok):
    stream = srv.client().chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=29, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) == 29
    assert n_tokens(tok, "".join(texts)) == 29
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 29
    assert chunks[-1].usage.prompt_tokens == chat_prompt_tokens(tok, MESSAGES)


def test_completions_streaming_and_not(srv, tok):
    prompt = "def main(): return the value of the loop counter"
    c = srv.client()
    r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=12, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 12 and n_tokens(tok, r.choices[0].text) == 12
    assert r.usage.prompt_tokens == n_tokens(tok, prompt)
    chunks = list(c.completions.create(model=MODEL, prompt=prompt, max_tokens=9, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    texts = [ch.choices[0].text for ch in chunks if ch.choices and ch.choices[0].text]
    assert len(texts) == 9 and chunks[-1].usage.completion_tokens == 9


def test_without_ignore_eos_the_stand_in_eos_stops_early(srv):
    r = srv.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=50)
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("stop", 10)


def test_models_and_server_info(srv):
    assert [m.id for m in srv.client().models.list().data] == [MODEL]
    status, text = srv.get("/server_info")
    info = json.loads(text)
    assert status == 200 and info["engine"] == "emulator" and info["model"] == MODEL
    assert info["arm"]["impl"] == "baseline" and info["arm"]["planner"] == "fixed"
    assert info["config"]["max_context_tokens"] == 4096 and info["config"]["head_dim"] == 256
    assert info["hardware"]["name"] == "h200" and info["tokenizer"]["mode"] == "hf"
    assert info["versions"]["aiohttp"]


@pytest.mark.parametrize("path,body,status,match", [
    ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
    ("/v1/chat/completions", json.dumps({"model": MODEL}).encode(), 400, "messages: expected a non-empty list"),
    ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": 0}).encode(), 400, "max_tokens: 0 is invalid"),
    ("/v1/chat/completions", json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}).encode(),
     404, "The model `gpt-9` does not exist"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "word " * 5000}).encode(), 400,
     "maximum context length is 4096"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": ["a", "b"]}).encode(), 400, "prompt: expected"),
    ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "temperature": 9}).encode(), 400,
     r"temperature: 9 is invalid"),
    ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                         "stream": True, "logprobs": True}).encode(), 400,
     "logprobs: not supported with stream=true"),
    ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                         "logprobs": "yes"}).encode(), 400, "logprobs: expected a boolean"),
])
def test_bad_requests_get_openai_errors_and_server_keeps_serving(srv, path, body, status, match):
    got, err = srv.post(path, body)
    assert got == status
    assert set(err["error"]) == {"message", "type", "param", "code"}
    assert re.search(match, err["error"]["message"])
    ok = srv.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert ok.usage.completion_tokens == 2


def test_chat_logprobs_give_one_entry_per_output_token_and_repeat_exactly(srv):
    c = srv.client()
    ask = lambda: c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, logprobs=True)
    first, again = ask(), ask()
    entries = first.choices[0].logprobs.content
    assert len(entries) == first.usage.completion_tokens > 1
    assert "".join(e.token for e in entries) == first.choices[0].message.content
    assert all(-4 < e.logprob <= 0 for e in entries) and len({e.logprob for e in entries}) > 1
    assert [e.logprob for e in again.choices[0].logprobs.content] == [e.logprob for e in entries]
    assert c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2).choices[0].logprobs is None


def test_openai_client_raises_typed_errors(srv):
    c = srv.client()
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.chat.completions.create(model="nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=-3)
    status, text = srv.get("/v1/nothing")
    assert status == 404 and json.loads(text)["error"]["type"] == "not_found_error"


def test_metrics_parse_with_sglang_names(srv):
    from prometheus_client.parser import text_string_to_metric_families

    srv.client().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5, extra_body={"ignore_eos": True})
    status, text = srv.get("/metrics")
    assert status == 200
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:cache_hit_rate",
                 "sglang:spec_accept_length", "sglang:gen_throughput", "sglang:prompt_tokens",
                 "sglang:generation_tokens", "sglang:time_to_first_token_seconds",
                 "sglang:e2e_request_latency_seconds"):
        assert name in fams, f"{name} missing from /metrics"
    gen = fams["sglang:generation_tokens"].samples[0].value
    assert gen >= 5
    ttft_count = [s.value for s in fams["sglang:time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert ttft_count[0] >= 1


def test_prefix_cache_hits_across_turns(srv):
    c = srv.client()
    block = 16
    turn1 = [{"role": "system", "content": "agent loop tool call " * 300},
             {"role": "user", "content": "read the file and patch the function"}]
    r1 = c.chat.completions.create(model=MODEL, messages=turn1, max_tokens=40, extra_body={"ignore_eos": True})
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    turn2 = turn1 + [{"role": "assistant", "content": r1.choices[0].message.content},
                     {"role": "user", "content": "now run the tests"}]
    r2 = c.chat.completions.create(model=MODEL, messages=turn2, max_tokens=5, extra_body={"ignore_eos": True})
    # Turn 1's prompt + reply is turn 2's prefix; the cache holds it in whole blocks.
    seen = r1.usage.prompt_tokens + r1.usage.completion_tokens
    assert r2.usage.prompt_tokens_details.cached_tokens == seen // block * block
    assert r2.usage.prompt_tokens > seen


def test_the_role_chunk_comes_with_the_first_token_after_the_prefill(tmp_path):
    """vLLM's and sglang's bench clients take TTFT at the first chunk with choices: a role chunk sent before the
    prefill would make it ~0 and fold the prefill into the first inter-token gap."""
    import time

    emu = start_emulator(tmp_path, "--tokenizer", str(TOKENIZER), "--time-scale", "1", "--max-context-tokens", "65536")
    try:
        sent = time.monotonic()
        stream = emu.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "word " * 30000}], max_tokens=2, stream=True,
            extra_body={"ignore_eos": True})
        arrivals = [(time.monotonic() - sent, c) for c in stream]
    finally:
        emu.stop()
    role_at = next(t for t, c in arrivals if c.choices and c.choices[0].delta.role == "assistant")
    first_token_at = next(t for t, c in arrivals if c.choices and c.choices[0].delta.content)
    assert first_token_at > 0.2, "the prefill of 30k tokens should take visible time"
    assert first_token_at - role_at < 0.05 * first_token_at, (role_at, first_token_at)


def test_malformed_content_parts_and_deep_nesting_are_client_errors(srv):
    bad_part = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}
    got, err = srv.post("/v1/chat/completions", json.dumps(bad_part).encode())
    assert got == 400 and err["error"]["param"] == "messages[0].content[0].text"
    got, err = srv.post("/v1/chat/completions", b"[" * 200_000)
    assert got == 400 and "nested too deeply" in err["error"]["message"]


def test_metrics_escape_a_model_name_prometheus_would_reject(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    name = 'qwen"x\\y'
    emu = start_emulator(tmp_path, "--tokenizer", str(TOKENIZER), "--time-scale", "0.05", "--model", name)  # last wins
    try:
        status, text = emu.get("/metrics")
    finally:
        emu.stop()
    assert status == 200
    labels = {s.labels["model_name"] for f in text_string_to_metric_families(text) for s in f.samples}
    assert labels == {name}
