"""pipeline.tracegen: determinism, shape statistics, the prefix property, the committed data."""
from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from pipeline.tracegen import (PRESETS, TraceParams, _parse, build_tokenizer, main, make_session,
                               params_from_meta, read_traces, trace_stats, write_traces)

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "recipes" / "data" / "traces"
TOKENIZER = ROOT / "recipes" / "data" / "tokenizer"


def _chains(session: dict) -> list[list[dict]]:
    parent = [r for r in session["requests"] if r["type"] != "subagent"]
    return [parent] + [r["requests"] for r in session["requests"] if r["type"] == "subagent"]


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    p = replace(PRESETS["quickstart"], sessions=4)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write_traces(a, p, seed=5)
    write_traces(b, p, seed=5)
    write_traces(c, p, seed=6)
    names = sorted(f.name for f in a.iterdir())
    assert names == ["generator.meta"] + [f"session_00{i}.json" for i in range(4)]
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    assert (a / "session_000.json").read_bytes() != (c / "session_000.json").read_bytes()


def test_rewrite_removes_stale_sessions(tmp_path):
    write_traces(tmp_path, replace(TraceParams(), sessions=3), seed=0)
    write_traces(tmp_path, replace(TraceParams(), sessions=2), seed=0)
    assert len(read_traces(tmp_path)) == 2


def test_statistics_near_public_figures():
    # 80 sessions of the default (GPU-like) shape: big enough for stable means, < 1 s to make.
    p = replace(TraceParams(), sessions=80)
    st = trace_stats([make_session(p, seed=11, index=i) for i in range(p.sessions)])
    assert 0.93 <= st["prefix_token_share"] <= 0.97, st          # TraceLab 96%, InferenceX 94%
    assert 5_500 <= st["fresh_mean"] <= 7_500, st                # fresh append ~6.5k
    assert 430 <= st["output_mean"] <= 600, st                   # ~520, capped lognormal
    assert st["output_max"] <= p.output_cap
    assert 200_000 <= st["input_max"] <= p.max_context, st       # contexts up to ~250k
    assert 100_000 <= st["input_mean"] <= 200_000, st            # TraceLab mean ~154k per call
    assert st["subagents"] >= 10, st


def test_prefix_property_and_block_tiling():
    p = replace(PRESETS["agentic-h200"], sessions=12)
    for i in range(p.sessions):
        s = make_session(p, seed=3, index=i)
        bs, seen = s["block_size"], set()
        for chain in _chains(s):
            ids_here = set()
            for k, call in enumerate(chain):
                assert len(call["hash_ids"]) == call["in"] // bs  # full blocks only
                if k == 0:
                    # a chain starts on blocks no other chain of the session has used
                    assert not set(call["hash_ids"]) & seen
                else:
                    prev = chain[k - 1]
                    keep = prev["in"] // bs
                    assert call["hash_ids"][:keep] == prev["hash_ids"][:keep]
                    assert call["in"] > prev["in"] + prev["out"]   # previous output is re-sent
                    assert not set(call["hash_ids"][keep:]) & ids_here  # new blocks are new
                ids_here |= set(call["hash_ids"])
            seen |= ids_here


def test_timeline_think_times_and_subagent_join():
    p = replace(PRESETS["quickstart"], sessions=30, subagent_prob=1.0)
    for i in range(p.sessions):
        reqs = make_session(p, seed=9, index=i)["requests"]
        assert reqs[0]["t"] == 0 and reqs[0]["think_time"] is None
        end = 0.0
        for r in reqs:
            assert r["t"] >= end - 1e-6   # nothing starts before the previous step ended
            if r["type"] == "subagent":
                end = r["t"] + r["duration_ms"] / 1000
                assert r["requests"][0]["t"] == r["t"]
                assert r["requests"][-1]["stop"] == "end_turn"
            else:
                if r["think_time"] is not None:
                    assert r["t"] == pytest.approx(end + r["think_time"], abs=2e-3)
                    assert 0 < r["think_time"] <= p.think_cap
                end = r["t"] + r["api_time"]
        assert [r for r in reqs if r["type"] == "s"][-1]["stop"] == "end_turn"


