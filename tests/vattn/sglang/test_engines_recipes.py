"""The sglang / vLLM engine adapters, the configs/servers presets and the cluster recipes.

`pipeline plan recipes/<point>.yaml` must print the exact sglang command for both arms, identical
but for VATTN; every flag must exist in the installed sglang's launch_server CLI (0.5.17 or 0.5.23).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.engines import get_engine
from pipeline.engines.base import LaunchContext
from pipeline.plan import build_plan
from pipeline.config.recipe import load_recipe

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
RECIPES = sorted(p for p in (ROOT / "recipes").glob("*.yaml") if re.match(r"(mi355x|h200)-tp\d+-c\d+\.yaml$", p.name))
# The recipes that run a real sglang server on the H200 machines here (dummy weights, a local config).
REAL_SERVER_RECIPES = [ROOT / "recipes" / n for n in ("h200-sglang-qwen3-hd256.yaml", "h200-sglang-qwen3-hd256-hopper.yaml",
                                                       "h200x4-sglang-tp2-concurrent.yaml")]
POINTS = {"mi355x": {(2, 32), (4, 16), (2, 8), (4, 4)}, "h200": {(8, 32), (4, 16), (8, 8), (4, 4)}}

# The MI355X reference's TP2 c32 server, flag for flag (DESIGN.md; configs/servers presets).
TP2_C32_ARGS = ["--tp-size", "2", "--attention-backend", "vattn", "--vattn-base", "triton", "--page-size", "16", "--kv-cache-dtype", "fp8_e4m3",
                "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", "4", "--enable-metrics", "--stream-interval", "1",
                "--trust-remote-code", "--enable-hierarchical-cache", "--hicache-ratio", "2.0",
                "--hicache-write-policy", "write_through"]


def _ctx(**changes):
    base = dict(model="m", tokenizer="/local/tok", port=30001, bind="0.0.0.0", server_args={"tp_size": 2},
                launch=None, artifact_dir="/tmp/a", python="python3")
    return LaunchContext(**{**base, **changes})


def test_every_reference_point_has_a_recipe_per_platform():
    found = {"mi355x": set(), "h200": set()}
    for path in RECIPES:
        hw, tp, conc = re.match(r"(mi355x|h200)-tp(\d+)-c(\d+)", path.stem).groups()
        found[hw].add((int(tp), int(conc)))
    assert found == POINTS


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_plans_one_sglang_command_for_both_arms_but_for_vattn(path, tmp_path):
    recipe = load_recipe(path)
    plan = build_plan(recipe, tmp_path / "run")
    assert recipe.engine == "sglang" and [a.name for a in plan.arm_runs] == ["off", "on", "on.2", "off.2"]
    argvs = {a.argv for a in plan.arm_runs}
    assert len(argvs) == 1, "both arms must run the same command"
    argv = next(iter(argvs))
    assert argv[1:3] == ("-m", "vattn.sglang.launch")
    tp = int(re.search(r"-tp(\d+)-", path.stem).group(1))
    assert argv[argv.index("--tp-size") + 1] == str(tp) and len(plan.arm_runs[0].gpus) == tp
    for a in plan.arm_runs:
        assert a.env["VATTN"] == ("0" if a.arm == "off" else "1")
        rest = {k: v for k, v in a.env.items() if k != "VATTN"}
        assert rest == {k: v for k, v in plan.arm_runs[0].env.items() if k != "VATTN"}
    assert plan.env_diff == {"VATTN": ("0", "1")}
    conc = int(re.search(r"-c(\d+)$", path.stem).group(1))
    assert recipe.load.concurrency == conc and recipe.load.scenario


@pytest.mark.parametrize("path", RECIPES + REAL_SERVER_RECIPES, ids=lambda p: p.stem)
def test_recipe_names_the_base_it_wraps(path):
    """Without --vattn-base the base is sglang's default, which on ROCm (aiter) and Blackwell
    (trtllm_mha) is no base vattn wraps, and on an H200 at page 16 is flashinfer, not what the
    recipes' comments say; each recipe names its base."""
    from vattn.sglang import base as base_choice

    args = load_recipe(path).server.args
    assert args.get("attention_backend") == "vattn"
    assert args.get("vattn_base") in base_choice.BASES, args.get("vattn_base")


