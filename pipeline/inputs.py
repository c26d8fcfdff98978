"""The files a run reads, hashed at its start, and whether the checkout's commit holds each of them; on
`--resume`, whether the ones its stages read again are still what the finished stages read.

The git sha pins the code, not a recipe, trace or profile that was never committed: the manifest keeps each
input's sha256 and git state, so a reader can tell whether the commit alone reproduces the run.
Inputs: the recipe file (as given), its presets, the load trace, the accuracy data, and on the emulator its
hardware profile and model preset. The tokenizer is not hashed (it may be a whole model folder).
"""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

from pipeline.paths import CONFIGS_DIR, HARDWARE_PROFILES_DIR, MODEL_PRESETS_DIR, REPO_ROOT, preset_file

# git status --porcelain codes -> the state a reader needs; a tracked, unchanged file is listed by none
_GIT_STATES = {"??": "untracked", "!!": "ignored"}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_tree(folder: Path) -> tuple[str, int]:
    """(one hash over every file's relative path and content hash, in path order; the file count)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.relative_to(folder).as_posix()}\0{sha256_file(p)}\n".encode())
    return h.hexdigest(), len(files)


def sha256_path(path: Path) -> tuple[str, int | None]:
    """(sha256, file count) of a folder (sha256_tree) or (sha256, None) of a file; OSError where unreadable."""
    return sha256_tree(path) if path.is_dir() else (sha256_file(path), None)


def input_paths(recipe_path: str, recipe: dict) -> list[tuple[str, str, Path]]:
    """(role, path as the recipe gives it, path to read) for each input file the recipe names."""
    out = [("recipe", str(recipe_path), Path(recipe_path))]
    for name in recipe.get("presets") or []:
        out.append((f"preset {name}", str(name), preset_file(str(name), CONFIGS_DIR)))
    load = recipe.get("load") or {}
    if load.get("trace"):
        out.append(("trace", str(load["trace"]), Path(load["trace"])))
    for i, task in enumerate((recipe.get("accuracy") or {}).get("tasks") or []):
        for key in ("data", "shots_data"):
            if isinstance(task, dict) and task.get(key):
                out.append((f"accuracy {task.get('name', i)} {key}", str(task[key]), Path(task[key])))
    if recipe.get("engine") == "emulator":
        out += _emulator_profiles(((recipe.get("server") or {}).get("args")) or {})
    return out


def _emulator_profiles(args: dict) -> list[tuple[str, str, Path]]:
    """The hardware profile and model preset the emulator reads: a name in configs/ or a path (its own rules,
    pipeline.config.emulator: any suffix makes a hardware path, .yaml/.yml a model-preset path)."""
    from pipeline.config.emulator import DEFAULT_PRESET, EmulatorConfig

    hw = str(args.get("hardware") or EmulatorConfig.model_fields["hardware"].default)
    model = str(args.get("model_preset") or DEFAULT_PRESET)
    return [("hardware profile", hw, Path(hw) if Path(hw).suffix else preset_file(hw, HARDWARE_PROFILES_DIR)),
            ("model preset", model,
             Path(model) if Path(model).suffix in (".yaml", ".yml") else preset_file(model, MODEL_PRESETS_DIR))]


def git_states(paths: list[Path]) -> dict[Path, str]:
    """Per path: "committed", "modified", "untracked", "ignored" (a folder: its worst file), or "outside the
    checkout"; {} where the repository is no git checkout (a copied tree)."""
    root = REPO_ROOT.resolve()
    inside = {p: p.resolve().relative_to(root) for p in paths if p.resolve().is_relative_to(root)}
    states = {p: "outside the checkout" for p in paths if p not in inside}
    if not inside:
        return states
    try:
        r = subprocess.run(["git", "status", "--porcelain", "-z", "--untracked-files=all", "--ignored", "--",
                            *map(str, inside.values())], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if r.returncode != 0:
        return {}
    listed = [(e[:2], Path(e[3:])) for e in r.stdout.split("\0") if len(e) > 3]
    for p, rel in inside.items():
        found = {_GIT_STATES.get(code, "modified") for code, f in listed if f == rel or rel in f.parents
                 or (code in _GIT_STATES and f in rel.parents)}  # git names an untracked folder, not its files
        states[p] = next((s for s in ("untracked", "ignored", "modified") if s in found), "committed")
    return states


def run_inputs(recipe_path: str, recipe: dict) -> list[dict[str, Any]]:
    """[{role, path, sha256, files (a folder's count), git}] for each input, read now (at the run's start). A path
    missing here (say, one read on a remote server's machine) gets sha256 None and a note."""
    named = input_paths(recipe_path, recipe)
    states = git_states([p for _, _, p in named if p.exists()])
    out = []
    for role, given, path in named:
        entry: dict[str, Any] = {"role": role, "path": given}
        try:
            entry["sha256"], files = sha256_path(path)
            if files is not None:
                entry["files"] = files
        except OSError as e:
            entry["sha256"], entry["note"] = None, f"not readable here: {e.strerror or e}"
        if path != Path(given):
            entry["file"] = str(path)
        entry["git"] = states.get(path, "unknown")
        out.append(entry)
    return out


# Their content is in the manifest's recorded recipe (presets are merged into it), which a resume runs: a change to
# the files since does not reach the run.
_RECORDED_IN_RECIPE = ("recipe", "preset ")


def changed_inputs(recorded: list[dict[str, Any]]) -> list[str]:
    """What a resume would read differently from the run's start: one line per input (trace, accuracy data,
    emulator profiles) whose file now hashes otherwise or is gone. Inputs that could not be read at the start
    (sha256 None: read on another machine) are not checked."""
    out = []
    for entry in recorded:
        if entry.get("sha256") is None or entry["role"].startswith(_RECORDED_IN_RECIPE):
            continue
        path = Path(entry.get("file") or entry["path"])
        try:
            now = sha256_path(path)[0]
        except OSError:
            now = None
        if now != entry["sha256"]:
            state = "is gone or unreadable" if now is None else f"changed (sha256 {entry['sha256'][:12]}... at the " \
                                                               f"start, {now[:12]}... now)"
            out.append(f"{entry['role']} {path} {state}")
    return out
