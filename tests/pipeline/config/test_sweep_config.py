"""sweep.yaml: expansion into point recipes (matrix and explicit points) and its errors."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.config.base import RecipeError
from pipeline.config.recipe import load_recipe
from pipeline.config.sweep import load_sweep, point_overlays, point_recipes

REPO = Path(__file__).resolve().parents[3]


def _sweep(tmp_path: Path, **fields) -> Path:
    data = {"name": "s", "base": str(REPO / "recipes/quickstart.yaml"), **fields}
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_matrix_is_the_cross_product_in_order(tmp_path):
    path = _sweep(tmp_path, matrix={
        "conc": {"c4": {"load": {"concurrency": 4}}, "c8": {"load": {"concurrency": 8}}},
        "tp": {"tp2": {"server": {"args": {"model_preset": "qwen3.5-397b-a17b-tp2"}}},
               "tp4": {"server": {"args": {"model_preset": "qwen3.5-397b-a17b-tp4"}}}}})
    recipes = point_recipes(load_sweep(path), path)
    assert list(recipes) == ["c4-tp2", "c4-tp4", "c8-tp2", "c8-tp4"]
    r = recipes["c8-tp4"]
    assert r["name"] == "s-c8-tp4" and r["load"]["concurrency"] == 8
    assert r["server"]["args"]["model_preset"] == "qwen3.5-397b-a17b-tp4"
    assert r["server"]["args"]["hardware"] == "h200"            # the base's other args are kept
    assert Path(r["load"]["trace"]).is_absolute() and Path(r["load"]["trace"]).is_dir()


def test_a_relative_path_resolves_against_the_file_that_wrote_it(tmp_path):
    """The sweep's own paths against the sweep file's folder, the base's against the base's."""
    import shutil

    shutil.copytree(REPO / "recipes/data/traces/short", tmp_path / "mytrace")
    path = _sweep(tmp_path, matrix={"conc": {"c4": {"load": {"concurrency": 4}},
                                             "c8": {"load": {"concurrency": 8, "trace": "mytrace"}}}})
    recipes = point_recipes(load_sweep(path), path)
    assert recipes["c8"]["load"]["trace"] == str(tmp_path / "mytrace")
    assert recipes["c4"]["load"]["trace"] == str(REPO / "recipes/data/traces/quickstart")


def test_shipped_sweeps_expand():
    for path in sorted((REPO / "recipes").glob("sweep-*.yaml")):
        recipes = point_recipes(load_sweep(path), path)
        assert recipes, path
    qs = point_recipes(load_sweep(REPO / "recipes/sweep-quickstart.yaml"), REPO / "recipes/sweep-quickstart.yaml")
    assert [r["load"]["concurrency"] for r in qs.values()] == [4, 8] and all(r["accuracy"] is None for r in qs.values())


def test_explicit_points(tmp_path):
    spec = load_sweep(_sweep(tmp_path, points={"a": {"load": {"concurrency": 2}}, "b": {}}))
    assert point_overlays(spec) == {"a": {"load": {"concurrency": 2}}, "b": {}}


@pytest.mark.parametrize("fields, match", [
    ({}, r"set exactly one of matrix .* or points"),
    ({"matrix": {"conc": {}}}, r"matrix: axis 'conc' has no values"),
    ({"matrix": {}}, r"matrix: no axes; give at least one"),
    ({"points": {}}, r"points: no points; give at least one"),
    ({"points": {"a b": {}}}, r"points: point name 'a b' may hold only letters"),
    ({"matrix": {"conc": {"c 4": {}}}}, r"\nmatrix: axis 'conc': point name 'c 4' may hold only letters"),
    ({"matrix": {"arm": {"a": {}}}}, r"matrix: axis name 'arm' is a column of sweep_summary.csv already"),
    ({"points": {"..": {}}}, r"points: point name '\.\.' names a folder that exists already, not a run dir"),
    ({"matrix": {"conc": {".": {}}}}, r"matrix: axis 'conc': point name '\.' names a folder that exists already"),
    # 2 x 2 values, but 'x-y' + 'z' and 'x' + 'y-z' both join into x-y-z
    ({"matrix": {"a": {"x-y": {}, "x": {}}, "b": {"z": {}, "y-z": {}}}},
     r"matrix: the combinations \['x', 'y-z'\] and \['x-y', 'z'\] both name point 'x-y-z'"),  # keys sorted
    ({"points": {"a": {}}, "matirx": {}}, r"matirx: unknown field; did you mean 'matrix'\? \(allowed here: name, base"),
    ({"points": {"bad": {"load": {"concurrency": 0}}}},
     r"sweep point 'bad': invalid recipe\nload.concurrency: Input should be greater than or equal to 1"),
    ({"points": {"tp9": {"server": {"args": {"model_preset": "qwen9"}}}}},  # an emulator flag, read at once
     r"sweep point 'tp9': invalid recipe\nserver.args: model_preset: 'qwen9' not found"),
])
def test_sweep_errors(tmp_path, fields, match):
    with pytest.raises(RecipeError, match=match):
        path = _sweep(tmp_path, **fields)
        point_recipes(load_sweep(path), path)


def test_missing_base_names_the_field(tmp_path):
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump({"name": "s", "bse": "quickstart.yaml", "points": {"a": {}}}))
    with pytest.raises(RecipeError, match=r"typo.yaml: invalid sweep\n(.*\n)*base: Field required"):
        load_sweep(typo)
    path = _sweep(tmp_path, base="nope.yaml", points={"a": {}})
    with pytest.raises(RecipeError, match=r"base: recipe file .*nope.yaml' does not exist; `base` names a recipe "
                                          r"file, relative to the sweep file"):
        point_recipes(load_sweep(path), path)
    path = _sweep(tmp_path, base=str(tmp_path), points={"a": {}})
    with pytest.raises(RecipeError, match=r"base: recipe file .* is a directory; `base` names a recipe file"):
        point_recipes(load_sweep(path), path)
    inner = _sweep(tmp_path, points={"a": {}})
    outer = tmp_path / "outer.yaml"
    outer.write_text(yaml.safe_dump({"name": "o", "base": str(inner), "points": {"b": {}}}))
    with pytest.raises(RecipeError, match=rf"base: '{inner}' is a sweep file; `base` names a recipe"):
        point_recipes(load_sweep(outer), outer)


def test_a_recipe_and_a_sweep_file_are_told_apart(tmp_path):
    recipe = REPO / "recipes/quickstart.yaml"
    with pytest.raises(RecipeError, match=r"quickstart.yaml: a recipe, not a sweep file .* run it with `pipeline run "):
        load_sweep(recipe)
    with pytest.raises(RecipeError, match=r"sweep.yaml: a sweep file \(it names a `base` recipe\), not a recipe; "
                                          r"run it with `pipeline sweep "):
        load_recipe(_sweep(tmp_path, points={"a": {}}))


def test_validate_checks_every_point_of_a_sweep(tmp_path):
    def validate(path):
        return subprocess.run([sys.executable, "-m", "pipeline.cli", "validate", str(path)], cwd=REPO,
                              capture_output=True, text=True, timeout=60)

    ok = validate(REPO / "recipes/sweep-quickstart.yaml")
    assert ok.returncode == 0 and "ok (sweep of 2 points: c4, c8)" in ok.stdout, ok.stderr
    bad = validate(_sweep(tmp_path, points={"good": {}, "bad": {"load": {"concurrency": 0}}}))
    assert bad.returncode != 0 and "sweep point 'bad': invalid recipe" in bad.stderr


@pytest.mark.parametrize("text, match", [
    ("name: s\nbase: b.yaml\npoints:\n  c4: {load: {concurrency: 4}}\n  c8: {}\n  c4: {load: {concurrency: 8}}\n",
     r"sweep: .*sweep.yaml: key 'c4' is given twice in one mapping \(lines 4 and 6\); keep one$"),
    ("name: s\nbase: b.yaml\nmatrix:\n  conc: {c4: {}, c4: {load: {concurrency: 8}}}\n",
     r"sweep: .*sweep.yaml: key 'c4' is given twice in one mapping \(lines 4 and 4\); keep one$"),
])
def test_a_key_given_twice_is_refused(tmp_path, text, match):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=match):
        load_sweep(path)


def test_a_recipe_key_given_twice_is_refused(tmp_path):
    text = (REPO / "recipes/quickstart.yaml").read_text().replace("placement:\n", "placement:\n  mode: concurrent\n")
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=r"recipe: .*recipe.yaml: key 'mode' is given twice in one mapping "
                                          r"\(lines \d+ and \d+\); keep one"):
        load_recipe(path)
    merge = tmp_path / "merge.yaml"  # a YAML merge key may override what it merges: not a key given twice
    merge.write_text("name: s\nbase: b.yaml\nx: &o {a: 1}\npoints:\n  c4: {<<: *o, a: 2}\n")
    with pytest.raises(RecipeError, match=r"x: unknown field"):
        load_sweep(merge)


def test_plan_of_a_sweep_file_shows_each_point_as_its_run_would(tmp_path):
    path = _sweep(tmp_path, matrix={"conc": {"c4": {"load": {"concurrency": 4}}, "c8": {"load": {"concurrency": 8}}}})
    p = subprocess.run([sys.executable, "-m", "pipeline.cli", "plan", str(path), "--out", str(tmp_path / "sw")],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    heads = [line for line in p.stdout.splitlines() if line.startswith("== point")]
    assert heads == ["== point 1/2: c4 ==", "== point 2/2: c8 =="]
    c4, c8 = p.stdout.split("== point 2/2: c8 ==")
    assert f"--artifact-dir {tmp_path}/sw/runs/c4/arms/off/aiperf" in c4 and "--concurrency 4 " in c4
    assert f"--artifact-dir {tmp_path}/sw/runs/c8/arms/off/aiperf" in c8 and "--concurrency 8 " in c8
    assert not (tmp_path / "sw").exists()  # a plan launches and writes nothing


def test_an_override_of_the_wrong_type_is_a_field_error(tmp_path):
    # the sweep's paths are made absolute before its points are validated; a value that is no path must get there
    with pytest.raises(RecipeError, match=r"sweep point 'a': invalid recipe\ntokenizer: Input should be a valid string "
                                          r"\(found 5\)\naccuracy.tasks: Input should be a valid list \(found 5\)$"):
        point_recipes(load_sweep(p := _sweep(tmp_path, overrides={"tokenizer": 5, "accuracy": {"tasks": 5}},
                                             points={"a": {}})), p)


def test_a_sweep_file_flag_resolves_against_the_file_that_wrote_it(tmp_path):
    (tmp_path / "emucfg.yaml").write_text("max_running_requests: 4\n")
    path = _sweep(tmp_path, points={"a": {"server": {"args": {"config": "emucfg.yaml"}}}})
    assert point_recipes(load_sweep(path), path)["a"]["server"]["args"]["config"] == str(tmp_path / "emucfg.yaml")


@pytest.mark.parametrize("fields, match", [
    ({"overrides": {"load": 5}, "matrix": {"conc": {"c4": {"load": {"concurrency": 4}}}}},
     r"^overrides.load: expected a mapping \(found 5\); point 'c4' sets load.concurrency, which would replace it "
     r"unseen$"),
    ({"overrides": {"server": {"args": 5}}, "points": {"a": {"server": {"args": {"max_running_requests": 4}}}}},
     r"^overrides.server.args: expected a mapping \(found 5\); point 'a' sets server.args.max_running_requests"),
    ({"matrix": {"x": {"x1": {"load": 5}}, "y": {"y1": {"load": {"concurrency": 2}}}}},
     r"^matrix.x.x1.load: expected a mapping \(found 5\); matrix.y.y1 sets load.concurrency"),
])
def test_a_value_a_point_would_replace_unseen_is_refused(tmp_path, fields, match):
    # deep_merge lets a point's mapping replace a scalar whole: the point would run on the base's load, silently
    path = _sweep(tmp_path, **fields)
    with pytest.raises(RecipeError, match=match):
        point_recipes(load_sweep(path), path)


def test_a_point_may_fill_in_what_the_overrides_set_to_null(tmp_path):
    path = _sweep(tmp_path, overrides={"accuracy": None}, points={"a": {"accuracy": {"tasks": []}}})
    assert point_recipes(load_sweep(path), path)["a"]["accuracy"] == {"tasks": []}
