"""Recipe validation: every user-facing error names the field, the value and the fix."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.config.base import RecipeError
from pipeline.config.recipe import load_recipe
from pipeline.plan import build_plan
from vattn.switch import SWITCH_VARS

REPO = Path(__file__).resolve().parents[3]
TRACE = str(REPO / "recipes/data/traces/quickstart")


def test_quickstart_recipe_is_valid():
    r = load_recipe(REPO / "recipes/quickstart.yaml")
    assert r.engine == "emulator" and r.arms["on"].env["VATTN"] == "1"
    assert Path(r.load.trace).is_dir()  # resolved against the recipe's folder


# sweep-*.yaml are sweep files (a base recipe plus a matrix): tests/pipeline/config/test_sweep_config.py checks them
@pytest.mark.parametrize("path", sorted(p for p in (REPO / "recipes").glob("*.yaml")
                                        if not p.name.startswith("sweep-")), ids=lambda p: p.name)
def test_every_shipped_recipe_validates(path):
    r = load_recipe(path)
    assert {"off", "on"} == set(r.arms) and all("VATTN" in a.env for a in r.arms.values())


def test_bare_yaml_off_on_keys_are_arm_names(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(f"name: t\nmodel: m\ntokenizer: {REPO / 'recipes/data/tokenizer'}\n"
                    f"arms:\n  off: {{env: {{VATTN: '0'}}}}\n  on: {{env: {{VATTN: '1'}}}}\n"
                    f"load: {{trace: {TRACE}, benchmark_duration_s: 10, timeout_s: 120}}\n")
    assert sorted(load_recipe(path).arms) == ["off", "on"]


def test_unknown_field_is_named(write_recipe):
    """With the nearest allowed name and the names allowed at that level, through dicts and lists."""
    with pytest.raises(RecipeError, match=r"\nconcurency: unknown field; did you mean 'load.concurrency'\? "
                                          r"\(allowed here: name, presets, engine, "):
        load_recipe(write_recipe(concurency=3))
    with pytest.raises(RecipeError, match=r"load.durration_s: unknown field; did you mean 'benchmark_duration_s'\? "
                                          r"\(allowed here: trace, scenario, concurrency, "):
        load_recipe(write_recipe(load={"trace": TRACE, "benchmark_duration_s": 10, "timeout_s": 120,
                                       "durration_s": 5}))
    with pytest.raises(RecipeError, match=r"hosts.node.adress: unknown field; did you mean 'address'\?"):
        load_recipe(write_recipe(hosts={"node": {"kind": "ssh", "adress": "h"}}))
    with pytest.raises(RecipeError, match=r"accuracy.tasks.0.limt: unknown field; did you mean 'limit'\?"):
        load_recipe(write_recipe(accuracy={"tasks": [{"name": "gsm8k", "limt": 3}]}))


def test_a_recipe_path_that_is_not_a_yaml_file_is_one_line(tmp_path):
    with pytest.raises(RecipeError, match=r"^recipe: '.*' is a directory; give a YAML file$"):
        load_recipe(tmp_path)
    binary = tmp_path / "r.yaml"
    binary.write_bytes(b"\xf0\x28\x8c\x28")
    with pytest.raises(RecipeError, match=r"^recipe: '.*r.yaml' is not a text file \(not UTF-8\); give a YAML file$"):
        load_recipe(binary)


def test_engine_args_of_the_wrong_kind_are_one_line(write_recipe):
    """server.args is a mapping or an argv list: one line with both choices, not one per pydantic union member."""
    with pytest.raises(RecipeError, match=r"invalid recipe\nserver.args: expected a mapping or a list of strings "
                                          r"\(found 'fast'\)$"):
        load_recipe(write_recipe(server={"args": "fast"}))


def test_a_boolean_is_not_taken_for_a_number(write_recipe):
    """pydantic would read `concurrency: yes` as 1; a number field names the boolean instead."""
    with pytest.raises(RecipeError, match=r"\nload.concurrency: a boolean where a number is allowed .* \(found True\)"):
        load_recipe(write_recipe(load={"trace": TRACE, "benchmark_duration_s": 10, "timeout_s": 120,
                                       "concurrency": True}))
    with pytest.raises(RecipeError, match=r"\nserver.port: a boolean where a number is allowed"):
        load_recipe(write_recipe(server={"port": False}))
    with pytest.raises(RecipeError, match=r"\naccuracy.tasks.0.limit: a boolean where a number is allowed"):
        load_recipe(write_recipe(accuracy={"tasks": [{"name": "gsm8k", "limit": True}]}))


def test_nan_and_inf_are_not_numbers_here(write_recipe):
    """YAML's .inf would pass an unbounded timeout; .nan would be named by whichever bound it fails."""
    with pytest.raises(RecipeError, match=r"\nload.timeout_s: Input should be a finite number"):
        load_recipe(write_recipe(load={"trace": TRACE, "benchmark_duration_s": 10, "timeout_s": float("inf")}))
    with pytest.raises(RecipeError, match=r"\naccuracy.tasks.0.temperature: Input should be a finite number"):
        load_recipe(write_recipe(accuracy={"tasks": [{"name": "gsm8k", "temperature": float("nan")}]}))


