"""Prometheus text metrics under sglang's names, so dashboards and scrapers built for sglang read them."""
from __future__ import annotations

import bisect
from collections import deque

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160)
E2E_BUCKETS = (0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320, 640)
WINDOW_S = 5.0  # gen_throughput and spec_accept_length are over the last few seconds, as sglang logs them


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.sum += v
        self.count += 1


class Metrics:
    def __init__(self, model: str):
        # Prometheus' text format: a label value escapes backslash, double quote and newline
        escaped = model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        self.labels = f'model_name="{escaped}"'
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0
        self.requests = 0
        self.finished = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self._window: deque[tuple[float, int, int, int]] = deque()  # (t, emitted, accepted, decode seqs)

    def on_submit(self, prompt_tokens: int) -> None:
        self.requests += 1
        self.prompt_tokens += prompt_tokens

    def on_admit(self, cached: int) -> None:
        self.cached_tokens += cached

    def on_first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def on_finish(self, generated: int, e2e_s: float) -> None:
        self.finished += 1
        self.e2e.observe(e2e_s)

    def on_cycle(self, t: float, emitted: int, accepted: list[int]) -> None:
        self.generation_tokens += emitted
        w = self._window
        w.append((t, emitted, sum(accepted), len(accepted)))
        while w and w[0][0] < t - WINDOW_S:
            w.popleft()

    def render(self, engine) -> str:
        w = self._window
        span = (w[-1][0] - w[0][0]) if len(w) > 1 else 0.0
        gen_tput = sum(x[1] for x in w) / span if span > 0 else 0.0
        seqs = sum(x[3] for x in w)
        accept_len = sum(x[2] for x in w) / seqs if seqs else 0.0
        gauges = {
            "num_running_reqs": len(engine.running),
            "num_queue_reqs": len(engine.waiting),
            "num_used_tokens": sum(r.ctx for r in engine.running),
            "cache_hit_rate": engine.cache.hit_rate,
            "spec_accept_length": accept_len,
            "gen_throughput": gen_tput,
        }
        counters = {
            "prompt_tokens_total": self.prompt_tokens,
            "generation_tokens_total": self.generation_tokens,
            "cached_tokens_total": self.cached_tokens,
            "num_requests_total": self.requests,
            "num_finished_requests_total": self.finished,
            "num_cycles_total": engine.cycles,
        }
        out = []
        for name, v in gauges.items():
            out += [f"# HELP sglang:{name} {name.replace('_', ' ')}", f"# TYPE sglang:{name} gauge",
                    f"sglang:{name}{{{self.labels}}} {float(v)}"]
        for name, v in counters.items():
            out += [f"# HELP sglang:{name} {name.replace('_', ' ')}", f"# TYPE sglang:{name} counter",
                    f"sglang:{name}{{{self.labels}}} {float(v)}"]
        out += self._histogram("time_to_first_token_seconds", self.ttft)
        out += self._histogram("e2e_request_latency_seconds", self.e2e)
        return "\n".join(out) + "\n"

    def _histogram(self, name: str, h: Histogram) -> list[str]:
        lines = [f"# HELP sglang:{name} {name.replace('_', ' ')}", f"# TYPE sglang:{name} histogram"]
        cum = 0
        for le, c in zip([*map(str, h.buckets), "+Inf"], h.counts):
            cum += c
            lines.append(f'sglang:{name}_bucket{{{self.labels},le="{le}"}} {cum}')
        lines += [f"sglang:{name}_sum{{{self.labels}}} {h.sum}", f"sglang:{name}_count{{{self.labels}}} {h.count}"]
        return lines
