"""Contract tests of the vattn sglang backend against the real sglang package, 0.5.17 or 0.5.23
(tox runs one env per version; no GPU).

In-process: registration, CLI choices, the EAGLE draft-factory hook, delegation of sglang's
AttentionBackend declarations, and the gate (the base choice and the counters' format:
test_base_counters.py). In a subprocess (drive_cpu.py, TRITON_INTERPRET=1):
forward calls of the real wrapper on sglang's real pools and metadata over the real Triton base and
a recording stand-in for FA3, routed to vattn or to the base, and counted.
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

from vattn.contract import FP8_TOLERANCE

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE))

import sglang_env  # noqa: E402

sglang_env.require_sglang()

from vattn.sglang import counters, gate  # noqa: E402

# the hooks the wrapper itself implements (each calls the base's first); every other name
# sglang's AttentionBackend declares is forwarded to the base
OVERRIDDEN = ("forward", "forward_extend", "forward_decode", "init_forward_metadata",
              "init_forward_metadata_out_graph", "init_forward_metadata_in_graph", "init_cuda_graph_state")


@pytest.fixture(scope="module")
def registered():
    import vattn.sglang

    vattn.sglang.register()
    vattn.sglang.register()  # idempotent
    from vattn.sglang.backend import VattnAttnBackend

    return VattnAttnBackend


def test_sglang_version_is_one_the_backend_supports():
    from vattn.sglang import compat

    assert compat.SGLANG_VERSION in compat.SUPPORTED, compat.SGLANG_VERSION


def test_backend_is_in_sglangs_registry_and_cli(registered):
    import argparse

    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.server_args import ServerArgs

    from vattn.sglang.backend import create_vattn_backend

    try:
        from sglang.srt.arg_groups import choices
    except ImportError:  # 0.5.17: one list, in server_args, also offered to the draft flag
        from sglang.srt import server_args as choices
    assert ATTENTION_BACKENDS["vattn"] is create_vattn_backend
    assert choices.ATTENTION_BACKEND_CHOICES.count("vattn") == 1
    assert getattr(choices, "DRAFT_ATTENTION_BACKEND_CHOICES", ["vattn"]).count("vattn") == 1
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "m", "--attention-backend", "vattn"])
    assert ns.attention_backend == "vattn"


def test_pyproject_declares_the_sglang_plugin_entry_point(registered):
    """sglang's launch_server and its scheduler processes call load_plugins(), which runs every
    `sglang.srt.plugins` entry point: this one makes `--attention-backend vattn` valid there."""
    import importlib
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    target = project.get("entry-points", {}).get("sglang.srt.plugins", {}).get("vattn")
    assert target == "vattn.sglang:register", target
    module, func = target.split(":")
    getattr(importlib.import_module(module), func)()  # idempotent after the fixture's register()
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP

    assert GENERAL_PLUGINS_GROUP == "sglang.srt.plugins"


def test_the_draft_hook_resolves_no_base_unless_sglang_picks_vattn(registered, monkeypatch):
    """With the entry point, every sglang process registers vattn, so the draft hook must not
    touch the base choice (which reads the runner) for a draft that does not use vattn."""
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    from vattn.sglang import base as base_choice

    def boom(runner):
        raise AssertionError("resolved")

    monkeypatch.setattr(base_choice, "resolve", boom)
    seen = {}

    def sglangs_method(self, backend_name, backend_map, error_template, *args, **kwargs):
        seen["map"] = backend_map
        return backend_map["triton"]()

    monkeypatch.setattr(DraftBackendFactory._create_backend, "__wrapped__", sglangs_method)
    factory = DraftBackendFactory.__new__(DraftBackendFactory)
    factory.draft_model_runner = object()
    made = factory._create_backend("prefill_attention_backend",
                                   {"triton": _creator("_create_triton_prefill_backend")}, "x {backend_type}")
    assert made == ("stamp", "made by _create_triton_prefill_backend")
    with pytest.raises(AssertionError, match="resolved"):
        seen["map"]["vattn"]()


def test_deterministic_mode_accepts_vattn_only_when_asked(registered, monkeypatch):
    import vattn.sglang

    try:
        from sglang.srt.arg_groups import choices
    except ImportError:  # 0.5.17
        from sglang.srt import server_args as choices
    lists = (choices.DETERMINISTIC_ATTENTION_BACKEND_CHOICES, choices.RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND)
    assert all("vattn" not in names for names in lists)
    monkeypatch.setenv("VATTN_DETERMINISTIC", "1")
    try:
        vattn.sglang._add_cli_choices()
        assert all(names.count("vattn") == 1 for names in lists)
    finally:
        for names in lists:
            while "vattn" in names:
                names.remove("vattn")


def test_every_attention_backend_declaration_is_overridden_or_forwarded(registered):
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    assert issubclass(registered, AttentionBackend)
    declared = {n for n in vars(AttentionBackend) if not n.startswith("__") and not n.startswith("_abc")}
    # nothing of the ABC's own defaults (flags, no-op hooks) may shadow the base's through inheritance
    inherited = {n for n in declared if n not in vars(registered)}
    assert not inherited, inherited
    public = {n for n, m in vars(registered).items() if callable(m) and not n.startswith("_") and n != "wrap"}
    assert public <= declared, public - declared  # sglang calls nothing new


@pytest.mark.parametrize("name", OVERRIDDEN)
def test_overridden_hooks_accept_every_call_shape_of_the_base(registered, name):
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    ours = inspect.signature(getattr(registered, name)).parameters
    theirs = [p for p in inspect.signature(getattr(AttentionBackend, name)).parameters.values()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    assert [p.name for p in theirs] == list(ours)[: len(theirs)]


def test_forward_modes_used_by_the_backend_exist_in_sglang():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from vattn.sglang.backend import forward_mode_name, mode_key

    assert forward_mode_name(ForwardMode.TARGET_VERIFY) == "target_verify"
    assert forward_mode_name(ForwardMode.DRAFT_EXTEND_V2) == "draft_extend"
    assert forward_mode_name(ForwardMode.DECODE) == "decode"
    for other in (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.IDLE, ForwardMode.PREBUILT):
        assert forward_mode_name(other) is None
    assert [mode_key(m) for m in (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.IDLE)] == \
        ["extend", "extend", "other"]
    assert set(gate.MODES) < set(counters.MODES)


def _creator(name):
    def create():
        return ("stamp", f"made by {name}")

    create.__name__ = name
    return create


@pytest.mark.parametrize("style", ["0.5.23", "0.5.17"])
def test_draft_factory_wraps_the_bases_draft_extend_and_keeps_its_multistep_decode(registered, monkeypatch, style):
    """The hook is version-agnostic: 0.5.23 says `stamps_children`; 0.5.17's maps differ only in
    their creators' names (`_create_*_decode_backend` vs `_create_*_prefill_backend`)."""
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    import vattn.sglang.backend as backend_module

    monkeypatch.setenv("VATTN_BASE", "fa3")
    seen, wrapped = {}, []

    def sglangs_method(self, backend_name, backend_map, error_template, *args, **kwargs):
        seen[backend_name] = backend_map

    monkeypatch.setattr(DraftBackendFactory._create_backend, "__wrapped__", sglangs_method)
    monkeypatch.setattr(backend_module, "wrap", lambda b, runner, name: wrapped.append((b, runner, name)) or "W")
    factory = DraftBackendFactory.__new__(DraftBackendFactory)
    factory.draft_model_runner = runner = object()
    decode = {n: _creator(f"_create_{n}_decode_backend") for n in ("triton", "fa3")}
    extend = {n: _creator(f"_create_{n}_prefill_backend") for n in ("triton", "fa3")}
    extra = ({"stamps_children": True}, {"stamps_children": False}) if style == "0.5.23" else ({}, {})
    factory._create_backend("decode_attention_backend", decode, "x {backend_type}", **extra[0])
    factory._create_backend("prefill_attention_backend", extend, "x {backend_type}", **extra[1])
    # the base's own multi-step container
    assert seen["decode_attention_backend"]["vattn"]() == ("stamp", "made by _create_fa3_decode_backend")
    assert seen["prefill_attention_backend"]["vattn"]() == ("stamp", "W")
    assert wrapped == [("made by _create_fa3_prefill_backend", runner, "fa3")]


