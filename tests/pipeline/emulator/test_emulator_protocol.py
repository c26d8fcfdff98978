"""OpenAI request parameters over real HTTP: stop strings, completions logprobs, parameter checks, /v1/models."""
from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from emu_harness import MODEL, TOKENIZER, start_emulator

CHAT, COMP = "/v1/chat/completions", "/v1/completions"
HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    # one token per cycle (no draft accepted): a stop string spanning two tokens then spans two stream writes
    emu = start_emulator(tmp_path_factory.mktemp("proto"), "--tokenizer", str(TOKENIZER), "--time-scale", "0.05",
                         "--max-context-tokens", "4096", "--accept-probs", "0,0,0", env={"VATTN": "0"})
    yield emu
    emu.stop()


def post(srv, path: str, **body) -> httpx.Response:
    return httpx.post(srv.url + path, json={"model": MODEL, **body}, timeout=30)


def reference_tokens(srv, path: str, **body) -> list[str]:
    """The output tokens without a stop string: the words are a function of the prompt alone."""
    if path == CHAT:
        r = post(srv, CHAT, **body, logprobs=True).json()
        return [e["token"] for e in r["choices"][0]["logprobs"]["content"]]
    return post(srv, COMP, **body, logprobs=0).json()["choices"][0]["logprobs"]["tokens"]


