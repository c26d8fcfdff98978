"""A real OpenAI-compatible HTTP server (aiohttp, own thread) that answers the synthetic
sets correctly except for a known error pattern, so a test knows the exact truth.

Patterns, by question id (GPQA: applied to every repeat of the id):
    wrong      a well-formed wrong answer
    invalid    filler text with no extractable answer
    loose      gsm8k: the right number without '#### ' (strict misses, flexible hits)
    fail       HTTP 500 on every attempt (failed after retries); its body quotes the request's Authorization
               header back, as a debugging proxy might
    flaky      HTTP 500 on the first attempt of each prompt, then the right answer
    slow       the first attempt of each prompt stalls `slow_s` seconds (client timeout)
    truncated  cut off before its final answer, finish_reason 'length' (the max_tokens budget ran out)
refuse_logprobs: HTTP 400 on every request that asks for `logprobs`, as an engine without them answers.
api_key: every request must carry `Authorization: Bearer <api_key>`, as vLLM's --api-key checks; without one
    HTTP 401, with another key HTTP 403 (as some gateways answer a wrong key), bodies in OpenAI's error form.
"""
from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
from collections import Counter
from decimal import Decimal
from pathlib import Path

from aiohttp import web

_OPTION = re.compile(r"^([ABCD])\) (.*)$", re.M)


def load_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


class AnswerServer:
    def __init__(self, gsm_rows=(), gpqa_rows=(), *, wrong=(), invalid=(), loose=(), fail=(),
                 flaky=(), slow=(), slow_s=5.0, truncated=(), refuse_logprobs=False, api_key=None):
        self.gsm = {r["question"]: r for r in gsm_rows}
        self.gpqa = list(gpqa_rows)
        self.wrong, self.invalid, self.loose = set(wrong), set(invalid), set(loose)
        self.fail, self.flaky, self.slow, self.slow_s = set(fail), set(flaky), set(slow), slow_s
        self.truncated = set(truncated)
        self.refuse_logprobs = refuse_logprobs
        self.api_key = api_key
        self.authorizations: list[str | None] = []   # each request's Authorization header, refused ones too
        self.attempts: Counter = Counter()      # prompt text -> requests seen
        self.requests_by_id: Counter = Counter()
        self.bodies: list[dict] = []
        self.port = 0

    # -- answering --
    def _gsm_reply(self, content: str) -> tuple[str, str]:
        row = self.gsm[content.rsplit("Question: ", 1)[1]]
        qid, gold = row["id"], Decimal(row["answer"].rsplit("####", 1)[1].strip())
        if qid in self.wrong:
            return qid, f"Adding it up carefully.\n#### {gold + 1}"
        if qid in self.invalid:
            return qid, "I would need more information to solve this."
        if qid in self.loose:
            return qid, f"So the final answer is {gold}."
        # Vary the surface form the extractor must normalise: thousands, money.
        text = f"${gold:,}" if abs(gold) >= 1000 else f"{gold}"
        return qid, f"Working through the steps, 3 + 4 = 7 is not needed here.\n#### {text}"

    def _gpqa_reply(self, content: str) -> tuple[str, str]:
        options = dict((text, letter) for letter, text in _OPTION.findall(content))
        row = next(r for r in self.gpqa if r["Question"] in content and r["Correct Answer"]
                   in options and r["Incorrect Answer 1"] in options)
        qid, right = row["Record ID"], options[row["Correct Answer"]]
        if qid in self.wrong:
            return qid, f"Eliminating options.\nAnswer: {options[row['Incorrect Answer 2']]}"
        if qid in self.invalid:
            return qid, "It is probably one of the middle ones."
        return qid, f"Checking each option in turn.\n**Answer: {right}**"

    async def _handle(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization")
        self.authorizations.append(auth)
        if self.api_key is not None and auth != f"Bearer {self.api_key}":
            if auth is None:
                status, why = 401, "no API key given"
            else:  # the wrong key quoted back, as OpenAI's message does (masked there): the client must not log it
                status, why = 403, f"Incorrect API key provided: {auth.removeprefix('Bearer ')}"
            return web.json_response({"error": {"message": why, "type": "invalid_request_error"}}, status=status)
        body = await request.json()
        self.bodies.append(body)
        content = body["messages"][-1]["content"]
        is_gpqa = _OPTION.search(content) is not None
        qid, text = self._gpqa_reply(content) if is_gpqa else self._gsm_reply(content)
        self.attempts[content] += 1
        self.requests_by_id[qid] += 1
        first = self.attempts[content] == 1
        if qid in self.slow and first:
            await asyncio.sleep(self.slow_s)
        if self.refuse_logprobs and body.get("logprobs"):
            return web.json_response({"object": "error", "message": "logprobs are not supported here",
                                      "type": "BadRequestError", "code": 400}, status=400)
        if qid in self.fail or (qid in self.flaky and first):
            return web.Response(status=500, text=f"injected failure (request had Authorization: {auth})")
        finish = "stop"
        if qid in self.truncated:
            text, finish = text.split("\n")[0], "length"
        return web.json_response({
            "id": "x", "object": "chat.completion", "model": body["model"],
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": text}}]})

    # -- lifecycle --
    def __enter__(self) -> "AnswerServer":
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]

        async def start() -> web.AppRunner:
            app = web.Application()
            app.router.add_post("/v1/chat/completions", self._handle)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.SockSite(runner, sock).start()
            return runner

        self._runner = asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
