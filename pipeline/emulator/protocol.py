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
    logprobs: bool = False  # chat: the chosen tokens' logprobs, in a non-streamed reply


async def read_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError as e:
        raise ApiError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def check_model(body: dict[str, Any], served: str) -> None:
    model = body.get("model")
    if model is None:
        raise ApiError(400, "you must provide a model parameter", param="model")
    if model != served:
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
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, f"stream_options: expected an object, got {opts!r}", param="stream_options")
    return Params(max_tokens=mt, ignore_eos=_bool(body, "ignore_eos"), stream=_bool(body, "stream"),
                  include_usage=bool(opts.get("include_usage", False)))


def chat_params(body: dict[str, Any]) -> Params:
    """params() plus chat's boolean `logprobs`, which this server returns in non-streamed replies only."""
    p = params(body)
    logprobs = _bool(body, "logprobs")
    if logprobs and p.stream:
        raise ApiError(400, "logprobs: not supported with stream=true by the emulator; ask without streaming",
                       param="logprobs")
    return replace(p, logprobs=logprobs)


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
            parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            content = "\n".join(parts)
        elif not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content: expected a string or a list of parts",
                           param=f"messages[{i}].content")
        out.append((m["role"], content))
    return out


def completion_prompt(body: dict[str, Any]) -> str | list[int]:
    """A string or a list of token ids (a batch of one of either is unwrapped)."""
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]
    if isinstance(p, str):
        return p
    if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
        return p
    raise ApiError(400, "prompt: expected a string, a list of token ids, or a batch of one of them "
                   "(batches of several prompts are not supported)", param="prompt")