def test_think_mean_is_the_mean_of_think_times():
    # Uncapped and with short contexts (fast): ~10k think times, so the sample mean's standard
    # error is ~1.3% (lognormal sd = mean * sqrt(e^sigma^2 - 1)).
    p = replace(TraceParams(), sessions=2_500, first_context_median=20_000, max_context=60_000,
                turns_max=8, think_mean=2.0, think_cap=1e9, subagent_prob=0.5)
    times = sorted(c["think_time"] for i in range(p.sessions)
                   for chain in _chains(make_session(p, seed=7, index=i)) for c in chain
                   if c["think_time"] is not None)
    assert len(times) > 8_000
    assert sum(times) / len(times) == pytest.approx(p.think_mean, rel=0.04)
    # ... and the median is not the parameter: mean * exp(-sigma^2 / 2)
    assert times[len(times) // 2] == pytest.approx(2.0 * math.exp(-0.5), rel=0.05)


def test_old_meta_name_think_median_loads_as_the_mean():
    old = {k: v for k, v in asdict(PRESETS["quickstart"]).items() if k != "think_mean"}
    assert params_from_meta({**old, "think_median": 1.0}) == PRESETS["quickstart"]
    with pytest.raises(ValueError, match=r"both an old and a new name given"):
        params_from_meta({**old, "think_median": 1.0, "think_mean": 1.0})
    args = ["traces", "--out", "x", "--think-median", "4.5"]
    assert vars(_parse(args))["think_mean"] == 4.5


@pytest.mark.parametrize("name", ["quickstart", "short", "agentic-h200"])
def test_committed_trace_sets_regenerate_byte_for_byte(name, tmp_path):
    # The project's measurements were taken on these files: generator changes must keep them.
    folder = TRACES / name
    meta = json.loads((folder / "generator.meta").read_text())
    write_traces(tmp_path, params_from_meta(meta["params"]), seed=meta["seed"])
    committed = sorted(folder.glob("*.json"))
    assert [f.name for f in committed] == sorted(f.name for f in tmp_path.glob("*.json"))
    assert all(f.read_bytes() == (tmp_path / f.name).read_bytes() for f in committed)


@pytest.mark.parametrize("name", ["quickstart", "agentic-h200"])
def test_committed_trace_sets_are_aiperf_valid(name):
    from aiperf.dataset.loader.weka_trace import WekaTraceLoader
    from aiperf.dataset.loader.weka_trace_models import WekaTrace

    folder = TRACES / name
    committed = sorted(folder.glob("*.json"))
    for f in committed:
        WekaTrace.model_validate(json.loads(f.read_text()))
    assert WekaTraceLoader.can_load(filename=folder)
    st = trace_stats(read_traces(folder))
    assert st["input_max"] >= 200_000 and st["subagents"] >= 1, st  # small in count, not length
    assert 0.9 <= st["prefix_token_share"] <= 0.97, st


def test_tokenizer_is_reproducible_small_and_loads(tmp_path):
    from transformers import AutoTokenizer

    build_tokenizer(tmp_path)
    # The training text is stdlib docstrings: byte-identical only on the Python minor version
    # the committed directory was built with.
    if sys.version_info[:2] == (3, 11):
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            assert (tmp_path / f).read_bytes() == (TOKENIZER / f).read_bytes(), f
    assert sum(f.stat().st_size for f in TOKENIZER.iterdir()) < 1_000_000
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    text = "def parse(argv):\n    return json.loads(argv[1])  # naïve résumé"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and max(ids) < len(tok) == 4096
    assert tok.eos_token == "<|endoftext|>"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_rejects_bad_vocab_size(tmp_path):
    with pytest.raises(ValueError, match=r"vocab_size: 10 is outside \[512, 65536\]"):
        build_tokenizer(tmp_path, vocab_size=10)


def test_cli_traces_and_stats(tmp_path, capsys):
    assert main(["traces", "--out", str(tmp_path / "t"), "--preset", "quickstart",
                 "--sessions", "2", "--seed", "4", "--output-mean", "300"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["sessions"] == 2
    meta = json.loads((tmp_path / "t" / "generator.meta").read_text())
    assert meta["seed"] == 4 and meta["params"]["output_mean"] == 300
    assert meta["params"]["output_cap"] == PRESETS["quickstart"].output_cap
    with pytest.raises(SystemExit, match=r"dir: '.*nope' is not a directory"):
        main(["stats", str(tmp_path / "nope")])


def test_out_must_be_a_directory(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match=r"--out: '.*file' exists and is not a directory"):
        write_traces(f, TraceParams(sessions=1), seed=0)


def test_warns_when_first_contexts_are_clamped(tmp_path, capsys):
    # The committed `short` set: a median of 8000 under the 17000 floor puts every first call
    # at exactly 17000 tokens; that used to pass silently.
    meta = json.loads((TRACES / "short" / "generator.meta").read_text())
    write_traces(tmp_path / "short", params_from_meta(meta["params"]), seed=meta["seed"])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert re.fullmatch(r"tracegen: warning: 16 of 16 first contexts clamped to the floor 17000 = "
                        r"system_tokens \+ tool_tokens \+ 1000 \(first_context_median 8000, "
                        r"first_context_sigma 0\.6\): those first calls all have in = 17000", err[0])
    write_traces(tmp_path / "cap", TraceParams(sessions=8, first_context_median=400_000), seed=0)
    assert re.match(r"tracegen: warning: 8 of 8 first contexts clamped to the cap 200000 = "
                    r"0\.8 \* max_context", capsys.readouterr().err)
    # The presets clip a few draws at the cap by design: no warning.
    for name in ("quickstart", "agentic-h200"):
        write_traces(tmp_path / name, replace(PRESETS[name], sessions=40), seed=0)
    assert capsys.readouterr().err == ""