def test_request_count_is_refused_because_aiperf_never_ends_it(write_recipe):
    """aiperf 0.13 waits out load.timeout_s on a --request-count run: validate says so, not the load after 900 s."""
    with pytest.raises(RecipeError, match=r"\nload.request_count: aiperf 0.13 never ends a run bounded by a request "
                       r"count \(it waits until load.timeout_s kills it\); set load.benchmark_duration_s \(a window "
                       r"in seconds\) instead \(found 50\)$"):
        load_recipe(write_recipe(load={"trace": TRACE, "request_count": 50, "timeout_s": 120}))
    with pytest.raises(RecipeError, match=r"\nload: benchmark_duration_s: required, the profiling window in seconds"):
        load_recipe(write_recipe(load={"trace": TRACE, "timeout_s": 120}))


def test_missing_trace_dir(write_recipe):
    with pytest.raises(RecipeError, match=r"load.trace: directory '.*/no/such/traces' does not exist; generate one "
                                          r"with `python -m pipeline.tracegen traces"):
        load_recipe(write_recipe(load={"trace": "no/such/traces", "benchmark_duration_s": 10, "timeout_s": 120}))


def test_missing_accuracy_data_file(write_recipe):
    """Named by validate, not by the accuracy stage after the first arm's load."""
    with pytest.raises(RecipeError, match=r"accuracy.tasks.0.data: no such file; allowed: .* \(found '.*/no/gsm8k.jsonl'\)"):
        load_recipe(write_recipe(accuracy={"tasks": [{"name": "gsm8k", "data": "no/gsm8k.jsonl"}]}))


def test_placement_errors(write_recipe):
    with pytest.raises(RecipeError, match=r"hosts.local.gpus: \[0\] has 1 GPU\(s\); placement needs 2 "
                                          r"\(concurrent, gpus_per_arm=1\)"):
        load_recipe(write_recipe(hosts={"local": {"gpus": [0]}}, placement={"mode": "concurrent", "gpus_per_arm": 1}))
    with pytest.raises(RecipeError, match=r"placement.hosts\[0\]: unknown host 'gpu1'; defined hosts: \['local'\]"):
        load_recipe(write_recipe(placement={"hosts": ["gpu1"]}))
    with pytest.raises(RecipeError, match=r"hosts.node.kind ssh needs `address`|hosts.node: kind ssh needs"):
        load_recipe(write_recipe(hosts={"node": {"kind": "ssh"}}))


def test_unknown_preset_lists_the_available_ones(write_recipe):
    with pytest.raises(RecipeError, match=r"presets\[0\]: unknown preset 'servers/nope'; available: \["):
        load_recipe(write_recipe(presets=["servers/nope"]))


def test_unknown_preset_without_a_configs_folder_says_to_install_from_the_checkout(tmp_path, write_recipe, monkeypatch):
    # a non-editable install: configs/ (the presets) is not beside the installed packages
    import pipeline.config.emulator as emulator
    import pipeline.config.presets as presets
    import pipeline.paths as paths

    missing = tmp_path / "site-packages" / "configs"
    for module in (paths, presets):
        monkeypatch.setattr(module, "CONFIGS_DIR", missing)
    monkeypatch.setattr(emulator, "MODEL_PRESETS_DIR", missing / "models")
    with pytest.raises(RecipeError, match=r"available: \[\] \(.*configs does not exist: .*`pip install -e \.`\)"):
        load_recipe(write_recipe(presets=["servers/nope"]))
    with pytest.raises(emulator.ConfigError, match=r"known presets: \[\] \(.*`pip install -e \.`\)"):
        emulator.load_preset("qwen3.5-397b-a17b-tp2")
    monkeypatch.setattr(paths, "CONFIGS_DIR", tmp_path)  # a folder that exists: no hint
    assert paths.configs_missing_hint() == ""


