"""The engine loop: continuous batching, chunked prefill, prefix cache, speculative-decoding cycles.

One cycle = one model step. At its start the engine admits waiting requests (FIFO) up to
max_running_requests, gives up to chunked_prefill_size prompt tokens to prefilling requests (oldest
first; cached prefix skipped), samples each decode sequence's accepted tokens, asks the StepTimer for
the cycle's model time and sleeps until the cycle's deadline. Deadlines chain (next start = last
deadline), so the Python work of a cycle overlaps its sleep and wall time tracks model time. At the
deadline the results land: a request that finished its prompt emits its first token; every decode
sequence emits its accepted tokens (1 .. draft_tokens + 1).

Acceptance is a property of the request, not of the arm: with greedy decoding and a kernel that changes
no answers, the same prompt gets the same draft tokens accepted at the same steps whichever kernel runs.
So each request draws its acceptance from its own generator, seeded by the prompt; the A/B then compares
the same acceptance sequences, and a matched request's TPOT moves only with the cycle times. The output
words are likewise a function of the prompt (tokens.OutputWords), so the arms' answers can be compared.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from dataclasses import dataclass, field

from pipeline.config.emulator import EmulatorConfig
from pipeline.emulator.arm import Arm
from pipeline.emulator.cyclelog import CycleLog
from pipeline.emulator.metrics import Metrics
from pipeline.emulator.prefix_cache import BlockHasher, PrefixCache
from pipeline.emulator.timing import StepTimer
from pipeline.emulator.tokens import OutputWords, Tokens

CATCH_UP_S = 0.02  # a cycle that starts later than this after the last deadline restarts the clock


@dataclass(eq=False)
class Request:
    prompt_len: int
    max_new: int              # tokens this request will generate
    end_reason: str           # finish_reason once max_new tokens are out: "length" | "stop"
    hasher: BlockHasher       # chained block hashes of prompt (+ output as it grows)
    accept_rng: random.Random  # this request's acceptance draws (seeded by its prompt)
    words: OutputWords        # this request's output words (a function of its prompt)
    arrival: float = field(default_factory=time.monotonic)
    cached: int = 0           # prompt tokens served by the prefix cache
    prefilled: int = 0        # prompt tokens in KV (cached ones included)
    generated: int = 0
    decoding: bool = False    # prompt done and first token out
    inserted: int = 0         # hashes already given to the prefix cache
    out: list[int] = field(default_factory=list)  # output word indices not yet sent to the client
    logprobs: list[float] | None = None  # each output word's logprob, where the client asked for them
    stops: tuple[str, ...] = ()  # stop strings: generation ends with the word that completes one
    stop_tail: str = ""       # the output's last (longest stop - 1) chars: a stop may span word boundaries
    finish_reason: str | None = None
    aborted: bool = False
    first_token_t: float | None = None
    event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ctx(self) -> int:
        return self.prompt_len + self.generated


class Engine:
    def __init__(self, cfg: EmulatorConfig, timer: StepTimer, tokens: Tokens, arm: Arm,
                 metrics: Metrics, cycle_log: CycleLog | None):
        self.cfg, self.timer, self.tokens, self.arm = cfg, timer, tokens, arm
        self.metrics, self.cycle_log = metrics, cycle_log
        self.cache = PrefixCache(cfg.prefix_block_tokens, cfg.prefix_cache_tokens, not cfg.disable_prefix_cache)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._wake = asyncio.Event()
        self._deadline = 0.0
        self.cycles = 0
        self.t0 = time.monotonic()
        self.closed = False

    # -- requests --
    def new_request(self, ids: list[int], max_new: int, end_reason: str) -> Request:
        hasher = BlockHasher(self.cfg.prefix_block_tokens)
        hasher.extend(ids)
        # hash() of a tuple of ints is the same in every process (only str and bytes hashes are salted)
        h = hash((self.cfg.seed, tuple(ids)))
        return Request(prompt_len=len(ids), max_new=max_new, end_reason=end_reason, hasher=hasher,
                       accept_rng=random.Random(h), words=self.tokens.output_words(h, self.arm.flip_rate))

    def submit(self, req: Request) -> None:
        self.waiting.append(req)
        self.metrics.on_submit(req.prompt_len)
        self._wake.set()

    def abort(self, req: Request) -> None:
        """The client went away: drop the request at the next cycle."""
        if req.finish_reason is None:
            req.aborted = True
            req.finish_reason = "abort"

    def close(self) -> None:
        """The server is stopping: end every request now (finish_reason "abort") and wake its handler, which
        sends what was generated and returns; else aiohttp waits out its shutdown timeouts while the requests
        keep generating, and the process outlives the runner's grace period before SIGKILL."""
        self.closed = True
        for r in [*self.running, *self.waiting]:
            self.abort(r)
            r.event.set()
        self.running.clear()
        self.waiting.clear()

    # -- the loop --
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self.cfg.cycle_log_flush_s)
                except asyncio.TimeoutError:
                    if self.cycle_log:
                        self.cycle_log.flush()
                    continue
            # Chain deadlines while busy, so the event loop's wake-up lateness does not accumulate;
            # after idle time (or when falling behind by more than a beat) start from now.
            now = loop.time()
            start = self._deadline if 0 <= now - self._deadline < CATCH_UP_S else now
            await self._cycle(loop, start)

    async def _cycle(self, loop: asyncio.AbstractEventLoop, start: float) -> None:
        t_work = loop.time()
        self._admit()
        prefill = self._plan_prefill()
        decode = [r for r in self.running if r.decoding]
        if not prefill and not decode:  # only aborted requests were queued
            return
        accepted = [self._sample_accept(r.accept_rng) for r in decode]
        ctx = [r.ctx for r in decode]
        ct = self.timer.cycle(ctx, accepted, [(p, c) for _, p, c in prefill])
        self._deadline = start + ct.step_us * 1e-6 * self.cfg.time_scale
        overhead = loop.time() - t_work
        await asyncio.sleep(max(0.0, self._deadline - loop.time()))
        lag = loop.time() - self._deadline
        emitted = self._apply(prefill, decode, accepted)
        self.cycles += 1
        self.metrics.on_cycle(self._deadline, emitted, accepted)
        if self.cycle_log:
            self.cycle_log.add(self._log_line(ct, prefill, ctx, accepted, emitted, overhead, lag))

    def _admit(self) -> None:
        self.running = [r for r in self.running if not r.aborted]
        cap = self.cfg.max_total_tokens
        used = sum(r.ctx for r in self.running) if cap else 0
        while self.waiting and len(self.running) < self.cfg.max_running_requests:
            r = self.waiting[0]
            if r.aborted:
                self.waiting.popleft()
                continue
            if cap and self.running and used + r.prompt_len > cap:
                break  # FIFO: the head waits for KV space, and so does everyone behind it
            self.waiting.popleft()
            used += r.prompt_len
            # A real engine always computes the last prompt token (its logits give the first output token).
            r.cached = min(self.cache.match(r.hasher.hashes, r.prompt_len), r.prompt_len - 1)
            r.prefilled = r.cached
            self.metrics.on_admit(r.cached)
            self.running.append(r)

    def _plan_prefill(self) -> list[tuple[Request, int, int]]:
        budget = self.cfg.chunked_prefill_size
        chunks = []
        for r in self.running:
            if budget == 0:
                break
            left = r.prompt_len - r.prefilled
            if left > 0:
                c = min(left, budget)
                chunks.append((r, r.prefilled, c))
                budget -= c
        return chunks

    def _sample_accept(self, rng: random.Random) -> int:
        n = 1
        rand = rng.random
        for p in self.cfg.accept_probs:
            if rand() >= p:
                break
            n += 1
        return n

    def _apply(self, prefill, decode, accepted) -> int:
        now = time.monotonic()
        emitted = 0
        for r, _, c in prefill:
            r.prefilled += c
            if r.prefilled == r.prompt_len and not r.aborted:
                self._insert(r)
                r.decoding = True
                r.first_token_t = now
                self.metrics.on_first_token(now - r.arrival)
                emitted += self._emit(r, 1, now)
        for r, a in zip(decode, accepted):
            if not r.aborted:
                emitted += self._emit(r, a, now)
        return emitted

    def _emit(self, r: Request, n: int, now: float) -> int:
        n = min(n, r.max_new - r.generated)
        words, texts = self.tokens.word_ids, self.tokens.word_texts
        stopped = False
        for k in range(n):
            i = r.words.next()
            r.out.append(i)
            if r.logprobs is not None:
                r.logprobs.append(r.words.logprob)
            r.hasher.append(words[i])
            if r.stops and self._hits_stop(r, texts[i]):
                # the word that completes a stop string is generated (and counted in usage, as vLLM does);
                # the accepted draft tokens after it are not
                n, stopped = k + 1, True
                break
        r.generated += n
        if stopped or r.generated >= r.max_new:
            r.finish_reason = "stop" if stopped else r.end_reason
            self._insert(r)
            self.running.remove(r)
            self.metrics.on_finish(r.generated, now - r.arrival)
        r.event.set()
        return n

    @staticmethod
    def _hits_stop(r: Request, text: str) -> bool:
        s = r.stop_tail + text
        keep = max(map(len, r.stops)) - 1  # a stop ending in `text` starts at most this far before it
        r.stop_tail = s[len(s) - keep:] if keep else ""
        return any(x in s for x in r.stops)

    def _insert(self, r: Request) -> None:
        self.cache.insert(r.hasher.hashes[r.inserted:])
        r.inserted = len(r.hasher.hashes)

    def _log_line(self, ct, prefill, ctx, accepted, emitted, overhead, lag) -> dict:
        """ctx: KV tokens of each decode sequence before this cycle."""
        return {
            "cycle": self.cycles, "t": round(self._deadline - self.t0, 6),
            "batch": len(ctx), "prefill_reqs": len(prefill), "prefill_tokens": sum(c for _, _, c in prefill),
            "running": len(self.running), "waiting": len(self.waiting),
            "kv_tokens": sum(ctx) + sum(p + c for _, p, c in prefill), "max_kv": max(ctx, default=0),
            "q_len": self.cfg.draft_tokens + 1 if ctx else 0,
            "q_tokens": len(ctx) * (self.cfg.draft_tokens + 1) + sum(c for _, _, c in prefill),
            "impl": self.arm.impl, "planner": self.arm.planner,
            "attn_us": round(ct.verify_us + ct.draft_us, 2), "verify_us": round(ct.verify_us, 2),
            "draft_us": round(ct.draft_us, 2), "prefill_attn_us": round(ct.prefill_attn_us, 2),
            "non_attn_us": round(ct.non_attn_us, 2), "step_us": round(ct.step_us, 2),
            "accepted": accepted, "emitted": emitted,
            "overhead_us": round(overhead * 1e6, 1), "lag_us": round(lag * 1e6, 1),
        } | self._kernel_fields(ct, ctx)

    def _kernel_fields(self, ct, ctx) -> dict:
        """Kernel in the loop: `attn_us` stays the cost model's figure (what analysis/cycles.py compares),
        `measured_attention_us` is what the step used (verify_us + draft_us); both all layers."""
        if ct.predicted_us is None:
            return {}
        return {"attn_us": round(ct.predicted_us, 2), "predicted_attention_us": round(ct.predicted_us, 2),
                "measured_attention_us": round(ct.verify_us + ct.draft_us, 2),
                "measured_attention_layer_us": round(ct.verify_layer_us, 2),
                "predicted_attention_layer_us": round(ct.predicted_verify_layer_us, 2),
                "attn_kv_tokens": sum(ctx) + len(ctx) * self.cfg.draft_tokens}  # the verify call's KV
