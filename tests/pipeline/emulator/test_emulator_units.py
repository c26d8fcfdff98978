"""Pieces of the engine on inputs small enough to check by hand."""
from __future__ import annotations

import pytest

from pipeline.config.emulator import config_from_argv
from pipeline.emulator.prefix_cache import BlockHasher, PrefixCache
from pipeline.emulator.timing import StepTimer
from pipeline.emulator.tokens import HfTokens, Tokens


def hashes(ids, block):
    h = BlockHasher(block)
    h.extend(ids)
    return h


def test_block_hasher_incremental_equals_one_shot():
    ids = list(range(100))
    a = hashes(ids, 16)
    b = hashes(ids[:7], 16)
    b.extend(ids[7:40])
    for t in ids[40:]:
        b.append(t)
    assert a.hashes == b.hashes and len(a.hashes) == 6 and a.tail == b.tail == ids[96:]
    assert hashes([9] + ids[1:], 16).hashes[5] != a.hashes[5]  # a change in block 0 changes every later hash


def test_prefix_cache_hits_whole_block_prefix_and_evicts_lru():
    cache = PrefixCache(block=4, capacity_tokens=12)
    a = hashes(list(range(10)), 4).hashes           # 2 full blocks
    cache.insert(a)
    assert cache.match(hashes(list(range(10)) + [99, 98], 4).hashes, 12) == 8
    assert cache.match(hashes([1] + list(range(1, 12)), 4).hashes, 12) == 0   # first block differs
    b = hashes(list(range(100, 112)), 4).hashes      # 3 blocks: capacity 3 evicts a's 2 (least recent)
    assert cache.match(a, 10) == 8
    cache.insert(b)
    assert len(cache) == 3 and cache.match(a, 10) == 0 and cache.match(b, 12) == 12
    assert cache.hit_rate == pytest.approx((8 + 0 + 8 + 0 + 12) / (12 + 12 + 10 + 10 + 12))


def test_prefix_cache_disabled_never_hits():
    cache = PrefixCache(block=4, capacity_tokens=100, enabled=False)
    h = hashes(list(range(8)), 4).hashes
    cache.insert(h)
    assert cache.match(h, 8) == 0