def test_pipeline_plan_prints_the_exact_sglang_command_for_both_arms():
    out = subprocess.run([sys.executable, "-m", "pipeline.cli", "plan", str(ROOT / "recipes/mi355x-tp2-c32.yaml")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    servers = re.findall(r"^\s+server: (.*)$", out.stdout, flags=re.M)
    assert len(servers) == 4
    expected = ("CUDA_VISIBLE_DEVICES=0,1 HIP_VISIBLE_DEVICES=0,1 python3 -m vattn.sglang.launch "
                "--model-path Qwen/Qwen3.5-397B-A17B-FP8 --host 0.0.0.0 --port 30000 " + " ".join(TP2_C32_ARGS))
    assert sorted(servers) == sorted([f"VATTN=0 {expected}", f"VATTN=1 {expected}"] * 2)


def test_sglang_engine_command_and_endpoints():
    engine = get_engine("sglang")
    assert engine.command(_ctx()) == ["python3", "-m", "vattn.sglang.launch", "--model-path", "m", "--host", "0.0.0.0",
                                      "--port", "30001", "--tp-size", "2"]
    assert (engine.health_path, engine.info_paths[0], engine.metrics_path) == ("/health", "/server_info", "/metrics")


@pytest.mark.parametrize("flag", ["port", "host", "model_path"])
def test_sglang_engine_refuses_flags_it_owns(flag):
    with pytest.raises(ValueError, match=rf"server.args: sets --{flag.replace('_', '-')}; the sglang adapter owns"):
        get_engine("sglang").command(_ctx(server_args={flag: "x"}))


def test_vllm_engine_command_and_endpoints():
    engine = get_engine("vllm")
    assert engine.command(_ctx(server_args={"tensor_parallel_size": 2})) == [
        "vllm", "serve", "m", "--host", "0.0.0.0", "--port", "30001", "--tensor-parallel-size", "2"]
    assert engine.command(_ctx(launch=["python3", "-m", "vllm.entrypoints.openai.api_server", "--model"],
                               server_args={}))[:5] == ["python3", "-m", "vllm.entrypoints.openai.api_server",
                                                        "--model", "m"]
    assert (engine.health_path, engine.info_paths, engine.metrics_path) == ("/health", ("/v1/models",), "/metrics")


def test_vllm_engine_errors_name_the_field():
    with pytest.raises(ValueError, match=r"server.args: sets --port; the vllm adapter owns"):
        get_engine("vllm").command(_ctx(server_args={"port": 1}))
    with pytest.raises(ValueError, match=r"server.launch: got \['vllm', ''\]; expected a non-empty command prefix"):
        get_engine("vllm").command(_ctx(launch=["vllm", ""]))


# -- against the installed sglang --------------------------------------------------------------------

@pytest.fixture(scope="module")
def sglang_cli():
    sys.path.insert(0, str(HERE))
    import sglang_env

    try:
        sglang_env.import_sglang()
    except ImportError as exc:  # pragma: no cover - CI installs it
        pytest.skip(f"sglang is not importable: {exc}")
    from pipeline.engines import sglang as adapter

    return adapter


@pytest.mark.parametrize("path", RECIPES + REAL_SERVER_RECIPES, ids=lambda p: p.stem)
def test_every_emitted_flag_exists_in_sglangs_cli(sglang_cli, path, tmp_path):
    argv = list(build_plan(load_recipe(path), tmp_path / "run").arm_runs[0].argv)
    sglang_cli.check_flags(argv[3:])  # after `python3 -m vattn.sglang.launch`


def test_check_flags_knows_the_launchers_vattn_base(sglang_cli):
    sglang_cli.check_flags(["--model-path", "m", "--attention-backend", "vattn", "--vattn-base", "fa3"])
    with pytest.raises(ValueError, match=r"server.args: --vattn-base: got 'fa9'; allowed: fa3, flashinfer, triton"):
        sglang_cli.check_flags(["--model-path", "m", "--vattn-base", "fa9"])


def test_check_flags_names_unknown_flags_and_bad_values(sglang_cli):
    with pytest.raises(ValueError, match=r"sglang does not know --tp, --warp-speed"):
        sglang_cli.check_flags(["--model-path", "m", "--tp", "2", "--warp-speed"])
    with pytest.raises(ValueError, match=r"server.args: sglang rejects"):
        sglang_cli.check_flags(["--model-path", "m", "--kv-cache-dtype", "fp7"])


TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
              "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 1, "num_hidden_layers": 2,
              "vocab_size": 1000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "head_dim": 64}


@pytest.mark.parametrize("flag", [["--vattn-base", "fa3"], ["--vattn-base=fa3"], []], ids=["two", "eq", "none"])
def test_launcher_runs_sglangs_server_with_the_same_argv_but_vattn_base(sglang_cli, monkeypatch, flag, tmp_path):
    from sglang import launch_server
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    import vattn.sglang.launch as launcher

    seen = {}
    monkeypatch.setenv("VATTN_BASE", "")  # so the teardown restores whatever was there before
    monkeypatch.setattr(launch_server, "run_server", lambda server_args: seen.setdefault("args", server_args))
    monkeypatch.setattr("sglang.srt.utils.kill_process_tree", lambda *a, **k: None)
    # sglang 0.5.17 resolves its defaults against the device and the model's config: a CPU and a
    # local config.json (no hub), no tokenizer
    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    launcher.main(["--model-path", str(tmp_path), *flag, "--attention-backend", "vattn", "--page-size", "16",
                   "--device", "cpu", "--skip-tokenizer-init"])
    assert "vattn" in ATTENTION_BACKENDS
    args = seen["args"]  # sglang's own parser saw no --vattn-base (it would have exited on it)
    assert (args.model_path, args.attention_backend, args.page_size) == (str(tmp_path), "vattn", 16)
    assert (os.environ.get("VATTN_BASE") or None) == ("fa3" if flag else None)  # what the spawned schedulers read


@pytest.mark.slow
def test_importing_the_launcher_registers_vattn_as_a_spawned_scheduler_would(sglang_cli):
    code = ("import sys; sys.path.insert(0, %r); import sglang_env; sglang_env.import_sglang(); "
            "import vattn.sglang.launch; "
            "from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS; "
            "from sglang.srt.speculative.draft_utils import DraftBackendFactory; "
            "print('vattn' in ATTENTION_BACKENDS, DraftBackendFactory._create_backend._vattn_hook)") % str(HERE)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "True True"
