"""The recipe: one YAML file that says what to A/B, where, and how to load and score it.

Presets listed under `presets:` are deep-merged under it first (presets.py); the merged dict is
validated once. Relative paths in the recipe resolve against the recipe file's folder, so
`pipeline run` works from any directory. Each block's model lives in its own module of this package.
"""
from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from pipeline.config.accuracy import AccuracySpec
from pipeline.config.arms import ARM_NAMES, ArmSpec, arm_server_args, check_arms, check_switch_vars
from pipeline.config.base import RecipeError, Strict
from pipeline.config.emulator import check_server_args
from pipeline.config.load import LoadSpec
from pipeline.config.placement import HostSpec, PlacementSpec, check_placement
from pipeline.config.presets import merged_recipe_dict
from pipeline.config.resolve import resolve_paths
from pipeline.config.server import ServerSpec, args_to_argv
from pipeline.paths import file_in_the_way
from vattn.switch import SWITCH_VARS


class Recipe(Strict):
    name: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9._-]+$", description="run name (folder prefix)")
    presets: list[str] = Field(default_factory=list, description="configs/<path>.yaml merged under the recipe")
    engine: Literal["emulator", "sglang", "vllm"] = Field("emulator", description="serving engine")
    model: str = Field(..., min_length=1, description="served model name (engines: model path or id)")
    # Required: every run has a load stage, and aiperf counts each request's tokens with this tokenizer.
    tokenizer: str = Field(..., min_length=1, description=(
        "a HF tokenizer directory (with tokenizer.json; relative to the recipe's folder) or a hub id, e.g. "
        "data/tokenizer; aiperf counts each request's tokens with it, and so does the emulator (a directory only)"))
    hosts: dict[str, HostSpec] = Field(default_factory=lambda: {"local": HostSpec()},
                                       description="machines by name")
    placement: PlacementSpec = Field(default_factory=PlacementSpec, description="where and in which order")
    arms: dict[str, ArmSpec] = Field(..., description="exactly `off` (baseline) and `on` (candidate)")
    switch_vars: list[str] = Field(default_factory=lambda: list(SWITCH_VARS),
                                   description="env variables the arms may differ in: the kernel switch "
                                               "(vattn/switch.py) or part of it")
    server: ServerSpec = Field(default_factory=ServerSpec, description="engine flags and env shared by arms")
    load: LoadSpec = Field(..., description="aiperf load")
    accuracy: AccuracySpec | None = Field(None, description="accuracy tasks run after the load; none to skip")
    output_dir: str = Field("runs", description="parent folder of run directories (relative to the cwd)")
    target_effect: float | None = Field(None, description=(
        "smallest change of decode time per token worth detecting, in percent (5 = 5%); the report says "
        "whether the run could detect it and how long a window would"))

    @field_validator("arms")
    @classmethod
    def _two_arms(cls, arms):
        if sorted(arms) != sorted(ARM_NAMES):
            raise ValueError(f"found arms {sorted(arms)}; a recipe has exactly two arms: `off` (baseline) "
                             f"and `on` (candidate)")
        return arms

    @field_validator("target_effect")
    @classmethod
    def _target_effect(cls, v):
        if v is not None and not 0 < v < 100:
            raise ValueError("must be a percentage between 0 and 100, exclusive: the smallest change of decode "
                             "time per token worth detecting; write `target_effect: 5` for 5%")
        return v

    @field_validator("output_dir")
    @classmethod
    def _output_dir(cls, v):
        if (f := file_in_the_way(Path(v))) is not None:  # else `pipeline run` would fail making the run dir
            raise ValueError(f"'{f}' is not a directory; run dirs are made inside output_dir: give a folder "
                             f"(relative to the cwd), or leave the field out for ./runs")
        return v

    @field_validator("switch_vars")
    @classmethod
    def _fixed_switch(cls, names):
        return check_switch_vars(names)

    @model_validator(mode="after")
    def _check(self):
        check_arms(self.arms, self.server, self.switch_vars)
        check_placement(self.placement, self.hosts)
        # The emulator's flags and tokenizer are ours to read before anything starts; another engine's are its
        # own. On an SSH host the server reads its flags (and any file they name) itself; its tokenizer is a copy
        # of this machine's (pipeline/plan.py's _server_tokenizer).
        if self.engine == "emulator":
            if all(self.hosts[h].kind != "ssh" for h in self.placement.hosts):
                check_server_args(args_to_argv(arm_server_args(self.server, self.arms["on"])), "server.args")
            if not (Path(self.tokenizer) / "tokenizer.json").is_file():
                raise ValueError(f"tokenizer: {self.tokenizer!r} has no tokenizer.json; the emulator counts tokens "
                                 f"with it: give a HF tokenizer directory (relative to the recipe's folder)")
        return self


