"""Contract tests of the vattn sglang backend against the real sglang 0.5.23 package (no GPU).

In-process: registration, CLI choices, the EAGLE draft-factory hook, method signatures, and the
gate. In a subprocess (drive_cpu.py, TRITON_INTERPRET=1): forward calls of the real backend on
sglang's real pools and metadata, routed to vattn or to the Triton base.
"""
from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))

import sglang_env  # noqa: E402

try:
    sglang_env.import_sglang()
except ImportError as exc:  # pragma: no cover - CI installs it (see .ci/run)
    pytest.skip(f"sglang 0.5.23 is not importable: {exc}", allow_module_level=True)

from vattn.sglang import gate  # noqa: E402

OVERRIDDEN = ("__init__", "forward_extend", "forward_decode", "init_forward_metadata",
              "init_forward_metadata_in_graph", "init_cuda_graph_state")


@pytest.fixture(scope="module")
def registered():
    import vattn.sglang

    vattn.sglang.register()
    vattn.sglang.register()  # idempotent
    from vattn.sglang.backend import VattnAttnBackend

    return VattnAttnBackend


def test_sglang_version_is_the_one_the_backend_targets():
    from importlib.metadata import version

    assert version("sglang") == "0.5.23"


def test_backend_is_in_sglangs_registry_and_cli(registered):
    import argparse

    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, DRAFT_ATTENTION_BACKEND_CHOICES
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.server_args import ServerArgs

    from vattn.sglang.backend import create_vattn_backend

    assert ATTENTION_BACKENDS["vattn"] is create_vattn_backend
    assert ATTENTION_BACKEND_CHOICES.count("vattn") == 1
    assert DRAFT_ATTENTION_BACKEND_CHOICES.count("vattn") == 1
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "m", "--attention-backend", "vattn"])
    assert ns.attention_backend == "vattn"


def test_backend_builds_on_sglangs_triton_backend(registered):
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    assert issubclass(registered, TritonAttnBackend) and issubclass(registered, AttentionBackend)
    public = {name for name, member in vars(registered).items() if callable(member) and not name.startswith("_")}
    # every public method defined here overrides one of the base's: sglang calls nothing new
    assert public <= set(dir(TritonAttnBackend)), public - set(dir(TritonAttnBackend))


