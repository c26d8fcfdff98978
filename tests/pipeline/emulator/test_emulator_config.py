"""EmulatorConfig: flags, YAML, presets, and the error messages users see."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from emu_harness import REPO

from pipeline.config.emulator import ConfigError, EmulatorConfig
from pipeline.emulator.arm import Arm
from pipeline.emulator.attention import make_attention
from pipeline.config.emulator import config_from_argv, make_parser
from vattn import switch


def test_every_field_is_a_described_flag_in_help():
    help_text = make_parser().format_help()
    for name, field in EmulatorConfig.model_fields.items():
        assert field.description, f"{name} has no description"
        assert "--" + name.replace("_", "-") in help_text


def test_help_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "pipeline.emulator", "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0 and "--max-running-requests" in out.stdout and "VATTN_PLAN" in out.stdout


def test_defaults_are_the_qwen_tp2_preset():
    cfg = config_from_argv([])
    assert (cfg.attention_layers, cfg.num_kv_heads, cfg.head_dim, cfg.gqa, cfg.kv_dtype, cfg.page_size,
            cfg.draft_tokens) == (15, 1, 256, 16, "fp8_e4m3", 16, 3)
    assert cfg.mean_accept_length() == pytest.approx(1 + 0.92 + 0.92 * 0.87 + 0.92 * 0.87 * 0.83)
    assert 3.38 <= cfg.mean_accept_length() <= 3.40   # the MI355X reference's accept length (preset's [R])


def test_flags_override_yaml_which_overrides_preset(tmp_path):
    f = tmp_path / "emu.yaml"
    f.write_text("max_running_requests: 8\nmodel_preset: qwen3.5-397b-a17b-tp4\nchunked_prefill_size: 4096\n")
    cfg = config_from_argv(["--config", str(f), "--chunked-prefill-size", "2048", "--disable-prefix-cache",
                            "--draft-tokens", "2", "--accept-probs", "0.9,0.5"])
    assert (cfg.max_running_requests, cfg.chunked_prefill_size, cfg.gqa) == (8, 2048, 8)
    assert cfg.disable_prefix_cache is True and cfg.accept_probs == [0.9, 0.5]
    assert config_from_argv(["--accept-probs", "0.1", "0.2", "0.3"]).accept_probs == [0.1, 0.2, 0.3]


@pytest.mark.parametrize("argv,match", [
    (["--port", "0"], r"port: Input should be greater than or equal to 1 \(got '0'\)"),
    (["--max-running-requests", "many"], r"max_running_requests: Input should be a valid integer"),
    (["--draft-tokens", "2"], r"accept_probs: 3 values \[0.92, 0.87, 0.83\] for draft_tokens=2"),
    (["--accept-probs", "0.5", "1.5", "0.5"], r"accept_probs: \[1.5\] outside \[0, 1\]"),
    (["--head-dim", "100"], r"head_dim: 100 is not supported; allowed: 64, 128, 256"),
    (["--kv-dtype", "fp4"], r"kv_dtype: Input should be 'fp8_e4m3' or 'bf16'"),
    (["--model-preset", "llama-9"], r"model_preset: 'llama-9' not found .* known presets: \['qwen3.5"),
    (["--config", "/nonexistent.yaml"], r"--config: file '/nonexistent.yaml' not found"),
    (["--kernel-pool-gib", "nan"], r"kernel_pool_gib: Input should be a finite number \(got 'nan'\)"),
    (["--cycle-log-flush-s", "inf"], r"cycle_log_flush_s: Input should be a finite number \(got 'inf'\)"),
    (["--accept-probs", "0.5", "nan", "0.5"], r"accept_probs.1: Input should be a finite number"),
])
def test_bad_config_names_the_field(argv, match):
    with pytest.raises(ConfigError, match=match):
        config_from_argv(argv)


def test_a_config_file_that_is_not_yaml_is_one_line(tmp_path):
    f = tmp_path / "emu.yaml"
    f.write_text("port: [1\n")
    with pytest.raises(ConfigError, match=r"--config .*emu.yaml: not valid YAML \(while parsing a flow sequence"):
        config_from_argv(["--config", str(f)])


def test_an_address_it_cannot_listen_on_is_one_line():
    """A host that does not resolve: exit 2 with one line, not socket.gaierror's traceback."""
    proc = subprocess.run([sys.executable, "-m", "pipeline.emulator", "--host", "no-such-host.invalid",
                           "--port", "39999"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: cannot listen on no-such-host.invalid:39999: ")


def test_unknown_yaml_field_is_refused(tmp_path):
    f = tmp_path / "emu.yaml"
    f.write_text("max_runing_requests: 8\n")
    with pytest.raises(ConfigError, match=r"max_runing_requests: Extra inputs are not permitted"):
        config_from_argv(["--config", str(f)])


def test_arm_from_env():
    assert Arm.from_env({"VATTN": "0"}) == Arm(vattn=False, impl="baseline", planner="fixed")
    assert Arm.from_env({"VATTN": "0", "VATTN_PLAN": "balanced"}).planner == "fixed"
    assert Arm.from_env({"VATTN": "1"}) == Arm(vattn=True, impl="vattn", planner="balanced")
    assert Arm.from_env({"VATTN": "1", "VATTN_PLAN": "length_aware"}).planner == "length_aware"
    with pytest.raises(ConfigError, match=r"env VATTN: got 'maybe'; allowed: 0 or 1"):
        Arm.from_env({"VATTN": "maybe"})
    with pytest.raises(ConfigError, match=r"env VATTN_PLAN: got 'greedy'; allowed: fixed, length_aware"):
        Arm.from_env({"VATTN": "1", "VATTN_PLAN": "greedy"})
    assert Arm.from_env({"VATTN": "1", "VATTN_HOPPER": "1"}) == Arm(vattn=True, impl="vattn_hopper", planner="balanced")
    assert Arm.from_env({"VATTN": "0", "VATTN_HOPPER": "1"}).impl == "baseline"
    with pytest.raises(ConfigError, match=r"env VATTN_HOPPER: got 'fast'; allowed: 0 or 1"):
        Arm.from_env({"VATTN": "1", "VATTN_HOPPER": "fast"})


def test_the_off_arm_refuses_a_bad_switch_value_as_every_reader_does():
    # VATTN=0 takes VATTN_PLAN, VATTN_HOPPER and VATTN_QK out of effect, but a typo there is named (vattn/switch.py)
    for env, match in (({"VATTN": "0", "VATTN_QK": "fp8"}, r"env VATTN_QK: got 'fp8'; allowed: split, e4m3"),
                       ({"VATTN": "0", "VATTN_HOPPER": "fast"}, r"env VATTN_HOPPER: got 'fast'; allowed: 0 or 1"),
                       ({"VATTN": "0", "VATTN_PLAN": "greedy"}, r"env VATTN_PLAN: got 'greedy'; allowed: fixed")):
        with pytest.raises(ConfigError, match=match):
            Arm.from_env(env)


def test_the_model_times_the_hopper_kernels_when_the_arm_asks_for_them():
    # VATTN_HOPPER=1 in an arm's env: the emulator's attention time is vattn.cost's Hopper model, not the
    # Triton path's (before, the switch was read by the real backend only, and the emulator ignored it)
    cfg = config_from_argv([])
    lens, qs = [35_000] * 16, [4] * 16
    triton = make_attention(cfg, Arm.from_env({"VATTN": "1"})).layer_us(lens, qs)
    hopper = make_attention(cfg, Arm.from_env({"VATTN": "1", "VATTN_HOPPER": "1"})).layer_us(lens, qs)
    assert hopper < 0.8 * triton


def test_the_lossy_qk_mode_is_timed_where_the_profile_has_it_and_refused_at_start_elsewhere(tmp_path):
    assert Arm.from_env({"VATTN": "1", "VATTN_QK": "e4m3"}).qk == "e4m3"
    assert Arm.from_env({"VATTN": "0", "VATTN_QK": "e4m3"}).qk == "split"  # the baseline reads no VATTN_QK
    with pytest.raises(ConfigError, match=r"env VATTN_QK: got 'fast'; allowed: split, e4m3"):
        Arm.from_env({"VATTN": "1", "VATTN_QK": "fast"})
    cfg = config_from_argv([])
    lens, qs = [35_000] * 16, [4] * 16
    for hopper in ("0", "1"):
        arm = {"VATTN": "1", "VATTN_HOPPER": hopper}
        split = make_attention(cfg, Arm.from_env(arm)).layer_us(lens, qs)
        assert make_attention(cfg, Arm.from_env({**arm, "VATTN_QK": "e4m3"})).layer_us(lens, qs) < split
    # a profile without figures for the Triton path's one-pass Q.K^T: the server refuses to start, naming it
    h200 = (REPO / "configs" / "hardware" / "h200.yaml").read_text()
    unfitted = tmp_path / "unfitted.yaml"
    unfitted.write_text("\n".join(line for line in h200.splitlines() if not line.strip().startswith("fp8x1")))
    with pytest.raises(ConfigError, match=r"cannot time arm vattn \(VATTN_QK=e4m3\): kernel path: fp8x1"):
        make_attention(config_from_argv(["--hardware", str(unfitted)]),
                       Arm.from_env({"VATTN": "1", "VATTN_QK": "e4m3"}))


def test_unset_vattn_means_on_as_in_sglang():
    # Guarantee (issue 15): one meaning of an unset VATTN. sglang's backend reads vattn.switch; before,
    # the emulator read unset as off, so one recipe ran vattn in sglang and the baseline here.
    assert Arm.from_env({}) == Arm(vattn=True, impl="vattn", planner="balanced")
    for value in (None, "", "0", "1", "off", "true"):
        env = {} if value is None else {"VATTN": value}
        assert Arm.from_env(env).vattn is switch.enabled(env)


def test_kernel_attention_needs_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cfg = config_from_argv(["--attention", "kernel"])
    with pytest.raises(ConfigError, match="attention: kernel needs a CUDA GPU; use attention: model on CPU"):
        make_attention(cfg, Arm.from_env({"VATTN": "1"}))


@pytest.mark.parametrize("argv,env,match", [
    (["--max-running-requests", "0"], {}, "emulator config: max_running_requests: Input should be greater than"),
    ([], {"VATTN": "2"}, "env VATTN: got '2'; allowed: 0 or 1"),
    (["--tokenizer", "/nonexistent"], {}, "tokenizer: '/nonexistent' has no tokenizer.json"),
    (["--hardware", "tpu9"], {}, "emulator config: hardware: no profile named 'tpu9' in "),
    (["--hardware", "/no/tpu9.yaml"], {}, "hardware: '/no/tpu9.yaml': profile: got '/no/tpu9.yaml'; no file"),
    (["--max-runing-requests", "8"], {}, "emulator config: unknown flag(s) --max-runing-requests; `python -m"),
])
def test_cli_exits_2_with_the_message(argv, env, match):
    out = subprocess.run([sys.executable, "-m", "pipeline.emulator", "--port", "1", *argv], capture_output=True,
                         text=True, cwd=REPO, env={**os.environ, **env}, timeout=60)
    assert out.returncode == 2
    assert match in out.stderr
