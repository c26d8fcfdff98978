"""The HTTP side: OpenAI-compatible routes (aiohttp, one process, one event loop) over the Engine."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

from pipeline.config.emulator import EmulatorConfig
from pipeline.emulator.arm import Arm
from pipeline.emulator.attention import make_attention
from pipeline.emulator.cyclelog import CycleLog
from pipeline.emulator.engine import Engine, Request
from pipeline.emulator.metrics import Metrics
from pipeline.emulator.protocol import (ApiError, chat_messages, chat_params, check_model, completion_params,
                                        completion_prompt, read_body)
from pipeline.emulator.timing import StepTimer
from pipeline.emulator.tokens import load_tokens

log = logging.getLogger("pipeline.emulator")
# Tokenize and hash larger prompts on one worker thread (the tokenizer's batch call releases the GIL), so
# the engine loop keeps its deadlines; one thread, so on a 2-core machine the loop keeps a core.
BIG_PROMPT_CHARS = 16_000
BIG_PROMPT_TOKENS = 16_384
ENGINE = web.AppKey("engine", Engine)
INFO = web.AppKey("info", dict)


@web.middleware
async def errors(request: web.Request, handler):
    """Every failure becomes an OpenAI-style JSON error; the server keeps serving."""
    try:
        return await handler(request)
    except ApiError as e:
        return e.response()
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return ApiError(e.status, f"{request.method} {request.path}: {e.reason}", type_="not_found_error"
                        if e.status == 404 else "invalid_request_error").response()
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as e:  # a bug must cost one request, not the server
        log.exception("internal error on %s", request.path)
        return ApiError(500, f"internal error: {type(e).__name__}: {e}", type_="internal_error").response()


class Api:
    def __init__(self, cfg: EmulatorConfig, engine: Engine):
        self.cfg, self.engine, self.tokens = cfg, engine, engine.tokens
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tokenize")

    async def _off_loop(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await read_body(request)
        check_model(body, self.cfg.model)
        msgs = chat_messages(body)
        p = chat_params(body)
        big = sum(len(c) for _, c in msgs) > BIG_PROMPT_CHARS
        ids = await self._off_loop(self.tokens.chat_ids, msgs) if big else self.tokens.chat_ids(msgs)
        return await self._generate(request, ids, p, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_body(request)
        check_model(body, self.cfg.model)
        prompt = completion_prompt(body, self.tokens.vocab_size)
        p = completion_params(body)
        if isinstance(prompt, list):
            ids = prompt
        elif len(prompt) > BIG_PROMPT_CHARS:
            ids = await self._off_loop(self.tokens.encode, prompt)
        else:
            ids = self.tokens.encode(prompt)
        return await self._generate(request, ids, p, chat=False)

    def _budget(self, prompt_len: int, p, chat: bool) -> tuple[int, str]:
        cfg = self.cfg
        if prompt_len < 1:
            raise ApiError(400, "prompt: it has 0 tokens; send at least one token", param="prompt")
        if prompt_len >= cfg.max_context_tokens:
            raise ApiError(400, f"This model's maximum context length is {cfg.max_context_tokens} tokens. However, "
                           f"your prompt has {prompt_len} tokens.", param="messages" if chat else "prompt",
                           code="context_length_exceeded")
        n, reason = (p.max_tokens or cfg.default_max_tokens), "length"
        if not p.ignore_eos and 0 < cfg.eos_after_tokens < n:
            n, reason = cfg.eos_after_tokens, "stop"
        if prompt_len + n > cfg.max_context_tokens:
            n, reason = cfg.max_context_tokens - prompt_len, "length"
        return n, reason

    async def _generate(self, request: web.Request, ids: list[int], p, chat: bool) -> web.StreamResponse:
        max_new, reason = self._budget(len(ids), p, chat)
        if len(ids) > BIG_PROMPT_TOKENS:  # block hashing of a long prompt off the event loop
            req = await self._off_loop(self.engine.new_request, ids, max_new, reason)
        else:
            req = self.engine.new_request(ids, max_new, reason)
        del ids
        if p.logprobs:
            req.logprobs = []
        req.stops = p.stop
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if self.engine.closed:  # checked with no await before submit: a closed engine would never answer
            raise ApiError(503, "the server is shutting down; retry on another one", type_="service_unavailable")
        self.engine.submit(req)
        try:
            if p.stream:
                return await self._stream(request, req, rid, p, chat)
            while req.finish_reason is None:
                await req.event.wait()
                req.event.clear()
            texts = self.tokens.word_texts
            return web.json_response(self._full(req, rid, [texts[i] for i in req.out], chat, p.stop))
        finally:
            self.engine.abort(req)  # no-op once finished; frees the slot if the client went away

    async def _stream(self, request, req: Request, rid: str, p, chat: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            await self._stream_tokens(resp, req, rid, p, chat)
        except ConnectionResetError:  # the client hung up mid-stream (e.g. at a benchmark's end)
            pass
        return resp

    async def _stream_tokens(self, resp, req: Request, rid: str, p, chat: bool) -> None:
        head = json.dumps({"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": int(time.time()), "model": self.cfg.model})[:-1]
        # Pre-built halves of one token's chunk: only the text changes between tokens.
        pre = "data: " + head + (',"choices":[{"index":0,"delta":{"content":' if chat else ',"choices":[{"index":0,"text":')
        post = ('},"logprobs":null,"finish_reason":null}]}\n\n' if chat else ',"logprobs":null,"finish_reason":null}]}\n\n')
        texts = self.tokens.word_json
        # The role chunk goes out with the first token, after the prefill, as vLLM's and sglang's do: clients that
        # time TTFT at the first chunk with choices (their bench tools) would otherwise read ~0.
        role = (f'data: {head},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
                f'"logprobs":null,"finish_reason":null}}]}}\n\n' if chat else "")
        pending = ""  # with stop strings: text held back because it may begin one
        while True:
            await req.event.wait()
            req.event.clear()
            out = ""
            if p.stop:
                pending += "".join(self.tokens.word_texts[i] for i in req.out)
                req.out.clear()
                pending, ready = _stop_split(pending, p.stop, req.finish_reason is not None)
                if ready:
                    out = pre + json.dumps(ready) + post
            elif req.out:
                out = "".join(pre + texts[i] + post for i in req.out)
                req.out.clear()
            if out:
                await resp.write((role + out).encode())
                role = ""
            if req.finish_reason is not None:
                break
        delta = '"delta":{}' if chat else '"text":""'
        tail = f'data: {head},"choices":[{{"index":0,{delta},"logprobs":null,"finish_reason":"{req.finish_reason}"}}]}}\n\n'
        if p.include_usage:
            tail += f'data: {head},"choices":[],"usage":{json.dumps(self._usage(req))}}}\n\n'
        await resp.write((role + tail + "data: [DONE]\n\n").encode())
        await resp.write_eof()

    def _usage(self, req: Request) -> dict[str, Any]:
        return {"prompt_tokens": req.prompt_len, "completion_tokens": req.generated,
                "total_tokens": req.prompt_len + req.generated, "prompt_tokens_details": {"cached_tokens": req.cached}}

    def _full(self, req: Request, rid: str, words: list[str], chat: bool, stops: tuple[str, ...]) -> dict[str, Any]:
        text = _cut_at_stop("".join(words), stops)
        # Logprobs: one entry per generated token (= usage.completion_tokens), as vLLM does, so with a stop
        # string the reply's text is a prefix of the entries' tokens joined. No alternatives: see chat_params.
        if chat:
            logprobs = None if req.logprobs is None else {"content": [
                {"token": w, "logprob": lp, "bytes": list(w.encode()), "top_logprobs": []}
                for w, lp in zip(words, req.logprobs)]}
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                      "finish_reason": req.finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None if req.logprobs is None else
                      _completion_logprobs(words, req.logprobs), "finish_reason": req.finish_reason}
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": self.cfg.model, "choices": [choice], "usage": self._usage(req)}


def _completion_logprobs(words: list[str], lps: list[float]) -> dict[str, Any]:
    """The completions API's logprobs for logprobs=0: each top_logprobs entry holds the chosen token only."""
    offsets, at = [], 0
    for w in words:
        offsets.append(at)
        at += len(w)
    return {"tokens": words, "token_logprobs": lps, "top_logprobs": [{w: lp} for w, lp in zip(words, lps)],
            "text_offset": offsets}


