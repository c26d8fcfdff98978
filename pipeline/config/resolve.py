"""A recipe's relative input paths, made absolute against the folder of the file that wrote them.

Runs on the raw dict, before validation: a value of the wrong type is left as it is, for the recipe model to
name with its field and the value found.
"""
from __future__ import annotations

import copy
from pathlib import Path

from pipeline.config.emulator import names_a_file

_FLAG_FIELDS = ("config", "model_preset", "hardware")  # the emulator's flags whose value may be a file


def reads_files_here(data: dict) -> bool:
    """Whether the server reads the files its flags name from this machine's file system: the emulator on a
    local or Slurm host (the run dir's shared FS). On an SSH host it reads them there, where a relative path is
    the remote machine's and stays as written (the recipe's flags are not checked here either: recipe.py)."""
    if data.get("engine", "emulator") != "emulator":
        return False  # a real engine's flags are its own to read
    hosts, placement = data.get("hosts"), data.get("placement")
    names = placement.get("hosts", ["local"]) if isinstance(placement, dict) else ["local"]
    if not isinstance(hosts, dict) or not isinstance(names, list):
        return True
    return all(not (isinstance(hosts.get(h), dict) and hosts[h].get("kind") == "ssh")
               for h in names if isinstance(h, str))


def resolve_paths(data: dict, base: Path, server_here: bool | None = None) -> dict:
    """`data` with its input paths absolute, relative to `base` (the folder of the file that wrote them).
    server_here: whether the emulator's file flags are paths on this machine (default: reads_files_here(data);
    a sweep passes what the merged point says)."""
    def resolve(p):
        return str((base / p).resolve()) if isinstance(p, str) and p and not Path(p).is_absolute() else p

    data = copy.deepcopy(data)
    tok = data.get("tokenizer")
    if isinstance(tok, str) and tok and (base / tok).exists():  # else a hub id, left as written
        data["tokenizer"] = resolve(tok)
    load = data.get("load")
    if isinstance(load, dict) and load.get("trace"):
        load["trace"] = resolve(load["trace"])
    acc = data.get("accuracy")
    if isinstance(acc, dict) and isinstance(acc.get("tasks"), list):
        for task in acc["tasks"]:
            for key in ("data", "shots_data"):
                if isinstance(task, dict) and task.get(key):
                    task[key] = resolve(task[key])
    if server_here if server_here is not None else reads_files_here(data):
        server = data.get("server")
        if isinstance(server, dict) and "args" in server:
            server["args"] = _resolve_flags(server["args"], resolve)
        for arm in (data.get("arms") or {}).values() if isinstance(data.get("arms"), dict) else ():
            if isinstance(arm, dict) and arm.get("server_args"):
                arm["server_args"] = _resolve_flags(arm["server_args"], resolve)
    return data


def _resolve_flags(args, resolve):
    """The emulator's file-valued flags in a mapping ({config: x.yaml}) or an argv list (--config x.yaml,
    --config=x.yaml) resolved."""
    if isinstance(args, dict):
        return {k: resolve(v) if k in _FLAG_FIELDS and isinstance(v, str) and names_a_file(k, v) else v
                for k, v in args.items()}
    if not isinstance(args, list):
        return args
    flags = {"--" + f.replace("_", "-"): f for f in _FLAG_FIELDS}
    out = list(args)
    for i, a in enumerate(out):
        if not isinstance(a, str):
            continue
        flag, eq, value = a.partition("=")
        if eq and flag in flags and names_a_file(flags[flag], value):
            out[i] = f"{flag}={resolve(value)}"
        elif a in flags and i + 1 < len(out) and isinstance(out[i + 1], str) and names_a_file(flags[a], out[i + 1]):
            out[i + 1] = resolve(out[i + 1])
    return out