@pytest.mark.parametrize("name", OVERRIDDEN)
def test_overridden_methods_match_the_base_signatures(registered, name):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    def shape(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert getattr(registered, name) is not getattr(TritonAttnBackend, name)
    assert shape(getattr(registered, name)) == shape(getattr(TritonAttnBackend, name))


def test_forward_modes_used_by_the_backend_exist_in_sglang():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from vattn.sglang.backend import forward_mode_name

    assert forward_mode_name(ForwardMode.TARGET_VERIFY) == "target_verify"
    assert forward_mode_name(ForwardMode.DRAFT_EXTEND_V2) == "draft_extend"
    assert forward_mode_name(ForwardMode.DECODE) == "decode"
    for other in (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.IDLE, ForwardMode.PREBUILT):
        assert forward_mode_name(other) is None


def test_draft_factory_gets_vattn_for_draft_extend_and_triton_steps_for_draft_decode(registered, monkeypatch):
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    hooked = DraftBackendFactory._create_backend
    assert [p.name for p in inspect.signature(hooked).parameters.values()] == \
        [p.name for p in inspect.signature(hooked.__wrapped__).parameters.values()]
    seen = {}

    def sglangs_method(self, backend_name, backend_map, error_template, stamps_children=False):
        seen[stamps_children] = backend_map

    monkeypatch.setattr(hooked, "__wrapped__", sglangs_method)
    factory = DraftBackendFactory.__new__(DraftBackendFactory)
    factory.draft_model_runner = object()
    triton = lambda: ("triton", None)  # noqa: E731
    factory._create_backend("decode_attention_backend", {"triton": triton}, "x {backend_type}", True)
    factory._create_backend("prefill_attention_backend", {"triton": triton}, "x {backend_type}", False)
    assert seen[True]["vattn"] is triton  # multi-step draft decode: sglang's Triton container
    assert seen[False]["vattn"] is not triton and callable(seen[False]["vattn"])


@pytest.mark.parametrize("env, expected", [(None, True), ("1", True), ("0", False), ("off", False)])
def test_vattn_env_switch(monkeypatch, env, expected):
    if env is None:
        monkeypatch.delenv("VATTN", raising=False)
    else:
        monkeypatch.setenv("VATTN", env)
    assert gate.enabled() is expected


def test_vattn_env_switch_rejects_junk(monkeypatch):
    monkeypatch.setenv("VATTN", "maybe")
    with pytest.raises(ValueError, match=r"VATTN: got 'maybe'; allowed: 0 or 1"):
        gate.enabled()


@pytest.mark.parametrize("env, expected", [(None, "balanced"), ("fixed", "fixed"), ("length_aware", "length_aware")])
def test_plan_mode_switch(monkeypatch, env, expected):
    if env is None:
        monkeypatch.delenv("VATTN_PLAN", raising=False)
    else:
        monkeypatch.setenv("VATTN_PLAN", env)
    assert gate.plan_mode() == expected


def test_plan_mode_rejects_unknown_planners(monkeypatch):
    monkeypatch.setenv("VATTN_PLAN", "greedy")
    with pytest.raises(ValueError, match=r"VATTN_PLAN: got 'greedy'; allowed: balanced, length_aware, fixed"):
        gate.plan_mode()


def test_plan_modes_are_vattns_planners():
    from vattn.planner import PLANNERS

    assert set(gate.PLAN_MODES) == set(PLANNERS)


QWEN35_TP2 = gate.ModelFacts(head_dim=256, v_head_dim=256, num_q_heads=16, num_kv_heads=1, page_size=16,
                             kv_dtype="float8_e4m3fn", q_dtype="bfloat16", sliding_window=False, use_mla=False,
                             dcp_size=1, translated_kv_ids=False, speculative_topk=1, verify_q_len=4)


def _model(**changes):
    return gate.ModelFacts(**{**QWEN35_TP2.__dict__, **changes})


@pytest.mark.parametrize("changes", [
    {}, {"num_q_heads": 8}, {"kv_dtype": "bfloat16"}, {"head_dim": 128, "v_head_dim": 128}, {"head_dim": 64, "v_head_dim": 64},
    {"page_size": 1}, {"page_size": 64}, {"speculative_topk": 0, "verify_q_len": 0}, {"q_dtype": "float16"},
])
def test_gate_accepts_supported_models(changes):
    assert gate.model_reason(_model(**changes)) is None


@pytest.mark.parametrize("changes, reason", [
    ({"head_dim": 96, "v_head_dim": 96}, r"head_dim 96"),
    ({"v_head_dim": 128}, r"v_head_dim 128 != head_dim 256"),
    ({"page_size": 32}, r"page_size 32"),
    ({"kv_dtype": "float8_e5m2"}, r"KV dtype float8_e5m2"),
    ({"kv_dtype": "float16"}, r"KV dtype float16"),
    ({"sliding_window": True}, r"sliding-window"),
    ({"use_mla": True}, r"MLA"),
    ({"speculative_topk": 4}, r"speculative topk 4"),
    ({"num_q_heads": 64}, r"GQA group 64"),
    ({"num_q_heads": 15, "num_kv_heads": 2}, r"15 q heads over 2 KV heads"),
    ({"dcp_size": 2}, r"decode context parallel"),
    ({"translated_kv_ids": True}, r"translated KV ids"),
    ({"verify_q_len": 9}, r"9 draft tokens"),
])
def test_gate_rejects_unsupported_models(changes, reason):
    found = gate.model_reason(_model(**changes))
    assert found is not None and re.search(reason, found), found


PLAIN_LAYER = gate.LayerFacts(head_dim=256, v_head_dim=256, logit_cap=0.0, sliding_window_size=-1,
                              is_cross_attention=False, decoder_causal=True, has_sinks=False, has_score_mod=False,
                              xai_temperature_len=-1)


@pytest.mark.parametrize("mode, q_len", [("target_verify", 4), ("draft_extend", 4), ("draft_extend", 1),
                                         ("decode", 1), ("target_verify", 8)])
def test_gate_accepts_plain_layers(mode, q_len):
    assert gate.layer_reason(PLAIN_LAYER, mode, q_len) is None


@pytest.mark.parametrize("changes, mode, q_len, reason", [
    ({"logit_cap": 30.0}, "target_verify", 4, "softcap"),
    ({"sliding_window_size": 128}, "decode", 1, "sliding window"),
    ({"has_sinks": True}, "target_verify", 4, "sinks"),
    ({"has_score_mod": True}, "decode", 1, "score_mod"),
    ({"is_cross_attention": True}, "decode", 1, "cross attention"),
    ({"decoder_causal": False}, "decode", 1, "non-causal"),
    ({}, "extend", 4, "mode 'extend'"),
    ({}, "target_verify", 9, "q_len 9"),
    ({"head_dim": 192, "v_head_dim": 128}, "decode", 1, "head_dim 192/128"),
])
def test_gate_rejects_layers(changes, mode, q_len, reason):
    facts = gate.LayerFacts(**{**PLAIN_LAYER.__dict__, **changes})
    assert reason in gate.layer_reason(facts, mode, q_len)


# -- forward routing, in a subprocess (TRITON_INTERPRET=1 must precede sglang's kernel imports) --

@pytest.fixture(scope="module")
def routed():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    env.pop("VATTN", None)
    proc = subprocess.run([sys.executable, str(HERE / "drive_cpu.py")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.slow
def test_verify_reaches_vattn_with_sglangs_block_table_and_lengths(routed):
    v = routed["verify"]
    assert v["base_extend"] == 0 and len(v["calls"]) == 2
    call = v["calls"][0]
    assert call["seq_lens"] == [23, 44]  # committed prefix + 4 draft tokens
    assert call["cu"] == [0, 4, 8]
    assert call["kv_shape"] == [65, 16, 1, 256]  # [slots / P, P, Hkv, D] view of the token pool
    for row, expected in zip(call["block_tables"], v["expected_tables"]):
        assert row[: len(expected)] == expected
    assert v["kv_written"], "the draft tokens' K must be in the pool before vattn reads it"
    assert v["max_err"] <= 2e-2 * max(v["ref_scale"], 1.0)
    assert v["plan_ids"][0] == v["plan_ids"][1], "every layer of a forward reuses one plan"


@pytest.mark.slow
def test_draft_extend_and_decode_reach_vattn_with_post_write_lengths(routed):
    assert routed["draft_extend"] == {"vattn": 1, "base_extend": 0, "base_decode": 0, "seq_lens": [[27]],
                                      "cu": [[0, 4]]}
    assert routed["decode"] == {"vattn": 1, "base_extend": 0, "base_decode": 0, "seq_lens": [[33]], "cu": [[0, 1]]}


@pytest.mark.slow
@pytest.mark.parametrize("case", ["extend", "softcap", "sinks", "stale_batch", "vattn_off"])
def test_everything_else_goes_to_the_base_backend(routed, case):
    assert routed[case]["vattn"] == 0 and routed[case]["base_extend"] == 1
    if case == "vattn_off":
        assert routed[case]["reason"] == "VATTN=0"


@pytest.mark.slow
def test_failure_warns_once_and_the_base_serves_from_then_on(routed):
    f = routed["failure"]
    assert f["vattn_attempts"] == 1 and f["base_extend"] == 3
    assert len(f["warnings"]) == 1 and "simulated build failure" in f["warnings"][0]
    assert f["out_shape"] == [4, 16 * 256]