def _step(tp, key):
    """The type found one step below `tp` at `key`: a model's field, a dict's value, a list's item (through
    Optional and unions); None where there is none."""
    for t in typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,):
        origin = typing.get_origin(t)
        if isinstance(t, type) and issubclass(t, BaseModel) and key in t.model_fields:
            return t.model_fields[key].annotation
        if origin is dict and isinstance(key, str):
            return typing.get_args(t)[1]
        if origin is list and isinstance(key, int):
            return typing.get_args(t)[0]
    return None


def _models_at(model: type[BaseModel] | None, loc: tuple) -> list[type[BaseModel]]:
    """The models that may hold the field at `loc` (a union may offer several)."""
    tp = model
    for key in loc[:-1]:
        tp = tp and _step(tp, key)
    return [t for t in (typing.get_args(tp) or (tp,)) if isinstance(t, type) and issubclass(t, BaseModel)]


def _missing_field(model: type[BaseModel] | None, loc: tuple) -> str:
    """What to say of a required field left out: what it takes, from its description."""
    info = next((m.model_fields[loc[-1]] for m in _models_at(model, loc) if loc[-1] in m.model_fields), None)
    return f"Field required: {info.description}" if info and info.description else "Field required"


def _unknown_field(model: type[BaseModel] | None, loc: tuple) -> str:
    """What to say of a field the model at `loc` does not have: the nearest allowed name, and all of them."""
    models = _models_at(model, loc)
    if not models:
        return "unknown field; check the spelling"
    allowed = list(models[0].model_fields)
    near = _nearest(str(loc[-1]), models[0])
    return f"unknown field{f'; did you mean {near!r}?' if near else ''} (allowed here: {', '.join(allowed)})"


def _nearest(name: str, model: type[BaseModel]) -> str | None:
    """The model's field nearest to `name`, or a sub-block's field when that is much nearer (a recipe's top-level
    `concurrency` belongs in `load`)."""
    def ratio(a: str) -> float:
        return difflib.SequenceMatcher(None, name, a).ratio()

    scored = [(ratio(f), f) for f in model.model_fields]
    for field, info in model.model_fields.items():
        for sub in (t for t in (typing.get_args(info.annotation) or (info.annotation,))
                    if isinstance(t, type) and issubclass(t, BaseModel)):
            scored += [(ratio(f) - 0.1, f"{field}.{f}") for f in sub.model_fields]  # a sub-block's must beat by 0.1
    best, where = max(scored)
    return where if best >= 0.6 else None


# server.EngineArgs' members, as pydantic names them in an error's location
_UNION_MEMBERS = {"dict[str,any]": "a mapping", "list[str]": "a list of strings"}


def _format_errors(e: ValidationError, model: type[BaseModel] | None = None) -> str:
    lines, unions = [], {}
    for err in e.errors():
        if err["loc"] and err["loc"][-1] in _UNION_MEMBERS:  # pydantic reports a union once per member
            where = tuple(err["loc"][:-1])
            unions.setdefault(where, (err.get("input"), []))[1].append(_UNION_MEMBERS[err["loc"][-1]])
            continue
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = _unknown_field(model, tuple(err["loc"]))
        elif err["type"] == "missing" and err["loc"]:
            msg = _missing_field(model, tuple(err["loc"]))
        elif "input" in err and err["type"] != "missing" and not (
                isinstance(err["input"], dict) and err["type"] in ("value_error", "assertion_error")):
            # a rule over a whole block names its fields itself; a block of the wrong type shows what was found
            msg = f"{msg} (found {err['input']!r})"
        lines.append(f"{loc}: {msg}" if loc else msg)  # a whole-file rule's message names its fields itself
    for where, (found, kinds) in unions.items():
        lines.append(f"{'.'.join(map(str, where))}: expected {' or '.join(kinds)} (found {found!r})")
    return "\n".join(lines)


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    data = resolve_paths(merged_recipe_dict(path), path.resolve().parent)
    try:
        return Recipe.model_validate(data)
    except ValidationError as e:
        raise RecipeError(f"{path}: invalid recipe\n{_format_errors(e, Recipe)}") from None


def recipe_to_dict(r: Recipe) -> dict:
    return r.model_dump(mode="json")
