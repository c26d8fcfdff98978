"""Synthetic agentic traces and the project's small tokenizer, both made here, both deterministic.

    python -m pipeline.tracegen tokenizer recipes/data/tokenizer
    python -m pipeline.tracegen traces --out recipes/data/traces/quickstart --preset quickstart

Traces are written in the Weka kv-cache-tester format that aiperf 0.13 replays natively
(`--custom-dataset-type weka_trace --input-file DIR`): one JSON file per session, each call
listing the hash ids of its input blocks, so prefix reuse across turns is explicit.

Shape (DESIGN.md, "Load and accuracy"; public figures from TraceLab and the InferenceX corpus):
- a trace is a window of a longer coding-agent session: its first call carries the history so
  far (lognormal `first_context_*`; cold for the server), every later call re-sends the whole
  previous input plus the previous output plus a fresh append (tool results, the next
  instruction; lognormal, mean `fresh_mean` ~6.5k), so ~94-96% of a continuation call's input
  is a prefix the previous call already sent;
- outputs are lognormal with mean `output_mean` ~520 tokens, capped at `output_cap`;
- contexts grow turn by turn until the next call would pass `max_context` (~250k);
- between calls the agent waits for tools (`think_time`, lognormal with mean `think_mean`, capped;
  its median is mean * exp(-sigma^2/2), 0.61x the mean at the default sigma 1);
- with probability `subagent_prob` per session one or two subagents branch off after a parent
  call: their own short context (own system prompt, a task), a few calls, then the parent
  resumes after the subagent's end.
`api_time` is a nominal server time (prefill of the fresh part + decode at `decode_ms_per_token`)
so that the recorded timeline (t) is consistent; aiperf replays the idle gaps between calls.

What a prefix cache sees, and how it differs from production (both arms replay the same files
through the same aiperf, so each limit costs both arms the same prefill; it shifts absolute
cache-hit rates and TTFTs, not which arm the comparison favours):
- nothing is shared across sessions. Each session's system + tool prefix (`system_tokens` +
  `tool_tokens`, 16k by default) gets its own block ids, and aiperf 0.13 only reads
  `hash_id_scope: "local"` (its schema rejects "global") and seeds a block's tokens by (trace
  file, hash id), so equal ids in two files are different text anyway. In production those 16k
  tokens are identical across sessions and served from cache after the first; here every
  session's first call prefills them cold, and each session's copy takes its own KV-cache room
  (more eviction pressure than one shared copy). A shared prefix cannot be written in this
  format until aiperf reads a global scope, so there is no parameter for it.
- within a chain, a continuation call reuses the previous call's full blocks only. `_Chain.extend`
  gives the previous input's partial tail block (< `block_size` tokens) a new id, and the
  previous output is re-sent as new blocks that aiperf fills with synthetic text, not with what
  the server generated. A radix cache that kept the previous turn's partial block and output
  (production re-sends them verbatim) recomputes them here: about `output_mean` + half a block
  (~550 tokens) per continuation call, under 1% of its input at the default shape.
  `trace_stats`'s prefix share counts full matching blocks only, i.e. what the cache can reuse.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import warnings
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from pipeline.io import write_json_atomic, write_text_atomic

MODEL = "agentic-emulated"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# ChatML: the emulator and aiperf's --apply-chat-template count the same template tokens.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] if message['content'] is string else '' }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TraceParams:
    """Generator knobs; token counts are tokens of the project tokenizer, times are seconds."""

    sessions: int = 10
    turns_min: int = 3                 # parent calls per session (uniform in [min, max])
    turns_max: int = 6
    block_size: int = 64               # tokens per hash id; aiperf's weka_trace loader uses 64
    system_tokens: int = 4_000         # system prompt of every call (part of the cached prefix)
    tool_tokens: int = 12_000          # tool definitions, ditto
    first_context_median: int = 120_000  # first call of the window: lognormal median ...
    first_context_sigma: float = 0.5   # ... and log-space spread, clipped to [prefix+1k, 0.8 max_context]
    fresh_mean: int = 6_500            # fresh append per continuation call: lognormal mean
    fresh_sigma: float = 1.0
    fresh_cap: int = 40_000
    output_mean: int = 520             # output tokens per call: lognormal mean, capped
    output_sigma: float = 0.9
    output_cap: int = 4_096
    max_context: int = 250_000         # a session ends before a call would exceed this input
    think_mean: float = 2.0            # tool/think time before a continuation call: lognormal mean
    think_sigma: float = 1.0
    think_cap: float = 30.0
    subagent_prob: float = 0.3         # per session: chance of subagents (one, sometimes two)
    subagent_turns_min: int = 2
    subagent_turns_max: int = 4
    subagent_system_tokens: int = 3_000
    subagent_task_median: int = 4_000  # first subagent call = its system prompt + task
    subagent_fresh_mean: int = 2_500
    subagent_output_mean: int = 300
    decode_ms_per_token: float = 20.0  # nominal api_time model (only shapes the timeline)
    prefill_tokens_per_s: float = 20_000.0


PRESETS: dict[str, TraceParams] = {
    # CPU quickstart: few sessions, short think times; first calls kept moderate (their cold
    # prefill is quadratic in the emulator) yet contexts still reach ~240k.
    #   stats (seed 1): prefix token share 0.92, mean input 82k, max 236k, 3 subagents.
    "quickstart": TraceParams(sessions=10, turns_min=3, turns_max=5, first_context_median=70_000,
                              first_context_sigma=0.6, output_cap=2048, think_mean=1.0,
                              think_cap=8.0, subagent_prob=0.25),
    # GPU run: more calls per session, realistic tool waits.
    #   stats (seed 2): prefix token share 0.95, mean input 140k, max 249k, 7 subagents.
    "agentic-h200": TraceParams(sessions=16, turns_min=6, turns_max=12,
                                first_context_median=130_000, think_mean=3.0,
                                think_cap=60.0, subagent_prob=0.35),
}


# Parameter names of older generator.meta files -> today's names. `think_median` was always drawn
# as a lognormal *mean* (`_lognormal`), so it maps to `think_mean` unchanged: the committed traces,
# on which the project's measurements were taken, regenerate byte for byte.
_RENAMED = {"think_median": "think_mean"}


def params_from_meta(params: dict) -> TraceParams:
    """TraceParams from a generator.meta's "params", accepting the older names in `_RENAMED`."""
    new = {_RENAMED.get(k, k): v for k, v in params.items()}
    if len(new) != len(params):
        raise ValueError(f"params: both an old and a new name given ({sorted(params)}); keep one")
    return TraceParams(**new)


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    """Lognormal draw with the given *mean* (not median): mu = ln(mean) - sigma^2/2."""
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


