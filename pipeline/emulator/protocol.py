"""Parse and check OpenAI request bodies; errors are OpenAI-style 4xx JSON that name the parameter."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return web.json_response(body, status=self.status)


@dataclass(frozen=True)
class Params:
    max_tokens: int | None
    ignore_eos: bool
    stream: bool
    include_usage: bool
    logprobs: bool = False  # the chosen tokens' logprobs, in a non-streamed reply
    stop: tuple[str, ...] = ()  # stop strings: the output ends before the first one (finish_reason "stop")


async def read_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as e:
        raise ApiError(400, f"request body is not valid JSON: {e}") from None
    except RecursionError:  # nested past Python's stack: malformed for any use here, not a server fault
        raise ApiError(400, "request body is not valid JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def check_model(body: dict[str, Any], served: str) -> None:
    """A missing model means the served one (as vLLM and sglang do); a wrong one is a 404, so a client
    pointed at the wrong server or with a wrong model name fails loudly instead of measuring this one."""
    model = body.get("model")
    if model is not None and model != served:
        raise ApiError(404, f"The model `{model}` does not exist; this server serves `{served}`",
                       param="model", code="model_not_found")


def _bool(body: dict[str, Any], name: str) -> bool:
    v = body.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(400, f"{name}: expected a boolean, got {v!r}", param=name)
    return v


def params(body: dict[str, Any]) -> Params:
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    mt = body.get(name)
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        raise ApiError(400, f"{name}: {mt!r} is invalid; it must be an integer >= 1", param=name)
    for key, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        v = body.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi):
            raise ApiError(400, f"{key}: {v!r} is invalid; it must be a number in [{lo}, {hi}]", param=key)
    n = body.get("n")
    if n not in (None, 1):
        raise ApiError(400, f"n: {n!r} is not supported; only n=1", param="n")
    stream = _bool(body, "stream")
    return Params(max_tokens=mt, ignore_eos=_bool(body, "ignore_eos"), stream=stream,
                  include_usage=_include_usage(body, stream), stop=_stop(body))


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise ApiError(400, f"stream_options: expected an object, got {opts!r}", param="stream_options")
    if not stream:  # as OpenAI and vLLM: the options describe a stream, so without one they are a mistake
        raise ApiError(400, "stream_options: only allowed with stream=true; drop it or set stream to true",
                       param="stream_options")
    v = opts.get("include_usage", False)
    if v is not None and not isinstance(v, bool):
        raise ApiError(400, f"stream_options.include_usage: expected a boolean, got {v!r}",
                       param="stream_options.include_usage")
    return bool(v)


MAX_STOPS = 4  # OpenAI's limit; it also bounds the per-token stop check in the engine loop


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ApiError(400, f"stop: expected a string or a list of strings, got {stop!r}"[:300], param="stop")
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"stop: {len(stops)} stop strings; at most {MAX_STOPS} are allowed", param="stop")
    if "" in stops:  # "" matches everywhere: the reply would always be empty, surely not what was meant
        raise ApiError(400, "stop: an empty stop string is not allowed; drop it", param="stop")
    return tuple(stops)


def _no_stream_logprobs(p: Params) -> None:
    if p.logprobs and p.stream:
        raise ApiError(400, "logprobs: not supported with stream=true by the emulator; ask without streaming",
                       param="logprobs")


def chat_params(body: dict[str, Any]) -> Params:
    """params() plus chat's boolean `logprobs`, which this server returns in non-streamed replies only.

    Only the chosen token's logprob exists in the emulator's token model (tokens.OutputWords), so
    `top_logprobs` may be 0 (an empty list of alternatives) but not more: made-up alternatives would be
    numbers no model computed."""
    p = replace(params(body), logprobs=_bool(body, "logprobs"))
    _no_stream_logprobs(p)
    top = body.get("top_logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
            raise ApiError(400, f"top_logprobs: {top!r} is invalid; it must be an integer in [0, 20]",
                           param="top_logprobs")
        if not p.logprobs:
            raise ApiError(400, "top_logprobs: needs logprobs=true; set it or drop top_logprobs",
                           param="top_logprobs")
        if top > 0:
            raise ApiError(400, f"top_logprobs: {top} is not supported by the emulator (it models only the "
                           "chosen token's logprob); use top_logprobs=0 or drop it", param="top_logprobs")
    return p


def completion_params(body: dict[str, Any]) -> Params:
    """params() plus the completions API's integer `logprobs` (0 only: the chosen token, see chat_params)
    and `echo` (refused: the emulator does not model the prompt's logprobs, and echo without them is rare)."""
    p = params(body)
    lp = body.get("logprobs")
    if lp is not None:
        if isinstance(lp, bool) or not isinstance(lp, int) or lp < 0:
            raise ApiError(400, f"logprobs: {lp!r} is invalid; it must be an integer >= 0", param="logprobs")
        if lp > 0:
            raise ApiError(400, f"logprobs: {lp} is not supported by the emulator (it models only the chosen "
                           "token's logprob, not alternatives); use logprobs=0 or drop it", param="logprobs")
        p = replace(p, logprobs=True)
    _no_stream_logprobs(p)
    if _bool(body, "echo"):
        raise ApiError(400, "echo: not supported by the emulator; drop it (or set it to false)", param="echo")
    return p


def chat_messages(body: dict[str, Any]) -> list[tuple[str, str]]:
    """[(role, text)]: content may be a string or a list of {"type": "text", "text": ...} parts."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, f"messages: expected a non-empty list of messages, got {msgs!r}"[:300], param="messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}]: expected an object with a string 'role'", param=f"messages[{i}]")
        content = m.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            parts = [(j, p.get("text")) for j, p in enumerate(content) if isinstance(p, dict) and p.get("type") == "text"]
            for j, text in parts:
                if not isinstance(text, str):
                    raise ApiError(400, f"messages[{i}].content[{j}].text: expected a string, got {text!r}"[:300],
                                   param=f"messages[{i}].content[{j}].text")
            content = "\n".join(text for _, text in parts)
        elif not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content: expected a string or a list of parts",
                           param=f"messages[{i}].content")
        out.append((m["role"], content))
    return out


def completion_prompt(body: dict[str, Any], vocab_size: int) -> str | list[int]:
    """A string or a list of token ids in [0, vocab_size) (a batch of one of either is unwrapped)."""
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        if min(p) < 0 or max(p) >= vocab_size:  # as vLLM: a real engine would index past its embedding table
            bad = next(t for t in p if not 0 <= t < vocab_size)
            raise ApiError(400, f"prompt: token id {bad} is out of vocabulary; ids must be in [0, {vocab_size})",
                           param="prompt")
        return p
    raise ApiError(400, "prompt: expected a string, a list of token ids, or a batch of one of them "
                   "(batches of several prompts are not supported)", param="prompt")
