"""The base choice (--vattn-base, VATTN_BASE, sglang's own default) and the path counters' log
line, file and parser, against the installed sglang (0.5.17 or 0.5.23)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sglang_env  # noqa: E402

sglang_env.require_sglang()

from vattn.sglang import base as base_choice  # noqa: E402
from vattn.sglang import counters, options  # noqa: E402


# -- the base: --vattn-base, VATTN_BASE, sglang's default ----------------------------------------

@pytest.mark.parametrize("argv, rest, chosen", [
    (["--model-path", "m", "--vattn-base", "fa3", "--tp", "2"], ["--model-path", "m", "--tp", "2"], "fa3"),
    (["--vattn-base=FlashInfer", "--x"], ["--x"], "flashinfer"),
    (["--vattn-base", "fa3", "--vattn-base", "triton"], [], "triton"),
    (["--model-path", "m"], ["--model-path", "m"], None),
])
def test_vattn_base_flag_is_stripped(argv, rest, chosen):
    assert options.strip(argv) == (rest, {"VATTN_BASE": chosen} if chosen else {})


@pytest.mark.parametrize("argv, message", [
    (["--vattn-base", "fa4"], r"--vattn-base: got 'fa4'; allowed: fa3, flashinfer, triton"),
    (["--vattn-base"], r"--vattn-base: needs a value"),
    (["--vattn-base", "--tp"], r"--vattn-base: needs a value"),
])
def test_vattn_base_flag_rejects_what_it_cannot_wrap(argv, message):
    with pytest.raises(ValueError, match=message):
        options.strip(argv)


def test_vattn_base_env_is_checked(monkeypatch):
    monkeypatch.setenv("VATTN_BASE", "cutlass")
    with pytest.raises(ValueError, match=r"VATTN_BASE: got 'cutlass'; allowed: fa3, flashinfer, triton"):
        base_choice.from_env()


def test_default_base_is_sglangs_own_choice(monkeypatch):
    """Without the flag the wrapper asks sglang's own default rule (no copy of it here): patched
    to answer fa3 as it does on an H200 for MHA without tree speculation, that is the base."""
    from types import SimpleNamespace

    monkeypatch.delenv("VATTN_BASE", raising=False)
    asked = []

    def sglangs_rule(*args):
        asked.append(args[-2:])
        return "fa3"

    try:
        import sglang.srt.arg_groups.model_override_base as rules
        monkeypatch.setattr(rules, "get_default_attn_backend", sglangs_rule)
        server_args = object()
    except ImportError:  # 0.5.17: a ServerArgs method
        server_args = SimpleNamespace(_get_default_attn_backend=sglangs_rule)
    config = object()
    runner = SimpleNamespace(server_args=server_args, use_mla_backend=False, model_config=config)
    assert base_choice.resolve(runner) == ("fa3", "sglang default")
    assert asked == [(False, config)]
    monkeypatch.setenv("VATTN_BASE", "triton")
    assert base_choice.resolve(runner) == ("triton", "VATTN_BASE")


def test_default_base_on_this_cpu_is_what_sglang_picks_here():
    from types import SimpleNamespace

    import sglang_env as E

    server_args = E.publish()
    config = SimpleNamespace(hf_config=SimpleNamespace(architectures=["LlamaForCausalLM"]), has_asymmetric_kv=False,
                             has_attention_sinks=False, get_num_kv_heads=lambda tp: 1)
    runner = SimpleNamespace(server_args=server_args, use_mla_backend=False, model_config=config)
    assert base_choice.default_base(runner) in ("triton", "flashinfer")  # no Hopper here


# -- counters ------------------------------------------------------------------------------------

def _line_as(counter, pid) -> str:
    return counters.PREFIX + json.dumps({**counter.snapshot(), "pid": pid})


def test_counters_log_line_round_trips_and_sums_processes():
    a, b = counters.PathCounters("fa3"), counters.PathCounters("fa3")
    for _ in range(3):
        a.count("vattn", "target_verify")
    a.count("base", "extend")
    b.count("vattn", "target_verify")
    b.count("base", "prefill")  # a mode outside MODES counts as "other"
    first = _line_as(a, 1)
    a.count("vattn", "decode")  # cumulative: a pid's later line replaces its earlier one
    text = "\n".join(["INFO boot", first, "junk vattn paths: {not json", "[2026] x " + _line_as(b, 2),
                      "INFO " + _line_as(a, 1)])
    parsed = counters.parse_log(text)
    assert parsed == {"vattn": {"target_verify": 4, "draft_extend": 0, "decode": 1, "extend": 0, "other": 0},
                      "base": {"target_verify": 0, "draft_extend": 0, "decode": 0, "extend": 1, "other": 1},
                      "base_backend": "fa3", "processes": 2}
    assert counters.parse_log("no lines") == {**{p: dict.fromkeys(counters.MODES, 0) for p in counters.PATHS},
                                              "base_backend": None, "processes": 0}
    with pytest.raises(ValueError, match=r"path: got 'triton'; allowed: vattn, base"):
        a.count("triton", "decode")


def test_counters_publish_writes_the_json_file(tmp_path):
    c = counters.PathCounters("flashinfer")
    c.count("vattn", "draft_extend")
    c.publish(str(tmp_path / "paths-{pid}.json"))
    [written] = tmp_path.glob("paths-*.json")
    assert json.loads(written.read_text())["vattn"]["draft_extend"] == 1
    assert written.name == f"paths-{os.getpid()}.json"


# -- sglang's default on an H200, by sglang's own full resolution ---------------------------------

MODEL = Path(__file__).resolve().parents[3] / "configs" / "models" / "qwen3-hd256-gqa16"
HOPPER = dict(is_cuda=True, is_hip=False, is_sm90=True, is_sm100=False, is_sm100_or_sm110=False, is_sm110=False,
              is_sm120=False, is_blackwell=False, is_hopper_with_cuda_12_3=True, has_flashinfer=True, has_amx=False)


def _on_hopper(monkeypatch):
    """Answer sglang's hardware probes as an H200 with CUDA >= 12.3 and FlashInfer installed would.
    0.5.23 reads them through its platform context; 0.5.17 imports the probe functions by name."""
    try:
        from sglang.srt.runtime_context import override_platform
    except ImportError:
        override_platform = None
    if override_platform is not None and hasattr(override_platform(), "install"):
        patch = override_platform(**HOPPER)
        patch.install()
        return patch.restore
    import sglang.srt.arg_groups.overrides as overrides
    import sglang.srt.server_args as server_args
    import sglang.srt.utils.common as common

    probes = {"is_hopper_with_cuda_12_3": lambda: True, "is_flashinfer_available": lambda: True,
              "is_sm100_supported": lambda *a: False, "is_sm90_supported": lambda *a: True}
    for module in (server_args, overrides, common):
        for name, probe in probes.items():
            if hasattr(module, name):
                monkeypatch.setattr(module, name, probe)
    return lambda: None


def _resolved(spec: bool, **flags):
    """sglang's ServerArgs after its whole resolution, for the recipe's flags (speculation optional)."""
    from sglang.srt.server_args import ServerArgs

    args = dict(model_path=str(MODEL), device="cuda", load_format="dummy", kv_cache_dtype="fp8_e4m3", **flags)
    if spec:
        args.update(speculative_algorithm="STANDALONE", speculative_draft_model_path=str(MODEL) + "-draft",
                    speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    resolved = ServerArgs(**args)
    if hasattr(resolved, "resolve_once"):  # 0.5.23 resolves on demand; 0.5.17 in __post_init__
        resolved.resolve_once()
    return resolved


def _picked(args) -> str:
    """The attention backend sglang resolved: 0.5.23 keeps resolved values in the resolving view."""
    try:
        from sglang.srt.arg_groups.overrides import resolving_view
    except ImportError:  # 0.5.17: written on the fields
        return args.attention_backend
    return resolving_view(args).attention_backend


@pytest.mark.parametrize("page_size, spec, expected", [
    (16, True, "flashinfer"),  # topk 1 counts as "no tree" only at page 1: sglang's own rule (the recipe's case)
    (1, True, "fa3"),
    (16, False, "fa3"),
])
def test_default_base_on_an_h200_is_what_sglang_resolves_without_the_flag(monkeypatch, page_size, spec, expected):
    """The wrapper's default, asked from a runner whose args were resolved with
    --attention-backend vattn, equals what sglang's full resolution picks when the flag is absent."""
    from types import SimpleNamespace

    import vattn.sglang

    vattn.sglang.register()
    monkeypatch.delenv("VATTN_BASE", raising=False)
    restore = _on_hopper(monkeypatch)
    try:
        sglangs = _picked(_resolved(spec, page_size=page_size))
        args = _resolved(spec, page_size=page_size, attention_backend="vattn")
        from sglang.srt.configs.model_config import ModelConfig

        runner = SimpleNamespace(server_args=args, use_mla_backend=False, model_config=ModelConfig.from_server_args(args))
        assert (sglangs, base_choice.resolve(runner)) == (expected, (expected, "sglang default"))
    finally:
        restore()