@pytest.mark.parametrize("multistep, which", [(True, "multi-step draft decode"), (False, "draft-extend")])
def test_draft_factory_names_the_base_missing_from_its_map(registered, monkeypatch, multistep, which):
    """Asking for vattn when the base has no entry in sglang's map names the base, not 'vattn';
    a server whose draft does not ask for vattn still builds (the entry raises only when called)."""
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    monkeypatch.setenv("VATTN_BASE", "fa3")
    seen = {}

    def sglangs_method(self, backend_name, backend_map, error_template, *args, **kwargs):
        seen["map"] = backend_map

    monkeypatch.setattr(DraftBackendFactory._create_backend, "__wrapped__", sglangs_method)
    factory = DraftBackendFactory.__new__(DraftBackendFactory)
    factory.draft_model_runner = object()
    suffix = "_decode_backend" if multistep else "_prefill_backend"
    backend_map = {n: _creator(f"_create_{n}{suffix}") for n in ("triton", "flashinfer")}
    factory._create_backend("decode_attention_backend", backend_map, "x {backend_type}",
                            stamps_children=multistep)
    with pytest.raises(ValueError, match=rf"vattn base 'fa3' \(VATTN_BASE\) has no entry in sglang's {which} "
                                         r"backend map; allowed: flashinfer, triton"):
        seen["map"]["vattn"]()


def test_draft_factory_hook_takes_sglangs_arguments(registered):
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    hooked = DraftBackendFactory._create_backend
    names = [p.name for p in inspect.signature(hooked.__wrapped__).parameters.values()]
    assert names[:4] == ["self", "backend_name", "backend_map", "error_template"]


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
    ({"sliding_window": True}, r"^sliding-window or chunked attention$"),
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
def test_the_driver_ran_on_the_installed_sglang(routed):
    from vattn.sglang import compat

    assert routed["sglang"] == compat.SGLANG_VERSION
    assert routed["triton_base"] == {"cls": "TritonAttnBackend", "name": "triton"}


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
    assert v["max_err"] <= FP8_TOLERANCE * max(v["ref_scale"], 1.0)
    assert v["plan_ids"][0] == v["plan_ids"][1], "every layer of a forward reuses one plan"