def _cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """text up to its first stop string (excluded)."""
    cut = min((i for i in map(text.find, stops) if i >= 0), default=len(text))
    return text[:cut]


def _stop_split(text: str, stops: tuple[str, ...], final: bool) -> tuple[str, str]:
    """(held back, ready to send): a stop string cuts the text; until the request ends, a tail of the text
    that could be the start of a stop string is held back, since the next words may complete it."""
    cut = _cut_at_stop(text, stops)
    if final or len(cut) < len(text):
        return "", cut
    hold = max((k for s in stops for k in range(1, min(len(s), len(text) + 1)) if text.endswith(s[:k])), default=0)
    return text[len(text) - hold:], text[:len(text) - hold]


def server_info(cfg: EmulatorConfig, arm: Arm, attention, tokens) -> dict[str, Any]:
    from importlib import metadata

    def version(pkg: str) -> str | None:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return None

    att = attention.info()
    return {
        "engine": "emulator", "model": cfg.model, "pid": os.getpid(),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.model_dump(),
        "arm": arm.info(),
        "attention": att.get("attention"),
        "hardware": {"name": cfg.hardware, **att.get("hardware", {})},
        "tokenizer": tokens.info(),
        "mean_accept_length": cfg.mean_accept_length(),
        "versions": {"python": platform.python_version(), "pipeline": version("vattn-pipeline"),
                     "aiohttp": version("aiohttp"), "tokenizers": version("tokenizers"),
                     "pydantic": version("pydantic")},
    }


