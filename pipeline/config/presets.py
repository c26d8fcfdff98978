"""Presets from configs/: named YAML fragments deep-merged under a recipe before it is validated.

A recipe lists them under `presets:` (paths under configs/, without .yaml); they merge in order, then
the recipe itself on top, and the merged dict is validated once.
"""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

from pipeline.config.base import RecipeError
from pipeline.paths import CONFIGS_DIR, configs_missing_hint, preset_file


def deep_merge(base: dict, top: dict) -> dict:
    """Mappings merge key by key; anything else (lists included) in `top` replaces `base`."""
    out = copy.deepcopy(base)
    for k, v in top.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key, first: int, again: int):
        super().__init__(f"key {key!r} is given twice in one mapping (lines {first} and {again}); keep one")


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, but a key given twice in one mapping is an error: YAML keeps the last silently, so a point or
    an axis value written twice would vanish without a word."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<:` merges may override keys by design
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _DuplicateKey(key, seen[key], line)
                seen[key] = line
            except TypeError:  # an unhashable key: the base constructor names it
                continue
        return super().construct_mapping(node, deep)


def read_yaml(path: Path, what: str) -> dict:
    """The mapping in a YAML file; RecipeError (naming `what`) if it is missing, invalid, not a mapping, or gives a
    key twice in one mapping."""
    try:
        with path.open(encoding="utf-8") as f:  # a stream, not its text: a syntax error's marks then name the file
            data = yaml.load(f, Loader=_UniqueKeyLoader)
    except _DuplicateKey as e:
        raise RecipeError(f"{what}: {path}: {e}") from None
    except FileNotFoundError:
        raise RecipeError(f"{what}: file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise RecipeError(f"{what}: {str(path)!r} is a directory; give a YAML file") from None
    except PermissionError:
        raise RecipeError(f"{what}: {str(path)!r} is not readable (permission denied)") from None
    except UnicodeDecodeError:
        raise RecipeError(f"{what}: {str(path)!r} is not a text file (not UTF-8); give a YAML file") from None
    except yaml.YAMLError as e:
        raise RecipeError(f"{what}: {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{what}: {path} must hold a mapping, found {type(data).__name__}")
    return data


def file_kind(data: dict) -> str | None:
    """"sweep" (it names a `base` recipe), "recipe" (it has `arms`), or None where the fields do not tell, so that
    validation names what is wrong."""
    if ("base" in data) != ("arms" in data):
        return "sweep" if "base" in data else "recipe"
    return None


def merged_recipe_dict(path: Path) -> dict:
    """The recipe file with its presets merged under it, not yet validated."""
    raw = read_yaml(path, "recipe")
    if file_kind(raw) == "sweep":
        raise RecipeError(f"{path}: a sweep file (it names a `base` recipe), not a recipe; run it with "
                          f"`pipeline sweep {path}`")
    presets = raw.get("presets", [])
    if not isinstance(presets, list):
        raise RecipeError(f"presets: expected a list of preset names, found {presets!r}")
    merged: dict = {}
    for i, name in enumerate(presets):
        preset_path = preset_file(name, CONFIGS_DIR)
        if not preset_path.is_file():
            known = sorted(str(p.relative_to(CONFIGS_DIR))[:-5] for p in CONFIGS_DIR.rglob("*.yaml"))
            raise RecipeError(f"presets[{i}]: unknown preset {name!r}; available: {known}{configs_missing_hint()}")
        merged = deep_merge(merged, read_yaml(preset_path, f"presets[{i}]"))
    merged = deep_merge(merged, raw)
    if isinstance(merged.get("arms"), dict):
        # YAML 1.1 reads the bare keys `off:` / `on:` as booleans; they can only mean the arm names here.
        merged["arms"] = {({False: "off", True: "on"}.get(k, k) if isinstance(k, bool) else k): v
                          for k, v in merged["arms"].items()}
    return merged