@pytest.mark.slow
def test_draft_extend_and_decode_reach_vattn_with_post_write_lengths(routed):
    assert routed["draft_extend"] == {"vattn": 1, "base_extend": 0, "base_decode": 0, "seq_lens": [[27]],
                                      "cu": [[0, 4]]}
    assert routed["decode"] == {"vattn": 1, "base_extend": 0, "base_decode": 0, "seq_lens": [[33]], "cu": [[0, 1]]}


@pytest.mark.slow
@pytest.mark.parametrize("case", ["extend", "softcap", "sinks", "stale_batch", "vattn_off"])
def test_everything_else_goes_to_the_triton_base(routed, case):
    assert routed[case]["vattn"] == 0 and routed[case]["base_extend"] == 1
    if case == "vattn_off":
        assert routed[case]["reason"] == "VATTN=0"


@pytest.mark.slow
def test_stand_in_production_base_serves_all_but_the_three_modes_with_vattn_on(routed):
    on = routed["stand_in_vattn1"]
    assert (on["base_cls"], on["base_name"], on["reason"]) == ("RecordingBase", "fa3", None)
    assert on["routes"] == {"target_verify": "vattn", "draft_extend": "vattn", "decode": "vattn",
                            "draft_decode_step": "forward_decode", "extend": "forward_extend",
                            "mixed": "forward_extend", "ragged_verify": "forward_extend"}
    assert on["metadata_calls"] == ["init_forward_metadata"]  # the base prepared every forward too


@pytest.mark.slow
def test_stand_in_production_base_serves_everything_with_vattn_off(routed):
    off = routed["stand_in_vattn0"]
    assert off["reason"] == "VATTN=0"
    assert off["routes"] == {"target_verify": "forward_extend", "draft_extend": "forward_extend",
                             "decode": "forward_decode", "draft_decode_step": "forward_decode",
                             "extend": "forward_extend", "mixed": "forward_extend", "ragged_verify": "forward_extend"}


@pytest.mark.slow
def test_base_flags_hooks_and_state_show_through_the_wrapper(routed):
    assert routed["delegation"] == {
        # ragged verify graphs: the base says yes, the wrapper no while vattn serves (test_backend.py)
        "is_attention_backend": True, "ragged_verify": False, "needs_cpu_seq_lens": False, "fill": 1,
        "graph_state": [8, 32], "metadata_read": "base-metadata", "metadata_written": None,
        "stamp": "fa3",  # sglang's "vattn" stamp reaches the base as the base's own name
        "helper": "from the base", "workspace_batch": 8}


@pytest.mark.slow
def test_counters_count_each_forward_once_by_path_and_mode(routed):
    """Eager: verify x2, draft extend, decode (vattn); a multi-step draft step and a prefill (base);
    two layers each (not counted). A capture (not counted), then three replays (vattn). VATTN=0:
    one eager verify and one replay (base)."""
    c = routed["counters"]
    assert c["snapshot"] == {"vattn": {"target_verify": 5, "draft_extend": 1, "decode": 1, "extend": 0, "other": 0},
                             "base": {"target_verify": 2, "draft_extend": 0, "decode": 1, "extend": 1, "other": 0}}
    assert c["line"].startswith(counters.PREFIX)
    assert c["parsed"] == {**c["snapshot"], "base_backend": "fa3", "processes": 1}
    assert c["vattn_calls"] == 9  # 2 layers x (2 verify + draft extend + decode) + 1 in the capture
    # every graph hook reached the base, with sglang's in_capture flag
    assert c["base_graph_hooks"] == [["out_graph", True], ["in_graph", None]] + [["out_graph", False]] * 3


@pytest.mark.slow
def test_a_padded_graph_replay_counts_as_the_capture_it_replays(routed):
    """sglang replays the graph of 4 for 3 verify rows: batch and indices padded to 4, write
    locations for the 3 real rows only. The graph runs vattn's recorded kernels, so the forward
    counts as vattn (the H200 smoke at concurrency 16 counted such replays as base)."""
    p = routed["padded_replay"]
    assert p["view"] == {"batch_size": 4, "num_padding": 1, "rows": 4, "tokens": 3 * 4}
    assert p["captured_vattn_calls"] == 2  # vattn was recorded into both graphs
    assert p["snapshot"] == {"vattn": 2, "base": 0}


@pytest.mark.slow
def test_failure_warns_once_and_the_base_serves_from_then_on(routed):
    f = routed["failure"]
    assert f["vattn_attempts"] == 1 and f["base_extend"] == 3
    assert len(f["warnings"]) == 1 and "simulated build failure" in f["warnings"][0]
    assert "serving with the triton backend" in f["warnings"][0]
    assert f["out_shape"] == [4, 16 * 256]