def test_presets_merge_under_the_recipe(tmp_path, write_recipe, monkeypatch):
    import pipeline.config.presets as presets

    (tmp_path / "configs" / "servers").mkdir(parents=True)
    (tmp_path / "configs" / "servers" / "p.yaml").write_text(
        "server: {args: {hardware: mi355x, max_running_requests: 8}, port: 31000}\n")
    monkeypatch.setattr(presets, "CONFIGS_DIR", tmp_path / "configs")
    r = load_recipe(write_recipe(presets=["servers/p"], server={"args": {"max_running_requests": 4}}))
    assert r.server.args == {"hardware": "mi355x", "max_running_requests": 4} and r.server.port == 31000


def _without_switch(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in SWITCH_VARS}


def _resolved(a, placement: dict[str, str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """An arm run's argv and env with its own folder and its placement (port, GPUs) named, not valued:
    what is left must be the same in both arms."""
    names = {a.artifact_dir: "<ARM_DIR>", str(a.port): "<PORT>", **placement}
    argv = tuple(names.get(x, x).replace(a.artifact_dir, "<ARM_DIR>") for x in a.argv)
    env = {k: names.get(v, v) for k, v in _without_switch(a.env).items()}
    return argv, env


def test_sequential_arms_run_the_same_command_but_for_the_switch(write_recipe, tmp_path):
    r = load_recipe(write_recipe(placement={"order": "ABBA", "repeats": 1},
                                 server={"args": {"max_running_requests": 8}, "env": {"OMP_NUM_THREADS": "2"}}))
    plan = build_plan(r, tmp_path / "run")
    assert [a.name for a in plan.arm_runs] == ["off", "on", "on.2", "off.2"]
    assert {a.port for a in plan.arm_runs} == {30000}
    off, on = plan.arm_runs[0], plan.arm_runs[1]
    # the whole resolved command and env, not a prefix: only the switch and the arm's own folder differ
    assert [x.replace(off.artifact_dir, "<ARM_DIR>") for x in off.argv] == \
           [x.replace(on.artifact_dir, "<ARM_DIR>") for x in on.argv]
    assert "--max-running-requests" in off.argv
    assert _without_switch(off.env) == _without_switch(on.env) == {"OMP_NUM_THREADS": "2"}
    assert set(off.env) ^ set(on.env) <= set(SWITCH_VARS)
    assert {k for k in set(off.env) | set(on.env) if off.env.get(k) != on.env.get(k)} == {"VATTN"}
    assert plan.env_diff == {"VATTN": ("0", "1")}


def test_concurrent_arms_differ_in_placement_and_switch_only(write_recipe, tmp_path):
    r = load_recipe(write_recipe(hosts={"local": {"gpus": [0, 1]}},
                                 placement={"mode": "concurrent", "gpus_per_arm": 1, "swap": True}))
    plan = build_plan(r, tmp_path / "run")
    got = [(a.name, a.group, a.gpus, a.port, a.env["CUDA_VISIBLE_DEVICES"]) for a in plan.arm_runs]
    assert got == [("off", 0, (0,), 30000, "0"), ("on", 0, (1,), 30001, "1"),
                   ("off.2", 1, (1,), 30001, "1"), ("on.2", 1, (0,), 30000, "0")]
    off, on = plan.arm_runs[0], plan.arm_runs[1]
    gpus = {"0": "<GPUS>", "1": "<GPUS>"}
    assert _resolved(off, gpus) == _resolved(on, gpus)
    assert plan.env_diff == {"VATTN": ("0", "1")}


def test_a_host_named_twice_is_refused(write_recipe):
    """[box, box] once planned both arms on GPU 0 and port 30500: the off server could not bind, and the on
    server answered its health check, so the off arm measured the on server."""
    with pytest.raises(RecipeError, match=r"placement.hosts: \['box', 'box'\] names host 'box' more than once; "
                                          r"to run both arms on one host name it once \(hosts: \[box\]\): "
                                          r"concurrent arms there get disjoint GPUs and ports$"):
        load_recipe(write_recipe(hosts={"box": {"gpus": [0, 1]}},
                                 placement={"mode": "concurrent", "hosts": ["box", "box"], "gpus_per_arm": 1}))


def test_a_plan_keeps_two_arms_on_one_host_apart_however_the_host_is_named(write_recipe, tmp_path):
    """A placement that skipped validation (model_copy) and names one host twice still gets disjoint GPUs and
    ports, as naming it once does."""
    r = load_recipe(write_recipe(hosts={"box": {"gpus": [0, 1]}},
                                 placement={"mode": "concurrent", "hosts": ["box"], "gpus_per_arm": 1}))
    twice = r.model_copy(update={"placement": r.placement.model_copy(update={"hosts": ["box", "box"]})})
    for recipe in (r, twice):
        got = [(a.name, a.host, a.gpus, a.port) for a in build_plan(recipe, tmp_path / "run").arm_runs]
        assert got == [("off", "box", (0,), 30000), ("on", "box", (1,), 30001)], recipe.placement.hosts


@pytest.mark.parametrize("gpus, match", [
    ([0, 0], r"hosts.box.gpus: GPU id 0 is listed more than once; GPU ids are distinct integers >= 0: list each "
             r"GPU once, e.g. gpus: \[0\] \(found \[0, 0\]\)$"),
    ([1, 0, 2, 1], r"hosts.box.gpus: GPU id 1 is listed more than once; .* e.g. gpus: \[0, 1, 2\] "
                   r"\(found \[1, 0, 2, 1\]\)$"),
    ([-1, 0], r"hosts.box.gpus: GPU id -1 is negative; GPU ids are distinct integers >= 0, as nvidia-smi / "
              r"rocm-smi number them: e.g. gpus: \[0, 1\] \(found \[-1, 0\]\)$"),
])
def test_gpu_ids_are_distinct_and_not_negative(write_recipe, gpus, match):
    """[0, 0] once gave both concurrent arms GPU 0; [-1, 0] gave the off arm CUDA_VISIBLE_DEVICES=-1."""
    with pytest.raises(RecipeError, match=match):
        load_recipe(write_recipe(hosts={"box": {"gpus": gpus}},
                                 placement={"mode": "concurrent", "hosts": ["box"], "gpus_per_arm": 1}))


# The 4-GPU TP2 pair and its CPU dry run on the emulator must place the arms the same way.
@pytest.mark.parametrize("name", ["h200x4-sglang-tp2-concurrent.yaml", "quickstart-tp2-concurrent.yaml"])
def test_tp2_pairs_on_four_gpus_swap_gpu_pairs_and_ports(name, tmp_path):
    plan = build_plan(load_recipe(REPO / "recipes" / name), tmp_path / "run")
    got = [(a.name, a.group, a.gpus, a.port, a.env["CUDA_VISIBLE_DEVICES"]) for a in plan.arm_runs]
    assert got == [("off", 0, (0, 1), 30000, "0,1"), ("on", 0, (2, 3), 30001, "2,3"),
                   ("off.2", 1, (2, 3), 30001, "2,3"), ("on.2", 1, (0, 1), 30000, "0,1")]
    off, on = plan.arm_runs[0], plan.arm_runs[1]
    gpus = {"0,1": "<GPUS>", "2,3": "<GPUS>"}
    assert _resolved(off, gpus) == _resolved(on, gpus)


def test_target_effect_is_a_percentage(write_recipe):
    assert load_recipe(write_recipe(target_effect=5)).target_effect == 5.0
    assert load_recipe(write_recipe()).target_effect is None
    for bad in (0, -3, 150):
        with pytest.raises(RecipeError, match=rf"target_effect: must be a percentage between 0 and 100, exclusive: "
                                              rf".*write `target_effect: 5` for 5% \(found {bad}\)"):
            load_recipe(write_recipe(target_effect=bad))
    with pytest.raises(RecipeError, match=r"target_effect: Input should be a valid number"):
        load_recipe(write_recipe(target_effect="five"))


@pytest.mark.parametrize("args,match", [
    ({"max_runing_requests": 8}, r"server.args: unknown flag\(s\) --max-runing-requests; `python -m pipeline.emulator "
                                 r"--help` lists every flag"),
    ({"max_running_requests": 0}, r"server.args: max_running_requests: Input should be greater than or equal to 1 "
                                  r"\(got '0'\)"),
    ({"hardware": "h900"}, r"server.args: hardware: no profile named 'h900' in .*configs/hardware; known: h200, "
                           r"mi355x, or a path"),
    ({"model_preset": "qwen9"}, r"server.args: model_preset: 'qwen9' not found .*; known presets: \["),
    ({"port": 31000, "cycle_log_dir": "x"}, r"server.args: --port: set from server.port by the pipeline; remove it\n"
                                            r"server.args: --cycle-log-dir: set from the run dir"),
])
def test_emulator_flags_are_read_when_the_recipe_is(write_recipe, args, match):
    # Guarantee: a bad emulator flag fails `pipeline validate` with its field and value, not the server stage.
    with pytest.raises(RecipeError, match=match):
        load_recipe(write_recipe(server={"args": args}))


def test_emulator_tokenizer_is_checked_when_the_recipe_is(write_recipe, tmp_path):
    with pytest.raises(RecipeError, match=r"tokenizer: '.*/tokenizr' has no tokenizer.json; the emulator counts"):
        load_recipe(write_recipe(tokenizer=str(tmp_path / "tokenizr")))
    tok = REPO / "recipes/data/tokenizer"
    assert load_recipe(write_recipe(tokenizer=str(tok))).tokenizer == str(tok)


def test_emulator_flags_for_an_ssh_host_are_read_there(write_recipe):
    # the server on the SSH host reads its flags, and the files they name, itself (a name here may be a file there)
    path = write_recipe(hosts={"node": {"kind": "ssh", "address": "10.0.0.2"}}, placement={"hosts": ["node"]},
                        server={"args": {"hardware": "site-profile"}})
    assert load_recipe(path).server.args == {"hardware": "site-profile"}


def test_an_ssh_key_under_home_is_expanded_as_ssh_would(write_recipe, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh/id_ed25519").write_text("a key\n")  # a key is read when the recipe is: it must be there
    path = write_recipe(hosts={"node": {"kind": "ssh", "address": "10.0.0.2", "key": "~/.ssh/id_ed25519"}},
                        placement={"hosts": ["node"]})
    assert load_recipe(path).hosts["node"].key == str(tmp_path / ".ssh/id_ed25519")


def test_an_emulator_on_an_ssh_host_gets_its_tokenizer_from_here_so_it_is_checked_here(write_recipe, tmp_path):
    with pytest.raises(RecipeError, match=r"tokenizer: '.*/tokenizr' has no tokenizer.json; the emulator counts"):
        load_recipe(write_recipe(tokenizer=str(tmp_path / "tokenizr"), placement={"hosts": ["node"]},
                                 hosts={"node": {"kind": "ssh", "address": "10.0.0.2"}}))


def test_a_recipe_without_a_tokenizer_is_refused_naming_what_it_takes(write_recipe):
    # every run has a load stage and aiperf counts tokens with the tokenizer: without one the run died mid-way
    path = write_recipe()
    path.write_text("\n".join(line for line in path.read_text().splitlines() if not line.startswith("tokenizer:")))
    with pytest.raises(RecipeError, match=r"invalid recipe\ntokenizer: Field required: a HF tokenizer directory "
                                          r"\(with tokenizer.json; .*\) or a hub id"):
        load_recipe(path)


@pytest.mark.parametrize("field, match", [
    ({"tokenizer": 5}, r"\ntokenizer: Input should be a valid string \(found 5\)$"),
    ({"tokenizer": ["a"]}, r"\ntokenizer: Input should be a valid string \(found \['a'\]\)$"),
    ({"accuracy": {"tasks": 5}}, r"\naccuracy.tasks: Input should be a valid list \(found 5\)$"),
    ({"accuracy": {"tasks": [{"name": "gsm8k", "data": 7}]}}, r"\naccuracy.tasks.0.data: Input is not a valid path"),
    ({"load": {"trace": ["t"], "benchmark_duration_s": 10, "timeout_s": 120}}, r"\nload.trace: Input is not a "
                                                                                  r"valid path .* \(found \['t'\]\)"),
])
def test_a_path_field_of_the_wrong_type_is_a_field_error(write_recipe, field, match):
    # the paths are made absolute before the model sees them; a value that is no path must reach the model as it is
    with pytest.raises(RecipeError, match=match):
        load_recipe(write_recipe(**field))


def test_emulator_files_named_in_flags_resolve_against_the_recipe_folder(write_recipe, tmp_path, monkeypatch):
    """As the recipe's other paths do (README), whatever the cwd: --config, a model preset and a hardware profile
    given as files, in a mapping and in an argv list."""
    (tmp_path / "emucfg.yaml").write_text("max_running_requests: 4\n")
    (tmp_path / "mp.yaml").write_text((REPO / "configs/models/qwen3.5-397b-a17b-tp2.yaml").read_text())
    (tmp_path / "hw.yaml").write_text((REPO / "configs/hardware/h200.yaml").read_text())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    r = load_recipe(write_recipe(server={"args": {"config": "emucfg.yaml", "model_preset": "mp.yaml",
                                                  "hardware": "hw.yaml", "max_running_requests": 8}}))
    assert r.server.args == {"config": str(tmp_path / "emucfg.yaml"), "model_preset": str(tmp_path / "mp.yaml"),
                             "hardware": str(tmp_path / "hw.yaml"), "max_running_requests": 8}
    r = load_recipe(write_recipe(server={"args": ["--config=emucfg.yaml", "--model-preset", "mp.yaml",
                                                  "--hardware", "h200"]}))
    assert r.server.args == [f"--config={tmp_path / 'emucfg.yaml'}", "--model-preset", str(tmp_path / "mp.yaml"),
                             "--hardware", "h200"]  # a name in configs/ stays a name
    # on an SSH host the server reads them there: a relative path is the remote machine's
    r = load_recipe(write_recipe(hosts={"node": {"kind": "ssh", "address": "10.0.0.2"}}, placement={"hosts": ["node"]},
                                 server={"args": {"config": "emucfg.yaml"}}))
    assert r.server.args == {"config": "emucfg.yaml"}


@pytest.mark.parametrize("args, match", [
    ({"draft_tokens": 2}, r"invalid recipe\nserver.args: accept_probs: 3 values \[0.92, 0.87, 0.83\] for "
                          r"draft_tokens=2; those come from model preset qwen3.5-397b-a17b-tp2: set accept_probs "
                          r"beside draft_tokens, one probability per draft token, e.g. accept_probs: \[0.92, 0.87\]$"),
    ({"draft_tokens": 0, "accept_probs": []}, r"invalid recipe\nserver.args: accept_probs: an empty list; a list "
                                              r"gives a flag's values: give at least one, or null to leave the flag "
                                              r"out$"),
    (["--max-running-requests"], r"invalid recipe\nserver.args: --max-running-requests: expected a value$"),
    (["--draft-tokens", "0", "--accept-probs"], r"invalid recipe\nserver.args: --accept-probs: expected at least one "
                                                r"value$"),
])
def test_emulator_flags_without_their_values_are_one_line(write_recipe, args, match):
    # argparse printed its usage and exited 2, naming no file or field; a count of draft tokens the preset's
    # probabilities do not fit named neither the preset nor the fix
    with pytest.raises(RecipeError, match=match):
        load_recipe(write_recipe(server={"args": args}))


def test_plain_decode_needs_no_acceptance_probabilities(write_recipe):
    # with no draft token there is nothing to accept: the preset's probabilities do not apply
    assert load_recipe(write_recipe(server={"args": {"draft_tokens": 0}})).server.args == {"draft_tokens": 0}
    r = load_recipe(write_recipe(arms={"off": {"env": {"VATTN": "0"}, "server_args": ["--draft-tokens", "0"]},
                                       "on": {"env": {"VATTN": "1"}, "server_args": ["--draft-tokens", "0"]}}))
    assert r.arms["on"].server_args == ["--draft-tokens", "0"]


def test_an_ssh_key_that_is_not_there_fails_validate(write_recipe, tmp_path):
    # not the SSH connection at the run's start, after the plan was shown
    with pytest.raises(RecipeError, match=r"invalid recipe\nhosts.node: key: no such file '.*/nokey' on this machine; "
                                          r"allowed: a private key file here, or leave key out for the SSH agent "
                                          r"and ~/.ssh$"):
        load_recipe(write_recipe(hosts={"node": {"kind": "ssh", "address": "10.0.0.2", "key": str(tmp_path / "nokey")}},
                                 placement={"hosts": ["node"]}))


def test_a_yaml_syntax_error_points_into_the_file(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: [a\n")
    with pytest.raises(RecipeError, match=rf"^recipe: {re.escape(str(path))} is not valid YAML: while parsing a flow "
                                          rf"sequence\n  in \"{re.escape(str(path))}\", line 1, column 7"):
        load_recipe(path)


def test_a_block_of_the_wrong_type_shows_what_was_found(write_recipe):
    with pytest.raises(RecipeError, match=r"\naccuracy.tasks: Input should be a valid list "
                                          r"\(found \{'name': 'gsm8k'\}\)$"):
        load_recipe(write_recipe(accuracy={"tasks": {"name": "gsm8k"}}))
    # a rule over a whole block still names its fields itself, without the block
    with pytest.raises(RecipeError, match=r"\nhosts.box: kind ssh needs `address` \(host name or IP\)$"):
        load_recipe(write_recipe(hosts={"box": {"kind": "ssh"}}, placement={"hosts": ["box"]}))