@pytest.fixture
def wordlevel_dir(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "user", "assistant", "system", ":", "alpha", "beta", "gamma", "delta", "epsilon",
             "zeta", "theta", "kappa", "lambda", "sigma", "omega", "x1", "Upper"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


def test_hf_tokens_output_words_retokenize_one_to_one(wordlevel_dir):
    t = HfTokens(str(wordlevel_dir), seed=3)
    assert set(t.words) <= {"user", "assistant", "system", "alpha", "beta", "gamma", "delta", "epsilon", "zeta",
                            "theta", "kappa", "lambda", "sigma", "omega"}
    out = [t.next_word() for _ in range(50)]
    text = "".join(t.word_texts[i] for i in out)
    assert t.encode(text) == [t.word_ids[i] for i in out]


def test_chat_ids_are_prefix_stable_across_turns(wordlevel_dir):
    t = HfTokens(str(wordlevel_dir))
    turn1 = [("system", "alpha beta"), ("user", "gamma")]
    reply = " delta epsilon"
    ids1 = t.chat_ids(turn1)
    assert ids1 == [3, 4, 5, 6, 1, 4, 7, 2, 4]  # system : alpha beta user : gamma assistant :
    ids2 = t.chat_ids(turn1 + [("assistant", reply), ("user", "zeta")])
    assert ids2[:len(ids1) + 2] == ids1 + t.encode(reply)


def test_whitespace_tokens_count_words():
    t = Tokens()
    assert len(t.encode("one two  three\nfour")) == 4
    assert len(t.chat_ids([("user", "a b c")])) == 1 + 3 + 1


class Recorder:
    """Records the calls the StepTimer makes; returns 10 us per call."""

    name = "recorder"

    def __init__(self):
        self.calls = []

    def layer_us(self, seq_lens, q_lens):
        self.calls.append((list(seq_lens), list(q_lens)))
        return 10.0

    def info(self):
        return {}


def test_step_timer_calls_and_formulas():
    cfg = config_from_argv(["--non-attn-base-us", "1000", "--non-attn-per-token-us", "2",
                            "--prefill-attention-tflops", "100"])
    rec = Recorder()
    ct = StepTimer(cfg, rec).cycle([100, 5000], [4, 1], [(0, 256)])
    # verify: q = 4 over ctx + 3; draft extend: q = accepted; draft decode: q = 1 (x2 for 3 draft tokens)
    assert rec.calls == [([103, 5003], [4, 4]), ([103, 5000], [4, 1]), ([104, 5001], [1, 1])]
    assert ct.verify_us == 15 * 10.0 and ct.draft_us == 1 * (10.0 + 2 * 10.0)
    flops = 4 * 16 * 256 * 256 * (0 + 257 / 2)
    assert ct.prefill_attn_us == pytest.approx(flops / 100e12 * 1e6 * 16)
    assert ct.non_attn_us == 1000 + 2 * (256 + 2 * 4)
    assert ct.step_us == pytest.approx(ct.verify_us + ct.draft_us + ct.prefill_attn_us + ct.non_attn_us)


def test_step_timer_plain_decode_has_no_draft_calls():
    cfg = config_from_argv(["--draft-tokens", "0", "--accept-probs", ","])
    rec = Recorder()
    ct = StepTimer(cfg, rec).cycle([50], [1], [])
    assert rec.calls == [([50], [1])] and ct.draft_us == 0.0


def test_long_messages_are_memoised_with_a_token_capacity(wordlevel_dir, monkeypatch):
    import pipeline.emulator.tokens as tokens_mod

    monkeypatch.setattr(tokens_mod, "MEMO_MIN_CHARS", 10)
    monkeypatch.setattr(tokens_mod, "MEMO_TOKENS", 2500)
    t = HfTokens(str(wordlevel_dir))
    long1, long2 = "alpha beta " * 600, "gamma " * 1000
    first = t.chat_ids([("user", long1)])
    assert t.chat_ids([("user", long1)]) == first and t._memo_tokens == 1200
    t.chat_ids([("user", long2)])                     # 1200 + 1000 ids: both fit
    t.chat_ids([("user", "delta " * 500)])            # 2700 > 2500: the least recent (long1) goes
    assert long1 not in t._memo and long2 in t._memo and t._memo_tokens == 1500
    assert t.chat_ids([("user", long1)]) == first     # re-encoded, same ids


def test_acceptance_is_a_property_of_the_request_not_of_the_arm():
    from pipeline.emulator.engine import Engine
    from pipeline.emulator.metrics import Metrics
    from pipeline.emulator.arm import Arm
    from pipeline.emulator.cost_attention import CostModelAttention

    cfg = config_from_argv(["--seed", "7"])

    def draws(env: dict, prompt: list[int], batch_mates: int, n: int = 200) -> list[int]:
        arm = Arm.from_env(env)
        engine = Engine(cfg, StepTimer(cfg, CostModelAttention(cfg, arm)), Tokens(0), arm, Metrics("m"), None)
        req = engine.new_request(prompt, 10, "length")
        mates = [engine.new_request([9, i], 10, "length") for i in range(batch_mates)]
        out = []
        for _ in range(n):  # one draw per cycle for every sequence in the batch, as _cycle does
            out.append(engine._sample_accept(req.accept_rng))
            for m in mates:
                engine._sample_accept(m.accept_rng)
        return out

    prompt = list(range(1000, 1300))
    off = draws({"VATTN": "0"}, prompt, batch_mates=0)
    on = draws({"VATTN": "1", "VATTN_PLAN": "balanced"}, prompt, batch_mates=5)  # other arm, other batch
    assert off == on and set(off) == {1, 2, 3, 4}
    assert draws({"VATTN": "0"}, prompt[:-1] + [7], batch_mates=0) != off  # another prompt, another sequence
