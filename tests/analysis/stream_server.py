"""A tiny OpenAI-compatible streaming chat server for the analysis tests.

It exists so the tests can produce real aiperf exports: aiperf talks to it over
HTTP exactly as it would to sglang. Each generated token costs `--itl-ms`
(plus a small seeded jitter), so two servers started with different `--itl-ms`
behave like the two arms of an A/B run.

    python tests/analysis/stream_server.py --port 8123 --itl-ms 4
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

from aiohttp import web


def _chunk(rid: str, model: str, delta: dict, finish: str | None = None, usage: dict | None = None) -> bytes:
    body = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n".encode()


def make_app(itl_ms: float, ttft_ms: float, default_tokens: int, seed: int, fail_every: int) -> web.Application:
    rng = random.Random(seed)
    counter = {"n": 0, "running": 0, "tokens": 0}

    async def chat(request: web.Request) -> web.StreamResponse:
        req = await request.json()
        n_out = int(req.get("max_completion_tokens") or req.get("max_tokens") or default_tokens)
        model = req.get("model", "tiny")
        counter["n"] += 1
        rid = f"chatcmpl-{counter['n']}"
        if fail_every and counter["n"] % fail_every == 0:
            # A real server error, so the export carries error records the analysis must count.
            return web.json_response({"error": {"message": "injected failure", "code": 500}}, status=500)
        counter["running"] += 1
        try:
            return await _stream(request, rid, model, n_out)
        finally:
            counter["running"] -= 1

    async def _stream(request: web.Request, rid: str, model: str, n_out: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(ttft_ms / 1000)
        await resp.write(_chunk(rid, model, {"role": "assistant", "content": ""}))
        for i in range(n_out):
            # Jitter keeps per-request TPOT distinct so percentiles and CIs are non-degenerate.
            await asyncio.sleep(itl_ms * (0.8 + 0.4 * rng.random()) / 1000)
            # " the" is one token in the tests' tokenizer, so aiperf's token count equals n_out.
            await resp.write(_chunk(rid, model, {"content": " the"}))
            counter["tokens"] += 1
        usage = {"prompt_tokens": 10, "completion_tokens": n_out, "total_tokens": 10 + n_out}
        await resp.write(_chunk(rid, model, {}, finish="length", usage=usage))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def metrics(_: web.Request) -> web.Response:
        # Prometheus text in sglang's naming, so aiperf's server-metrics export has something to carry.
        text = (
            "# TYPE sglang:num_running_reqs gauge\n"
            f'sglang:num_running_reqs{{model_name="tiny"}} {counter["running"]}\n'
            "# TYPE sglang:spec_accept_length gauge\n"
            f'sglang:spec_accept_length{{model_name="tiny"}} {2.5 + 0.1 * (counter["n"] % 3)}\n'
            "# TYPE sglang:cache_hit_rate gauge\n"
            'sglang:cache_hit_rate{model_name="tiny"} 0.9\n'
            "# TYPE sglang:generation_tokens_total counter\n"
            f'sglang:generation_tokens_total{{model_name="tiny"}} {counter["tokens"]}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--itl-ms", type=float, default=4.0)
    ap.add_argument("--ttft-ms", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fail-every", type=int, default=0, help="answer every Nth request with HTTP 500")
    a = ap.parse_args()
    web.run_app(make_app(a.itl_ms, a.ttft_ms, a.tokens, a.seed, a.fail_every), host="127.0.0.1", port=a.port, print=None)


if __name__ == "__main__":
    main()