def stream(srv, path: str, **body) -> tuple[str, str, dict]:
    """(text, finish_reason, usage) of a streamed reply, checking it ends in [DONE]."""
    body = {"model": MODEL, **body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", srv.url + path, json=body, timeout=30) as r:
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    key = (lambda c: c["delta"].get("content") or "") if path == CHAT else (lambda c: c["text"])
    text = "".join(key(c["choices"][0]) for c in chunks if c["choices"])
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
    return text, finish, chunks[-1]["usage"]


def expect_cut(tokens: list[str], stop: str) -> tuple[str, int]:
    """(text before the stop string, tokens generated up to the one that completes it)."""
    text = "".join(tokens)
    at = text.find(stop)
    assert at >= 0
    n = next(k for k in range(1, len(tokens) + 1) if len("".join(tokens[:k])) >= at + len(stop))
    return text[:at], n


@pytest.mark.parametrize("path", [CHAT, COMP])
def test_stop_string_across_a_token_boundary_cuts_output_and_generation(srv, path):
    prompt = {"messages": HELLO} if path == CHAT else {"prompt": "def main(): return the loop counter"}
    tokens = reference_tokens(srv, path, **prompt, max_tokens=20, ignore_eos=True)
    assert len(tokens) == 20
    stop = tokens[5][-2:] + tokens[6][:3]  # ends inside token 6: usage counts tokens 0..6 (or an earlier hit)
    want, n = expect_cut(tokens, stop)
    assert n < 20
    r = post(srv, path, **prompt, max_tokens=20, ignore_eos=True, stop=[stop, "never in the output text"]).json()
    choice = r["choices"][0]
    text = choice["message"]["content"] if path == CHAT else choice["text"]
    assert (text, choice["finish_reason"], r["usage"]["completion_tokens"]) == (want, "stop", n)
    assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + n
    # Streamed: the chunks before the stop string are held back, none of it is sent.
    text, finish, usage = stream(srv, path, **prompt, max_tokens=20, ignore_eos=True, stop=stop)
    assert (text, finish, usage["completion_tokens"]) == (want, "stop", n)


@pytest.mark.parametrize("path", [CHAT, COMP])
def test_a_stop_prefix_that_never_completes_is_released_at_the_end(srv, path):
    prompt = {"messages": HELLO} if path == CHAT else {"prompt": "count to ten"}
    tokens = reference_tokens(srv, path, **prompt, max_tokens=12, ignore_eos=True)
    stop = tokens[-1][-3:] + "\x00"  # the output ends with a prefix of it
    text, finish, usage = stream(srv, path, **prompt, max_tokens=12, ignore_eos=True, stop=stop)
    assert (text, finish, usage["completion_tokens"]) == ("".join(tokens), "length", 12)


def test_completions_logprobs_zero_match_the_text(srv):
    r = post(srv, COMP, prompt="the quick brown fox", max_tokens=9, ignore_eos=True, logprobs=0).json()
    lp, text = r["choices"][0]["logprobs"], r["choices"][0]["text"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == r["usage"]["completion_tokens"] == 9
    assert "".join(lp["tokens"]) == text
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(9)]
    assert lp["top_logprobs"] == [{t: x} for t, x in zip(lp["tokens"], lp["token_logprobs"])]
    assert all(-4 < x <= 0 for x in lp["token_logprobs"])
    chat = post(srv, CHAT, messages=HELLO, max_tokens=3, logprobs=True, top_logprobs=0).json()
    assert all(e["top_logprobs"] == [] for e in chat["choices"][0]["logprobs"]["content"])


def test_missing_model_means_the_served_one(srv):
    r = httpx.post(srv.url + CHAT, json={"messages": HELLO, "max_tokens": 2}, timeout=30)
    assert r.status_code == 200 and r.json()["model"] == MODEL


def test_models_created_is_a_unix_time(srv):
    created = json.loads(srv.get("/v1/models")[1])["data"][0]["created"]
    assert abs(created - time.time()) < 3600


BAD = [
    (CHAT, {"messages": HELLO, "stop": 5}, "stop", r"stop: expected a string or a list of strings, got 5"),
    (COMP, {"prompt": "x", "stop": ["a", 3]}, "stop", r"stop: expected a string or a list"),
    (CHAT, {"messages": HELLO, "stop": list("abcde")}, "stop", r"stop: 5 stop strings; at most 4"),
    (CHAT, {"messages": HELLO, "stop": [""]}, "stop", r"stop: an empty stop string"),
    (COMP, {"prompt": "x", "logprobs": 2}, "logprobs", r"logprobs: 2 is not supported by the emulator"),
    (COMP, {"prompt": "x", "logprobs": -1}, "logprobs", r"logprobs: -1 is invalid"),
    (COMP, {"prompt": "x", "logprobs": 0, "stream": True}, "logprobs", r"not supported with stream=true"),
    (COMP, {"prompt": "x", "echo": True}, "echo", r"echo: not supported by the emulator"),
    (CHAT, {"messages": HELLO, "logprobs": True, "top_logprobs": 3}, "top_logprobs",
     r"top_logprobs: 3 is not supported by the emulator"),
    (CHAT, {"messages": HELLO, "logprobs": True, "top_logprobs": 21}, "top_logprobs", r"top_logprobs: 21 is invalid"),
    (CHAT, {"messages": HELLO, "top_logprobs": 0}, "top_logprobs", r"top_logprobs: needs logprobs=true"),
    (CHAT, {"messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options",
     r"stream_options: only allowed with stream=true"),
    (CHAT, {"messages": HELLO, "stream": True, "stream_options": {"include_usage": "no"}},
     "stream_options.include_usage", r"include_usage: expected a boolean, got 'no'"),
    (COMP, {"prompt": [99999999, -5]}, "prompt", r"prompt: token id 99999999 is out of vocabulary"),
    (COMP, {"prompt": [5, -5]}, "prompt", r"prompt: token id -5 is out of vocabulary"),
    (COMP, {"prompt": "word " * 5000}, "prompt", r"maximum context length is 4096"),
    (CHAT, {"messages": [{"role": "user", "content": "word " * 5000}]}, "messages", r"maximum context length is 4096"),
]


@pytest.mark.parametrize("path,body,param,match", BAD, ids=[f"{p[4:]}-{m[:30]}" for p, _, _, m in BAD])
def test_bad_parameters_get_a_400_that_names_them(srv, path, body, param, match):
    r = post(srv, path, max_tokens=3, **body)
    err = r.json()["error"]
    assert (r.status_code, err["param"]) == (400, param)
    assert re.search(match, err["message"])