class _Chain:
    """One agent's context as a growing list of block hash ids (parent or subagent)."""

    def __init__(self, p: TraceParams, next_id: list[int]):
        self.p, self._next_id, self.ids, self.tokens = p, next_id, [], 0

    def extend(self, n_tokens: int) -> None:
        # Full blocks of the old input keep their ids; the old partial tail block is re-filled
        # by new content, so it gets a new id (a block's hash covers its whole content).
        self.tokens += n_tokens
        keep = min(len(self.ids), (self.tokens - n_tokens) // self.p.block_size)
        del self.ids[keep:]
        while len(self.ids) < self.tokens // self.p.block_size:
            self.ids.append(self._next_id[0])
            self._next_id[0] += 1


def _call(p: TraceParams, t: float, chain: _Chain, out: int, fresh: int, think: float | None,
          stop: str) -> dict:
    api = 0.3 + fresh / p.prefill_tokens_per_s + out * p.decode_ms_per_token / 1000
    return {"t": round(t, 3), "type": "s", "model": MODEL, "in": chain.tokens, "out": out,
            "hash_ids": list(chain.ids), "stop": stop, "api_time": round(api, 3),
            "think_time": None if think is None else round(think, 3)}


def _output(rng: random.Random, p: TraceParams, mean: float) -> int:
    return max(1, min(p.output_cap, round(_lognormal(rng, mean, p.output_sigma))))


def _subagent(rng: random.Random, p: TraceParams, t0: float, next_id: list[int], k: int) -> dict:
    chain = _Chain(p, next_id)
    task = max(256, round(rng.lognormvariate(math.log(p.subagent_task_median), 0.5)))
    chain.extend(p.subagent_system_tokens + task)
    n = rng.randint(p.subagent_turns_min, p.subagent_turns_max)
    requests, t, fresh = [], t0, chain.tokens
    for i in range(n):
        think = None if i == 0 else min(p.think_cap, _lognormal(rng, p.think_mean, p.think_sigma))
        if i:
            fresh = max(1, min(p.fresh_cap, round(_lognormal(rng, p.subagent_fresh_mean, p.fresh_sigma))))
            chain.extend(requests[-1]["out"] + fresh)
            t += requests[-1]["api_time"] + think
        requests.append(_call(p, t, chain, _output(rng, p, p.subagent_output_mean), fresh, think,
                              "tool_use" if i < n - 1 else "end_turn"))
    end = t + requests[-1]["api_time"]
    return {"t": round(t0, 3), "type": "subagent", "agent_id": f"agent_{k:03d}",
            "subagent_type": "Explore", "duration_ms": round((end - t0) * 1000),
            "total_tokens": sum(r["in"] + r["out"] for r in requests),
            "tool_use_count": n - 1, "status": "completed", "requests": requests,
            "models": [MODEL], "tool_tokens": 0, "system_tokens": p.subagent_system_tokens}


def _first_context_bounds(p: TraceParams) -> tuple[int, float]:
    """[floor, cap] of a first context: the shared prefix plus 1k, and room for continuations."""
    return p.system_tokens + p.tool_tokens + 1_000, 0.8 * p.max_context


def make_session(p: TraceParams, seed: int, index: int) -> dict:
    """One session (a Weka trace object); deterministic in (p, seed, index)."""
    return _make_session(p, seed, index)[0]


def _make_session(p: TraceParams, seed: int, index: int) -> tuple[dict, str | None]:
    """The session, and which bound clamped its first context ("floor", "cap" or None)."""
    rng = random.Random(f"{seed}:{index}")
    next_id = [0]
    chain = _Chain(p, next_id)
    lo, hi = _first_context_bounds(p)
    first = rng.lognormvariate(math.log(p.first_context_median), p.first_context_sigma)
    clamped = "floor" if first < lo else "cap" if first > hi else None
    chain.extend(round(min(max(first, lo), hi)))
    turns = rng.randint(p.turns_min, p.turns_max)
    spawn_after = set()
    if rng.random() < p.subagent_prob:
        spawn_after = set(rng.sample(range(turns - 1), k=min(turns - 1, rng.choice((1, 1, 2)))))
    requests: list[dict] = []
    t, fresh, last, n_sub, resume = 0.0, chain.tokens, None, 0, 0.0
    for i in range(turns):
        think = None
        if last is not None:
            fresh = max(1, min(p.fresh_cap, round(_lognormal(rng, p.fresh_mean, p.fresh_sigma))))
            if chain.tokens + last["out"] + fresh > p.max_context:
                break
            think = min(p.think_cap, _lognormal(rng, p.think_mean, p.think_sigma))
            chain.extend(last["out"] + fresh)
            t = resume + think
        last = _call(p, t, chain, _output(rng, p, p.output_mean), fresh, think, "tool_use")
        requests.append(last)
        resume = t + last["api_time"]
        if i in spawn_after:
            n_sub += 1
            sub = _subagent(rng, p, resume + 0.2, next_id, n_sub)
            requests.append(sub)
            resume = sub["t"] + sub["duration_ms"] / 1000
    last["stop"] = "end_turn"
    return {"id": f"session_{index:03d}", "models": [MODEL], "block_size": p.block_size,
            "hash_id_scope": "local", "tool_tokens": p.tool_tokens,
            "system_tokens": p.system_tokens, "requests": requests}, clamped


# Share of first-context draws at one bound above which the trace is told it is degenerate.
# The floor should bind rarely (a first call is the history so far, well past the prefix); the
# cap clips the long tail by design (defaults and presets: ~10-20% of draws), hence its higher
# threshold.
_CLAMP_WARN = {"floor": 0.1, "cap": 0.25}


def _warn_clamped(p: TraceParams, clamps: list[str | None]) -> None:
    """One stderr line per bound that clamped more than its share of first contexts."""
    lo, hi = _first_context_bounds(p)
    for bound, value, rule in (("floor", lo, "system_tokens + tool_tokens + 1000"),
                               ("cap", round(hi), "0.8 * max_context")):
        n = clamps.count(bound)
        if clamps and n / len(clamps) > _CLAMP_WARN[bound]:
            print(f"tracegen: warning: {n} of {len(clamps)} first contexts clamped to the {bound} "
                  f"{value} = {rule} (first_context_median {p.first_context_median}, "
                  f"first_context_sigma {p.first_context_sigma}): those first calls all have "
                  f"in = {value}", file=sys.stderr)


def write_traces(out: Path, p: TraceParams, seed: int) -> list[Path]:
    """Write one `<id>.json` per session plus `generator.json` (the parameters, seed)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: '{out}' exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("session_*.json"):
        stale.unlink()
    paths, clamps = [], []
    for i in range(p.sessions):
        s, clamped = _make_session(p, seed, i)
        clamps.append(clamped)
        path = out / f"{s['id']}.json"
        write_text_atomic(path, json.dumps(s, separators=(",", ":")) + "\n")
        paths.append(path)
    # Not named *.json: aiperf's loader reads every *.json in the directory as a trace.
    write_json_atomic(out / "generator.meta", {"seed": seed, "params": asdict(p)})
    _warn_clamped(p, clamps)
    return paths


def read_traces(trace_dir: Path) -> list[dict]:
    """Every session of a trace directory (the `*.json` files aiperf would read), sorted by name."""
    return [json.loads(f.read_text()) for f in sorted(Path(trace_dir).glob("*.json"))]


def _calls(session: dict) -> list[list[dict]]:
    """Call chains of a session: the parent's calls, then each subagent's."""
    chains = [[r for r in session["requests"] if r["type"] != "subagent"]]
    chains += [r["requests"] for r in session["requests"] if r["type"] == "subagent"]
    return chains


def trace_stats(sessions: list[dict]) -> dict:
    """Shape statistics: what DESIGN.md's public figures are compared with.

    prefix_fraction: per continuation call, the share of its input held in blocks the previous
    call of the same chain already sent (hash-id longest common prefix x block size / input);
    prefix_token_share: the same over all continuation-call input tokens (TraceLab's "96% of
    input tokens served from the prefix cache" is this token-weighted figure).
    """
    fractions, fresh, outputs, inputs, first = [], [], [], [], []
    cached = cont_in = 0
    n_sub = 0
    for s in sessions:
        bs = s["block_size"]
        for k, chain in enumerate(_calls(s)):
            n_sub += k > 0
            for i, call in enumerate(chain):
                outputs.append(call["out"])
                inputs.append(call["in"])
                if i == 0:
                    first.append(call["in"])
                    continue
                prev = chain[i - 1]["hash_ids"]
                lcp = next((j for j, (a, b) in enumerate(zip(prev, call["hash_ids"])) if a != b),
                           min(len(prev), len(call["hash_ids"])))
                fractions.append(lcp * bs / call["in"])
                cached += lcp * bs
                cont_in += call["in"]
                fresh.append(call["in"] - chain[i - 1]["in"] - chain[i - 1]["out"])
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return {"sessions": len(sessions), "subagents": n_sub, "calls": len(inputs),
            "continuation_calls": len(fractions), "input_max": max(inputs),
            "input_mean": mean(inputs), "first_input_mean": mean(first),
            "prefix_fraction_mean": mean(fractions),
            "prefix_token_share": cached / cont_in if cont_in else float("nan"), "fresh_mean": mean(fresh),
            "output_mean": mean(outputs), "output_max": max(outputs)}


def _train_texts() -> list[str]:
    """Training text: docstrings of a fixed set of stdlib modules (English prose plus code words)."""
    import importlib

    mods = ("argparse asyncio collections csv dataclasses datetime decimal email functools "
            "http.client itertools json logging os pathlib random re shutil socket sqlite3 "
            "statistics string subprocess tarfile textwrap threading typing unittest "
            "urllib.request zipfile").split()
    texts = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # typing.io / typing.re on access
        for name in mods:
            texts += _module_docs(importlib.import_module(name), name)
    return [t for t in texts if t]


def _module_docs(mod, name: str) -> list[str]:
    import inspect

    texts = [inspect.getdoc(mod) or ""]
    for key, obj in sorted(vars(mod).items()):
        # Only what the module defines: its namespace also holds whatever other imports
        # added (transformers even patches logging.Logger), which would make the
        # vocabulary depend on the caller's imports.
        if (key.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj))
                or getattr(obj, "__module__", None) != name):
            continue
        texts.append(inspect.getdoc(obj) or "")
        if inspect.isclass(obj):
            texts += [inspect.getdoc(f) or "" for k, f in sorted(vars(obj).items())
                      if not k.startswith("_") and inspect.isfunction(f)
                      and f.__module__ == name]
    return texts


def build_tokenizer(out: Path, vocab_size: int = 4096) -> Path:
    """A byte-level BPE (no unknown tokens: any text round-trips) saved as a HF tokenizer dir.

    Loads offline with `transformers.AutoTokenizer.from_pretrained(out)` and aiperf's
    `--tokenizer out`; carries a ChatML chat template and <|endoftext|> as eos/pad. Trained on
    stdlib docstrings, so byte-reproducible for a given Python minor version (committed: 3.11).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 512 or vocab_size > 65_536:
        raise ValueError(f"vocab_size: {vocab_size} is outside [512, 65536]")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_train_texts(), trainer)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "tokenizer.json", tok.to_str() + "\n")
    eos = SPECIAL_TOKENS[0]
    specials = {"bos_token": eos, "eos_token": eos, "pad_token": eos, "unk_token": eos,
                "additional_special_tokens": list(SPECIAL_TOKENS[1:])}
    write_json_atomic(out / "special_tokens_map.json", specials)
    write_json_atomic(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1_048_576,
        "clean_up_tokenization_spaces": False, "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE, **specials})
    return out


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m pipeline.tracegen", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenizer", help="build the project tokenizer directory")
    t.add_argument("out", type=Path)
    t.add_argument("--vocab-size", type=int, default=4096)
    g = sub.add_parser("traces", help="write a synthetic agentic trace directory (weka_trace)")
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="start from a preset; any flag below overrides it")
    for f in fields(TraceParams):
        g.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None)
    # Old spelling of --think-mean (it always set the mean); kept so old command lines still work.
    g.add_argument("--think-median", dest="think_mean", type=float, default=None,
                   help=argparse.SUPPRESS)
    s = sub.add_parser("stats", help="print the shape statistics of a trace directory")
    s.add_argument("dir", type=Path)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.cmd == "tokenizer":
        print(build_tokenizer(args.out, args.vocab_size))
    elif args.cmd == "traces":
        p = PRESETS[args.preset] if args.preset else TraceParams()
        p = replace(p, **{f.name: getattr(args, f.name) for f in fields(TraceParams)
                          if getattr(args, f.name) is not None})
        write_traces(args.out, p, args.seed)
        print(json.dumps(trace_stats(read_traces(args.out)), indent=1))
    else:
        if not args.dir.is_dir():
            raise SystemExit(f"dir: '{args.dir}' is not a directory")
        print(json.dumps(trace_stats(read_traces(args.dir)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
