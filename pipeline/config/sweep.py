"""`sweep.yaml`: a base recipe plus a matrix of overlays, expanded into ordinary recipes, one per point.

    name: sweep-quickstart
    base: quickstart.yaml            # a recipe file, relative to this file
    overrides: {accuracy: null}      # merged into the base for every point
    matrix:                          # axes; points are their cross product, named a-b-...
      conc:
        c2: {load: {concurrency: 2}}
        c6: {load: {concurrency: 6}}
    # or `points:` {name: overlay}: an explicit list (the MI355X reference's four points are not a product)

Overlays deep-merge like presets (mappings key by key, lists replaced). Each point is validated as a
whole recipe before anything runs, so a bad point fails the sweep at once, naming the point.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from pipeline.config.base import RecipeError, Strict
from pipeline.config.presets import deep_merge, file_kind, merged_recipe_dict, read_yaml
from pipeline.config.recipe import Recipe, _format_errors
from pipeline.config.resolve import reads_files_here, resolve_paths

_NAME = r"^[A-Za-z0-9._-]+$"
# sweep_summary.csv's own columns (analysis.sweep.point_rows), which an axis's column must not replace
_SUMMARY_COLUMNS = {"point", "arm", "gpus", "run_dir", "requests", "matched_n"}
_SUMMARY_PREFIXES = ("d_", "off_", "on_", "inter_", "tput_")


class SweepSpec(Strict):
    name: str = Field(..., min_length=1, pattern=_NAME, description="sweep name (folder prefix)")
    base: str = Field(..., min_length=1, description="the base recipe file, relative to the sweep file")
    overrides: dict[str, Any] = Field(default_factory=dict, description="recipe fields set for every point")
    matrix: dict[str, dict[str, dict[str, Any]]] | None = Field(
        None, description="axis -> {value name -> recipe overlay}; points are the cross product")
    points: dict[str, dict[str, Any]] | None = Field(
        None, description="point name -> recipe overlay: an explicit list instead of a matrix")
    gpus_per_server: int | None = Field(
        None, ge=1, le=64, description="GPUs per server that divide output throughput into per-GPU figures, for "
                                       "every point, overriding what its flags say (the emulator's model preset "
                                       "tp_size, sglang's --tp-size); a real engine's placement.gpus_per_arm "
                                       "still wins. Unset: each point's own")
    output_dir: str = Field("runs", description="parent folder of sweep dirs (relative to the cwd)")

    @field_validator("matrix")
    @classmethod
    def _axes(cls, m):
        if m is None:
            return m
        if not m:
            raise ValueError("no axes; give at least one, e.g. {conc: {c8: {load: {concurrency: 8}}}}")
        for axis, values in m.items():
            if axis in _SUMMARY_COLUMNS or axis.startswith(_SUMMARY_PREFIXES):
                raise ValueError(f"axis name {axis!r} is a column of sweep_summary.csv already (which holds one "
                                 f"column per axis); rename the axis")
            if not values:
                raise ValueError(f"axis {axis!r} has no values; give at least one, e.g. {{c8: {{load: "
                                 f"{{concurrency: 8}}}}}}")
            for name in values:
                _check_name(f"axis {axis!r}: ", name)
        return m

    @field_validator("points")
    @classmethod
    def _points(cls, p):
        if p is None:
            return p
        if not p:
            raise ValueError("no points; give at least one, e.g. {c8: {load: {concurrency: 8}}}")
        for name in p:
            _check_name("", name)
        return p

    @model_validator(mode="after")
    def _one_of(self):
        if (self.matrix is None) == (self.points is None):
            raise ValueError("set exactly one of matrix (axes crossed into points) or points (an explicit "
                             f"list); found matrix={'set' if self.matrix else None}, "
                             f"points={'set' if self.points else None}")
        return self


def _check_name(where: str, name: str) -> None:
    import re

    if not re.match(_NAME, str(name)):
        raise ValueError(f"{where}point name {name!r} may hold only letters, digits, '.', '_' and '-' "
                         f"(it names the point's run dir)")
    if str(name) in (".", ".."):  # runs/. is the runs folder itself, runs/.. the sweep dir
        raise ValueError(f"{where}point name {name!r} names a folder that exists already, not a run dir of its "
                         f"own; give a name with a letter, digit, '_' or '-'")


def point_overlays(spec: SweepSpec) -> dict[str, dict]:
    """{point name: overlay} in execution order (the matrix's first axis varies slowest)."""
    if spec.points is not None:
        return dict(spec.points)
    axes = list(spec.matrix.values())
    out, combos = {}, {}
    for combo in itertools.product(*(list(a.items()) for a in axes)):
        overlay: dict = {}
        labelled = list(zip(spec.matrix, combo))  # [(axis, (value name, overlay))]
        for i, (axis, (name, ov)) in enumerate(labelled):
            for earlier_axis, (earlier, eov) in labelled[:i]:
                check_not_hidden(eov, ov, f"matrix.{earlier_axis}.{earlier}", f"matrix.{axis}.{name}")
            overlay = deep_merge(overlay, ov)
        names = tuple(str(n) for n, _ in combo)
        point = "-".join(names)
        if point in out:  # value names that hold '-' can join into the same point name
            raise RecipeError(f"matrix: the combinations {list(combos[point])} and {list(names)} both name point "
                              f"{point!r}; rename a value so that no two join alike")
        out[point], combos[point] = overlay, names
    return out


def check_not_hidden(under: dict, over: dict, where: str, by: str, path: str = "") -> None:
    """deep_merge lets a mapping in `over` replace whatever `under` holds at its key: a scalar
    `overrides: {load: 5}` would vanish under a point's `load: {concurrency: 4}` and the point run on the base's
    load. Refuse a value so hidden, naming it (null, which says "none", may be filled in)."""
    for key, value in over.items():
        if key not in under or not isinstance(value, dict):
            continue
        field = f"{path}{key}"
        if isinstance(under[key], dict):
            check_not_hidden(under[key], value, where, by, f"{field}.")
        elif under[key] is not None:
            sets = f"{field}.{next(iter(value))}" if value else f"{field}: {{}}"
            raise RecipeError(f"{where}.{field}: expected a mapping (found {under[key]!r}); {by} sets {sets}, which "
                              f"would replace it unseen")


def point_labels(matrix: dict | None) -> dict[str, dict[str, str]]:
    """{point: {axis: value name}} of a matrix (SweepSpec.matrix), in point_overlays' order; {} for points."""
    if not matrix:
        return {}
    axes = list(matrix)
    return {"-".join(names): dict(zip(axes, names))
            for names in itertools.product(*(map(str, matrix[a]) for a in axes))}


def line_axis(matrix: dict | None) -> str | None:
    """The matrix axis a Pareto line runs along: the one whose values set load.concurrency, else the last (the
    fastest-varying); None for explicit points."""
    if not matrix:
        return None
    for axis, values in matrix.items():
        if any(isinstance(ov.get("load"), dict) and "concurrency" in ov["load"] for ov in values.values()):
            return axis
    return list(matrix)[-1]


def load_sweep(path: str | Path) -> SweepSpec:
    path = Path(path)
    data = read_yaml(path, "sweep")
    if file_kind(data) == "recipe":
        raise RecipeError(f"{path}: a recipe, not a sweep file (a sweep names its `base` recipe and a `matrix` "
                          f"or `points`; recipes/sweep-quickstart.yaml is one); run it with `pipeline run {path}`")
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as e:
        raise RecipeError(f"{path}: invalid sweep\n{_format_errors(e, SweepSpec)}") from None


def point_recipes(spec: SweepSpec, sweep_file: Path) -> dict[str, dict]:
    """{point: recipe dict}, each validated. A relative path resolves against the folder of the file that
    wrote it: the base recipe's paths against its folder, the sweep's overrides and matrix against the sweep
    file's."""
    base_path = (Path(sweep_file).resolve().parent / spec.base).resolve()
    if not base_path.is_file():
        what = "is a directory" if base_path.is_dir() else "does not exist"
        raise RecipeError(f"base: recipe file {str(base_path)!r} {what}; `base` names a recipe file, relative to "
                          f"the sweep file ({sweep_file})")
    raw = read_yaml(base_path, "base")
    if file_kind(raw) == "sweep":
        raise RecipeError(f"base: {str(base_path)!r} is a sweep file; `base` names a recipe (one with `arms`), "
                          f"such as the base of that sweep")
    raw = _bool_arm_keys(raw)
    out = {}
    overlays = point_overlays(spec)
    for point, overlay in overlays.items():
        check_not_hidden(spec.overrides, overlay, "overrides", f"point {point!r}")
        ours = _bool_arm_keys(deep_merge(spec.overrides, overlay))
        # where the server reads its file flags is the point's, whichever file placed it
        here = reads_files_here(deep_merge(raw, ours))
        d = deep_merge(resolve_paths(raw, base_path.parent, here),
                       resolve_paths(ours, Path(sweep_file).resolve().parent, here))
        d["name"] = f"{spec.name}-{point}"
        out[point] = d
        check_point(point, d)
    return out


def _bool_arm_keys(d: dict) -> dict:
    # YAML 1.1 reads bare `off:` / `on:` as booleans (see presets.merged_recipe_dict)
    if isinstance(d.get("arms"), dict):
        d["arms"] = {({False: "off", True: "on"}.get(k, k) if isinstance(k, bool) else k): v
                     for k, v in d["arms"].items()}
    return d


def check_point(point: str, recipe: dict) -> Recipe:
    """Validate one point's recipe (presets merged) as `pipeline run` would; the error names the point."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "recipe.yaml"
        f.write_text(yaml.safe_dump(recipe, sort_keys=False))
        merged = merged_recipe_dict(f)
    try:
        return Recipe.model_validate(merged)
    except (ValidationError, RecipeError) as e:
        msg = _format_errors(e, Recipe) if isinstance(e, ValidationError) else str(e)
        raise RecipeError(f"sweep point {point!r}: invalid recipe\n{msg}") from None
