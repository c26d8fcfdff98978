"""The recipe: one YAML file that says what to A/B, where, and how to load and score it.

Presets listed under `presets:` (paths under configs/, without .yaml) are deep-merged first, in order,
then the recipe itself on top; the merged dict is validated once. Relative paths in the recipe resolve
against the recipe file's folder, so `pipeline run` works from any directory.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.accuracy.spec import AccuracySpec
from pipeline.stages.load import LoadSpec

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"
ARM_NAMES = ("off", "on")
# Placement owns these; an arm setting them would move it onto other devices.
PLACEMENT_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


class RecipeError(ValueError):
    """A recipe that cannot run; the message names the field, the value and the fix."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HostSpec(Strict):
    kind: Literal["local", "ssh"] = Field("local", description="local: this machine; ssh: reached with fabric")
    address: str | None = Field(None, description="SSH address (name or IP); required for kind ssh")
    user: str | None = Field(None, description="SSH user; default: the current user")
    port: int = Field(22, ge=1, le=65535, description="SSH port")
    key: str | None = Field(None, description="SSH private key file; default: the agent / ~/.ssh")
    gpus: list[int] = Field(default_factory=list, description="GPU ids on this host the run may use")
    workdir: str = Field("/tmp/pipeline", description="remote folder for logs and artifacts (ssh hosts)")
    python: str = Field("python3", description="ssh hosts: the interpreter that has the engine installed "
                                               "(e.g. a venv's bin/python)")

    @model_validator(mode="after")
    def _ssh_needs_address(self):
        if self.kind == "ssh" and not self.address:
            raise ValueError("kind ssh needs `address` (host name or IP)")
        return self


class ServerSpec(Strict):
    args: dict[str, Any] | list[str] = Field(
        default_factory=dict,
        description="engine flags: a mapping (key -> --key value; true -> bare flag; false/null -> omitted; "
                    "a list -> repeated values) or a literal argv list")
    env: dict[str, str] = Field(default_factory=dict, description="env for both arms (not the kernel switch)")
    port: int = Field(30000, ge=1024, le=65535, description="port of the first server; concurrent arms use +1")
    startup_timeout_s: float = Field(900, gt=0, description="how long to wait for /health before giving up")
    launch: list[str] | None = Field(None, description="vllm: the launch command prefix (default `vllm serve`)")


class PlacementSpec(Strict):
    mode: Literal["sequential", "concurrent"] = Field(
        "sequential", description="sequential: same GPUs, one arm after the other; "
                                  "concurrent: both arms at once on disjoint GPU sets")
    hosts: list[str] = Field(default_factory=lambda: ["local"],
                             description="host names from `hosts`; concurrent may give one per arm")
    gpus_per_arm: int = Field(0, ge=0, le=64, description="GPUs each arm's server gets (0: no GPU binding)")
    order: Literal["AB", "ABBA"] = Field("AB", description="sequential order of one round")
    repeats: int = Field(1, ge=1, le=20, description="rounds; a second round gives the A/A noise floor")
    swap: bool = Field(False, description="concurrent: a second round with the arms' GPU sets swapped")


class ArmSpec(Strict):
    env: dict[str, str] = Field(default_factory=dict, description="the kernel switch, e.g. {VATTN: '1'}")
    server_args: dict[str, Any] | list[str] | None = Field(
        None, description="refused if it differs between arms; kept so that a recipe saying it is caught")


class Recipe(Strict):
    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9._-]+$", description="run name (folder prefix)")
    presets: list[str] = Field(default_factory=list, description="configs/<path>.yaml merged under the recipe")
    engine: Literal["emulator", "sglang", "vllm"] = Field("emulator", description="serving engine")
    model: str = Field(..., min_length=1, description="served model name (engines: model path or id)")
    tokenizer: str | None = Field(None, description="tokenizer dir or id for aiperf and the emulator")
    hosts: dict[str, HostSpec] = Field(default_factory=lambda: {"local": HostSpec()},
                                       description="machines by name")
    placement: PlacementSpec = Field(default_factory=PlacementSpec, description="where and in which order")
    arms: dict[str, ArmSpec] = Field(..., description="exactly `off` (baseline) and `on` (candidate)")
    switch_vars: list[str] = Field(default_factory=lambda: ["VATTN", "VATTN_PLAN"],
                                   description="env variables the arms may differ in: the kernel switch")
    server: ServerSpec = Field(default_factory=ServerSpec, description="engine flags and env shared by arms")
    load: LoadSpec = Field(..., description="aiperf load")
    accuracy: AccuracySpec | None = Field(None, description="accuracy tasks run after the load; none to skip")
    output_dir: str = Field("runs", description="parent folder of run directories (relative to the cwd)")

    @field_validator("arms")
    @classmethod
    def _two_arms(cls, arms):
        if sorted(arms) != sorted(ARM_NAMES):
            raise ValueError(f"found arms {sorted(arms)}; a recipe has exactly two arms: `off` (baseline) "
                             f"and `on` (candidate)")
        return arms

    @model_validator(mode="after")
    def _check(self):
        check_arms_differ_only_in_switch(self)
        check_placement(self)
        return self