def open_cycle_log(cfg: EmulatorConfig) -> CycleLog | None:
    if cfg.cycle_log_dir:
        return CycleLog.next_lifetime(cfg.cycle_log_dir, cfg.cycle_log_flush_s)
    if cfg.cycle_log:
        return CycleLog(cfg.cycle_log, cfg.cycle_log_flush_s)
    return None


def build_app(cfg: EmulatorConfig, env=None) -> web.Application:
    """Everything that can fail on bad config fails here, before the port opens."""
    arm = Arm.from_env(env)
    attention = make_attention(cfg, arm)
    tokens = load_tokens(cfg.tokenizer, cfg.seed)
    metrics = Metrics(cfg.model)
    cycle_log = open_cycle_log(cfg)
    engine = Engine(cfg, StepTimer(cfg, attention), tokens, arm, metrics, cycle_log)
    api = Api(cfg, engine)
    info = server_info(cfg, arm, attention, tokens)
    if cycle_log:  # the runner records which lifetime's log served each stage (analysis/cycles.py reads it)
        info["cycle_log"] = cycle_log.info()
    app = web.Application(middlewares=[errors], client_max_size=1 << 30)
    app[ENGINE], app[INFO] = engine, info
    started = int(time.time())  # /v1/models' `created`: a Unix time, as OpenAI's (engine.t0 is monotonic)

    async def health(_):
        return web.Response(text="ok")

    async def get_info(_):
        return web.json_response({**info, "cycles": engine.cycles, "cache_hit_rate": engine.cache.hit_rate})

    async def models(_):
        return web.json_response({"object": "list", "data": [{
            "id": cfg.model, "object": "model", "created": started, "owned_by": "pipeline-emulator",
            "max_model_len": cfg.max_context_tokens}]})

    async def metrics_route(_):
        return web.Response(text=metrics.render(engine), content_type="text/plain", charset="utf-8")

    app.router.add_get("/health", health)
    app.router.add_get("/server_info", get_info)
    app.router.add_get("/get_server_info", get_info)  # sglang's older name
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics_route)
    app.router.add_post("/v1/chat/completions", api.chat)
    app.router.add_post("/v1/completions", api.completions)

    async def start(app_):
        app_["engine_task"] = asyncio.create_task(engine.run())

    async def close(app_):
        # on_shutdown runs before aiohttp waits for in-flight handlers (shutdown_timeout, twice: graceful,
        # then cancelled): ending the requests here lets every handler answer and return at once.
        engine.close()
        app_["engine_task"].cancel()
        try:
            await app_["engine_task"]
        except asyncio.CancelledError:
            pass

    async def stop(app_):
        if cycle_log:
            cycle_log.close()
        log.info("emulator stopped after %d cycles", engine.cycles)

    app.on_startup.append(start)
    app.on_shutdown.append(close)
    app.on_cleanup.append(stop)
    return app


def serve(cfg: EmulatorConfig) -> None:
    logging.basicConfig(level=cfg.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = build_app(cfg)
    info = app[INFO]
    log.info("emulator: model %s, arm %s, attention %s on %s, shape L%d Hkv%d D%d G%d %s page %d, draft %d",
             cfg.model, info["arm"], cfg.attention, cfg.hardware, cfg.attention_layers, cfg.num_kv_heads,
             cfg.head_dim, cfg.gqa, cfg.kv_dtype, cfg.page_size, cfg.draft_tokens)
    web.run_app(app, host=cfg.host, port=cfg.port, access_log=log if cfg.log_level == "debug" else None,
                print=lambda msg: log.info("%s", msg), shutdown_timeout=5,
                handler_cancellation=True)  # a client that hangs up frees its batch slot (see _generate)
