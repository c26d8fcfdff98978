"""One chat completion with timeouts and bounded retries; never raises for a server fault.

A request that still fails after its retries comes back as a `Reply` with `failed=True`
and the last error, so the caller records it instead of losing the question. Where the server
returned the chosen tokens' logprobs (OpenAI's `logprobs.content`), the reply keeps them.
A 401 or 403 raises `Refused`: the credentials, not the question, failed, and every request would fail alike.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

_BACKOFF_CAP_S = 30.0
# 429 and 5xx are the server saying "not now"; other 4xx mean the request itself is
# wrong and repeating it cannot help.
_RETRY_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))
# A connect that timed out means nothing took the request; only a timeout after that is a slow answer.
# (aiohttp < 3.10 has no such class: every timeout then reads as a slow answer.)
_CONNECT_TIMEOUT = getattr(aiohttp, "ConnectionTimeoutError", ())
_TIMED_OUT = "TimeoutError: no complete answer within"
# Not an http(s) URL aiohttp can send to (NonHttpUrlClientError is no InvalidURL subclass in aiohttp 3.10+).
_BAD_URL = (aiohttp.InvalidURL, *((aiohttp.NonHttpUrlClientError,) if hasattr(aiohttp, "NonHttpUrlClientError") else ()))


@dataclass(frozen=True)
class Reply:
    output: str | None
    finish_reason: str | None
    latency_s: float        # the successful (or last) attempt only
    attempts: int
    failed: bool
    error: str | None
    tokens: list[str] | None = None            # the output's tokens, where the server returned logprobs
    token_logprobs: list[float] | None = None  # each one's logprob


def chat_url(url: str) -> str:
    """Accept a server root, a `/v1` base or the full endpoint."""
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if url.endswith("/v1"):
        return url + "/chat/completions"
    return url + "/v1/chat/completions"


def timed_out(error: str | None) -> bool:
    """Whether a reply's error is the per-request timeout running out on an accepted request."""
    return (error or "").startswith(_TIMED_OUT)


class _Retryable(Exception):
    pass


class Refused(Exception):
    """The endpoint answered 401 or 403: it refused the API key sent (or wanted one and got none)."""

    def __init__(self, status: int, text: str):
        super().__init__(f"HTTP {status}: {text}")
        self.status, self.text = status, text


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The session's headers: OpenAI's bearer scheme, which vLLM's --api-key and hosted APIs check."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _token_logprobs(choice: dict) -> tuple[list[str] | None, list[float] | None]:
    """(tokens, logprobs) from a chat choice's `logprobs.content`; (None, None) where it has none."""
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list):
        return None, None
    try:
        return [str(t["token"]) for t in content], [float(t["logprob"]) for t in content]
    except (KeyError, TypeError, ValueError):
        return None, None


async def _attempt(session: aiohttp.ClientSession, url: str, body: dict,
                   timeout_s: float) -> tuple[str, str | None, tuple]:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with session.post(url, json=body, timeout=timeout) as resp:
            text = await resp.text()
            if resp.status in (401, 403):
                raise Refused(resp.status, text[:200])
            if resp.status in _RETRY_STATUS:
                raise _Retryable(f"HTTP {resp.status}: {text[:200]}")
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}: {text[:200]}")
    except _BAD_URL as e:   # the same URL fails every attempt alike
        raise ValueError(f"{type(e).__name__}: {e}") from None
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        if isinstance(e, asyncio.TimeoutError) and not isinstance(e, _CONNECT_TIMEOUT):
            raise _Retryable(f"{_TIMED_OUT} {timeout_s:g} s") from None
        raise _Retryable(f"{type(e).__name__}: {e}") from None
    try:
        choice = json.loads(text)["choices"][0]
        content = choice["message"].get("content")
    except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
        raise ValueError(f"malformed response ({type(e).__name__}): {text[:200]}") from None
    return content or "", choice.get("finish_reason"), _token_logprobs(choice)


async def chat(session: aiohttp.ClientSession, url: str, body: dict, *, timeout_s: float,
               retries: int, backoff_s: float) -> Reply:
    """POST one chat request; retry connection errors, timeouts, 408/429/5xx; raise Refused on 401/403."""
    error = None
    for attempt in range(1, retries + 2):
        start = time.perf_counter()
        try:
            output, finish, (tokens, logprobs) = await _attempt(session, url, body, timeout_s)
            return Reply(output, finish, time.perf_counter() - start, attempt, False, None, tokens, logprobs)
        except _Retryable as e:
            error = str(e)
        except ValueError as e:
            return Reply(None, None, time.perf_counter() - start, attempt, True, str(e))
        if attempt <= retries:
            await asyncio.sleep(min(backoff_s * 2 ** (attempt - 1), _BACKOFF_CAP_S))
    return Reply(None, None, time.perf_counter() - start, retries + 1, True, error)