def check_arms_differ_only_in_switch(r: Recipe) -> None:
    off, on = r.arms["off"], r.arms["on"]
    if off.server_args != on.server_args:
        raise ValueError("arms.on.server_args: differs from arms.off.server_args; arms may differ only in the "
                         "kernel switch (env). Put shared flags under server.args")
    for arm_name, arm in r.arms.items():
        for var in PLACEMENT_VARS:
            if var in arm.env:
                raise ValueError(f"arms.{arm_name}.env: sets {var}; placement assigns GPUs "
                                 f"(placement.gpus_per_arm, hosts.<host>.gpus)")
    differing = sorted(k for k in set(off.env) | set(on.env) if off.env.get(k) != on.env.get(k))
    extra = [k for k in differing if k not in r.switch_vars]
    if extra:
        raise ValueError(f"arms.on.env: differs from arms.off in {', '.join(extra)}; arms may differ only in "
                         f"the kernel switch {r.switch_vars} (set shared env under server.env, or add the "
                         f"variable to switch_vars if it is part of the switch)")
    if not differing:
        raise ValueError("arms.on.env: identical to arms.off; the arms must differ in the kernel switch "
                         f"{r.switch_vars}, e.g. off: {{VATTN: '0'}}, on: {{VATTN: '1'}}")


def check_placement(r: Recipe) -> None:
    p = r.placement
    for i, h in enumerate(p.hosts):
        if h not in r.hosts:
            raise ValueError(f"placement.hosts[{i}]: unknown host {h!r}; defined hosts: {sorted(r.hosts)}")
    if p.mode == "sequential" and len(p.hosts) != 1:
        raise ValueError(f"placement.hosts: sequential placement runs both arms on one host, found {p.hosts}")
    if p.mode == "concurrent" and len(p.hosts) not in (1, 2):
        raise ValueError(f"placement.hosts: concurrent placement takes one host or one per arm, found {p.hosts}")
    if p.mode == "sequential" and p.swap:
        raise ValueError("placement.swap: only for concurrent placement; sequential arms share the GPUs")
    if p.mode == "concurrent" and p.order != "AB":
        raise ValueError("placement.order: ABBA is a sequential order; concurrent arms start together")
    need = p.gpus_per_arm * (2 if p.mode == "concurrent" and len(p.hosts) == 1 else 1)
    for h in p.hosts:
        have = r.hosts[h].gpus
        if need > len(have):
            raise ValueError(f"hosts.{h}.gpus: {have} has {len(have)} GPU(s); placement needs {need} "
                             f"({p.mode}, gpus_per_arm={p.gpus_per_arm})")


# ---------------------------------------------------------------- loading


def deep_merge(base: dict, top: dict) -> dict:
    """Mappings merge key by key; anything else (lists included) in `top` replaces `base`."""
    out = copy.deepcopy(base)
    for k, v in top.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _read_yaml(path: Path, what: str) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise RecipeError(f"{what}: file {str(path)!r} does not exist") from None
    except yaml.YAMLError as e:
        raise RecipeError(f"{what}: {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{what}: {path} must hold a mapping, found {type(data).__name__}")
    return data


def merged_recipe_dict(path: Path) -> dict:
    raw = _read_yaml(path, "recipe")
    presets = raw.get("presets", [])
    if not isinstance(presets, list):
        raise RecipeError(f"presets: expected a list of preset names, found {presets!r}")
    merged: dict = {}
    for i, name in enumerate(presets):
        preset_path = CONFIGS_DIR / f"{name}.yaml"
        if not preset_path.is_file():
            known = sorted(str(p.relative_to(CONFIGS_DIR))[:-5] for p in CONFIGS_DIR.rglob("*.yaml"))
            raise RecipeError(f"presets[{i}]: unknown preset {name!r}; available: {known}")
        merged = deep_merge(merged, _read_yaml(preset_path, f"presets[{i}]"))
    merged = deep_merge(merged, raw)
    if isinstance(merged.get("arms"), dict):
        # YAML 1.1 reads the bare keys `off:` / `on:` as booleans; they can only mean the arm names here.
        merged["arms"] = {({False: "off", True: "on"}.get(k, k) if isinstance(k, bool) else k): v
                          for k, v in merged["arms"].items()}
    return merged


def _format_errors(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "recipe"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling (see `pipeline validate --help` and recipes/quickstart.yaml)"
        elif "input" in err and err["type"] != "missing" and not isinstance(err["input"], dict):
            msg = f"{msg} (found {err['input']!r})"
        lines.append(f"{loc}: {msg}")
    return "\n".join(lines)


def _resolve_paths(data: dict, base: Path) -> dict:
    """Make the recipe's input paths absolute, relative to the recipe file's folder."""
    def resolve(p):
        return str((base / p).resolve()) if isinstance(p, str) and not Path(p).is_absolute() else p

    data = copy.deepcopy(data)
    if data.get("tokenizer") and (base / data["tokenizer"]).exists():
        data["tokenizer"] = resolve(data["tokenizer"])
    load = data.get("load")
    if isinstance(load, dict) and load.get("trace"):
        load["trace"] = resolve(load["trace"])
    acc = data.get("accuracy")
    if isinstance(acc, dict):
        for task in acc.get("tasks") or []:
            for key in ("data", "shots_data"):
                if isinstance(task, dict) and task.get(key):
                    task[key] = resolve(task[key])
    return data


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    data = _resolve_paths(merged_recipe_dict(path), path.resolve().parent)
    try:
        return Recipe.model_validate(data)
    except ValidationError as e:
        raise RecipeError(f"{path}: invalid recipe\n{_format_errors(e)}") from None


def recipe_to_dict(r: Recipe) -> dict:
    return r.model_dump(mode="json")
