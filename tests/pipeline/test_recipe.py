"""Recipe validation: every user-facing error names the field, the value and the fix."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.plan import build_plan
from pipeline.recipe import RecipeError, load_recipe

REPO = Path(__file__).resolve().parents[2]
TRACE = str(REPO / "recipes/data/traces/quickstart")


def _write(tmp_path: Path, **over) -> Path:
    base = {"name": "t", "engine": "emulator", "model": "m",
            "arms": {"off": {"env": {"VATTN": "0"}}, "on": {"env": {"VATTN": "1"}}},
            "load": {"trace": TRACE, "benchmark_duration_s": 10, "timeout_s": 120}}
    for key, value in over.items():
        base[key] = value
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def test_quickstart_recipe_is_valid():
    r = load_recipe(REPO / "recipes/quickstart.yaml")
    assert r.engine == "emulator" and r.arms["on"].env["VATTN"] == "1"
    assert Path(r.load.trace).is_dir()  # resolved against the recipe's folder


def test_bare_yaml_off_on_keys_are_arm_names(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(f"name: t\nmodel: m\narms:\n  off: {{env: {{VATTN: '0'}}}}\n  on: {{env: {{VATTN: '1'}}}}\n"
                    f"load: {{trace: {TRACE}, benchmark_duration_s: 10, timeout_s: 120}}\n")
    assert sorted(load_recipe(path).arms) == ["off", "on"]


def test_unknown_field_is_named(tmp_path):
    with pytest.raises(RecipeError, match=r"concurency: unknown field; check the spelling"):
        load_recipe(_write(tmp_path, concurency=3))
    with pytest.raises(RecipeError, match=r"load.durration_s: unknown field"):
        load_recipe(_write(tmp_path, load={"trace": TRACE, "benchmark_duration_s": 10, "timeout_s": 120,
                                           "durration_s": 5}))


def test_missing_trace_dir(tmp_path):
    with pytest.raises(RecipeError, match=r"load.trace: directory '.*/no/such/traces' does not exist; generate one "
                                          r"with `python -m pipeline.tracegen traces"):
        load_recipe(_write(tmp_path, load={"trace": "no/such/traces", "benchmark_duration_s": 10,
                                           "timeout_s": 120}))


def test_arms_may_differ_only_in_the_switch(tmp_path):
    arms = {"off": {"env": {"VATTN": "0", "NCCL_ALGO": "ring"}}, "on": {"env": {"VATTN": "1", "NCCL_ALGO": "tree"}}}
    with pytest.raises(RecipeError, match=r"arms.on.env: differs from arms.off in NCCL_ALGO; arms may differ only "
                                          r"in the kernel switch \['VATTN', 'VATTN_PLAN'\]"):
        load_recipe(_write(tmp_path, arms=arms))
    arms = {"off": {"env": {"VATTN": "0"}, "server_args": {"tp": 2}}, "on": {"env": {"VATTN": "1"}}}
    with pytest.raises(RecipeError, match=r"arms.on.server_args: differs from arms.off.server_args; arms may differ "
                                          r"only in the kernel switch"):
        load_recipe(_write(tmp_path, arms=arms))
    arms = {"off": {"env": {"VATTN": "0", "CUDA_VISIBLE_DEVICES": "0"}}, "on": {"env": {"VATTN": "1"}}}
    with pytest.raises(RecipeError, match=r"arms.off.env: sets CUDA_VISIBLE_DEVICES; placement assigns GPUs"):
        load_recipe(_write(tmp_path, arms=arms))
    with pytest.raises(RecipeError, match=r"arms.on.env: identical to arms.off"):
        load_recipe(_write(tmp_path, arms={"off": {"env": {"VATTN": "1"}}, "on": {"env": {"VATTN": "1"}}}))
    with pytest.raises(RecipeError, match=r"arms: .*found arms \['baseline', 'on'\]"):
        load_recipe(_write(tmp_path, arms={"baseline": {}, "on": {"env": {"VATTN": "1"}}}))


def test_placement_errors(tmp_path):
    with pytest.raises(RecipeError, match=r"hosts.local.gpus: \[0\] has 1 GPU\(s\); placement needs 2 "
                                          r"\(concurrent, gpus_per_arm=1\)"):
        load_recipe(_write(tmp_path, hosts={"local": {"gpus": [0]}},
                           placement={"mode": "concurrent", "gpus_per_arm": 1}))
    with pytest.raises(RecipeError, match=r"placement.hosts\[0\]: unknown host 'gpu1'; defined hosts: \['local'\]"):
        load_recipe(_write(tmp_path, placement={"hosts": ["gpu1"]}))
    with pytest.raises(RecipeError, match=r"hosts.node.kind ssh needs `address`|hosts.node: kind ssh needs"):
        load_recipe(_write(tmp_path, hosts={"node": {"kind": "ssh"}}))


def test_unknown_preset_lists_the_available_ones(tmp_path):
    with pytest.raises(RecipeError, match=r"presets\[0\]: unknown preset 'servers/nope'; available: \["):
        load_recipe(_write(tmp_path, presets=["servers/nope"]))


def test_presets_merge_under_the_recipe(tmp_path, monkeypatch):
    import pipeline.recipe as recipe_mod

    (tmp_path / "configs" / "servers").mkdir(parents=True)
    (tmp_path / "configs" / "servers" / "p.yaml").write_text(
        "server: {args: {hardware: mi355x, max_running_requests: 8}, port: 31000}\n")
    monkeypatch.setattr(recipe_mod, "CONFIGS_DIR", tmp_path / "configs")
    r = load_recipe(_write(tmp_path, presets=["servers/p"], server={"args": {"max_running_requests": 4}}))
    assert r.server.args == {"hardware": "mi355x", "max_running_requests": 4} and r.server.port == 31000


def test_plan_orders_abba_and_concurrent_swap(tmp_path):
    r = load_recipe(_write(tmp_path, placement={"order": "ABBA", "repeats": 1}))
    plan = build_plan(r, tmp_path / "run")
    assert [a.name for a in plan.arm_runs] == ["off", "on", "on.2", "off.2"]
    assert {a.port for a in plan.arm_runs} == {30000}

    r = load_recipe(_write(tmp_path, hosts={"local": {"gpus": [0, 1]}},
                           placement={"mode": "concurrent", "gpus_per_arm": 1, "swap": True}))
    plan = build_plan(r, tmp_path / "run")
    got = [(a.name, a.group, a.gpus, a.port, a.env["CUDA_VISIBLE_DEVICES"]) for a in plan.arm_runs]
    assert got == [("off", 0, (0,), 30000, "0"), ("on", 0, (1,), 30001, "1"),
                   ("off.2", 1, (1,), 30001, "1"), ("on.2", 1, (0,), 30000, "0")]
    # The two arms' commands are identical but for the kernel switch.
    off, on = plan.arm_runs[0], plan.arm_runs[1]
    assert off.argv[:4] == on.argv[:4] and plan.env_diff == {"VATTN": ("0", "1")}
