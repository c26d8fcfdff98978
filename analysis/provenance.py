"""The report's provenance block, from manifest.json. Every key is optional: missing -> "unknown"."""
from __future__ import annotations

import json
import shlex
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.paths import RunPaths

UNKNOWN = "unknown"


def _get(d: Any, *path: str, default: Any = UNKNOWN) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d or d[p] in (None, "", [], {}):
            return default
        d = d[p]
    return d


def find_keys(d: Any, words: tuple[str, ...], prefix: str = "") -> dict[str, Any]:
    """Scalar leaves of a nested dict whose key contains one of `words` (e.g. seeds, trace paths)."""
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            name = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, (dict, list)):
                out.update(find_keys(v, words, name))
            elif any(w in str(k).lower() for w in words):
                out[name] = v
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out.update(find_keys(v, words, f"{prefix}.{i}"))  # as validation errors name fields: tasks.0.seed
    return out


def _parse_time(s: Any) -> datetime | None:
    if isinstance(s, (int, float)):
        return datetime.fromtimestamp(float(s))
    try:
        return datetime.fromisoformat(str(s).replace("Z", "+00:00"))
    except ValueError:
        return None


def duration(started: Any, finished: Any) -> str:
    a, b = _parse_time(started), _parse_time(finished)
    if a is None or b is None:
        return UNKNOWN
    try:
        return f"{(b - a).total_seconds():.1f} s"
    except TypeError:  # one aware, one naive
        return UNKNOWN


def _stage_times(manifest: dict) -> list[datetime]:
    stages = _get(manifest, "stages", default={})
    times = [_parse_time(info.get(k)) for per in (stages.values() if isinstance(stages, dict) else [])
             if isinstance(per, dict) for info in per.values() if isinstance(info, dict)
             for k in ("started", "finished")]
    return [t for t in times if t is not None]


def wall_time(manifest: dict) -> str:
    """The time the run's invocations spent working: the sum of each `pipeline run` or `--resume` span, so an
    interrupted run's idle time before its resume does not count. A span killed before it recorded its end ends
    at the last stage time recorded within it. Manifests from before spans were recorded: started to finished."""
    spans = _get(manifest, "invocations", default=[])
    if not isinstance(spans, list) or not spans:
        return duration(_get(manifest, "started", default=_get(manifest, "created")), _get(manifest, "finished"))
    starts = [_parse_time(s.get("started")) if isinstance(s, dict) else None for s in spans]
    if any(t is None for t in starts):
        return UNKNOWN
    stage_times = _stage_times(manifest)
    total, killed = 0.0, 0
    for i, (span, start) in enumerate(zip(spans, starts)):
        end = _parse_time(span.get("finished"))
        if end is None:
            until = starts[i + 1] if i + 1 < len(starts) else None
            within = [t for t in stage_times if t >= start and (until is None or t < until)]
            end, killed = max(within, default=start), killed + 1
        try:
            total += (end - start).total_seconds()
        except TypeError:  # one aware, one naive
            return UNKNOWN
    parts = [f"{total:.1f} s"]
    if len(spans) > 1:
        parts.append(f"over {len(spans)} invocations, the gaps between them not counted")
    if killed:
        parts.append(f"{killed} ended without recording its end: counted to its last stage time")
    return parts[0] + (f" ({'; '.join(parts[1:])})" if len(parts) > 1 else "")


def stage_rows(manifest: dict) -> list[tuple[str, str, str, str]]:
    """(arm_run, stage, status, duration) for each stage the manifest records."""
    rows = []
    stages = _get(manifest, "stages", default={})
    for arm_run, per in (stages.items() if isinstance(stages, dict) else []):
        for stage, info in (per.items() if isinstance(per, dict) else []):
            info = info if isinstance(info, dict) else {}
            rows.append((arm_run, stage, str(info.get("status", UNKNOWN)),
                         duration(info.get("started"), info.get("finished"))))
    return rows


def _inline(v: Any) -> str:
    return v if isinstance(v, str) else f"`{json.dumps(v, default=str)}`"


def _code(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, indent=1, default=str)
    return "```\n" + text + "\n```"


def commands(manifest: dict, root: Path | None) -> dict[str, Any]:
    """Server command per arm run (plan.arm_runs argv, with its env) and aiperf command (load_result.json)."""
    out: dict[str, Any] = {}
    plan = _get(manifest, "plan", default={})
    if isinstance(_get(plan, "commands", default=None), dict):
        out.update(plan["commands"])
    for a in _get(plan, "arm_runs", default=[]) if isinstance(_get(plan, "arm_runs", default=[]), list) else []:
        if isinstance(a, dict) and a.get("argv"):
            env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in (a.get("env") or {}).items())
            out[f"{a.get('name')} server"] = (env + " " if env else "") + shlex.join(map(str, a["argv"]))
    if root is not None:
        paths = RunPaths(root)
        for name in paths.arm_runs():
            res = paths.arm(name).stage_result("load")
            try:
                cmd = json.loads(res.read_text()).get("command")
            except (OSError, ValueError, AttributeError):
                continue
            if cmd:
                out[f"{name} load"] = shlex.join(map(str, cmd)) if isinstance(cmd, list) else str(cmd)
    return out


def provenance_md(manifest: dict, root: Path | None = None) -> list[str]:
    """Markdown lines for the provenance section; `root` (the run dir) adds the recorded aiperf commands."""
    recipe = _get(manifest, "recipe", default={})
    plan = _get(manifest, "plan", default={})
    started = _get(manifest, "started", default=_get(manifest, "created"))
    lines = [
        f"- git sha: `{_get(manifest, 'git_sha')}`" + _dirty_note(manifest),
        f"- engine: {_get(recipe, 'engine', default=_get(manifest, 'engine'))}",
        f"- started: {started}; finished: {_get(manifest, 'finished')}; "
        f"wall time: {wall_time(manifest)}",
        f"- placement: {_get(plan, 'mode', default=_get(recipe, 'placement', 'mode'))}; "
        f"order: {_get(plan, 'order', default=_get(recipe, 'placement', 'order'))}; "
        f"repeats: {_get(recipe, 'placement', 'repeats')}",
    ]
    lines += input_lines(manifest)
    lines += gpu_lines(manifest)
    traces = find_keys(recipe, ("trace", "dataset", "input_file"))
    seeds = find_keys(manifest, ("seed",))
    lines.append("- trace: " + (", ".join(f"`{k}` = {v}" for k, v in traces.items()) or UNKNOWN))
    lines.append("- seeds: " + (", ".join(f"`{k}` = {v}" for k, v in seeds.items()) or UNKNOWN))
    versions = _get(manifest, "versions")
    lines += ["", "Versions:", _code(versions) if versions != UNKNOWN else UNKNOWN]
    env_diff = _get(manifest, "env_diff")
    lines += ["", "Env diff between arms (the only intended difference):",
              _code(env_diff) if env_diff != UNKNOWN else UNKNOWN]
    cmds = commands(manifest, root)
    lines += ["", "Commands:", "\n".join(f"- {k}: `{v}`" for k, v in cmds.items()) if cmds else UNKNOWN]
    rows = stage_rows(manifest)
    if rows:
        lines += ["", "| arm run | stage | status | duration |", "|---|---|---|---|"]
        lines += [f"| {a} | {s} | {st} | {d} |" for a, s, st, d in rows]
    else:
        lines += ["", "Stage durations: unknown"]
    return lines + superseded_lines(manifest)


def _dirty_note(manifest: dict) -> str:
    sha = str(manifest.get("git_sha") or "unknown")
    if sha == "unknown":
        return ""
    if not sha.endswith("-dirty"):
        return " (no changes to tracked files)"
    if isinstance(manifest.get("inputs"), list):
        return (" (-dirty: changed tracked files; whether the commit holds the files this run read is each "
                "input's git state below)")
    return " (-dirty: changed tracked files; this manifest predates the check of the run's inputs)"


def input_lines(manifest: dict) -> list[str]:
    """The files the run read (pipeline/inputs.py), each with its short sha256, path and git state, then those the
    commit does not hold. A manifest from before inputs were recorded gives its recipe path alone."""
    inputs = manifest.get("inputs")
    if not isinstance(inputs, list):
        return [f"- recipe: {_get(manifest, 'recipe_path')} (input hashes not recorded: a run from before they were)"]
    lines = ["- inputs, hashed at the run's start and unchanged at each resume (sha256, first 12 hex digits; git "
             "state):"]
    loose = []
    for e in (e for e in inputs if isinstance(e, dict)):
        digest = f"`{e['sha256'][:12]}`" if e.get("sha256") else f"no hash ({e.get('note', UNKNOWN)})"
        where = f" = {e['file']}" if e.get("file") else ""
        count = f"{e['files']} files; " if e.get("files") is not None else ""
        lines.append(f"  - {e.get('role', UNKNOWN)}: {digest} {e.get('path', UNKNOWN)}{where} "
                     f"({count}{e.get('git', UNKNOWN)})")
        if e.get("git") in ("untracked", "ignored", "modified"):
            loose.append(f"{e.get('role')} ({e.get('git')})")
    lines.append("- inputs the commit does not hold: " + (
        "; ".join(loose) + " -- the git sha alone does not reproduce this run; their hashes above pin them"
        if loose else "none (of the files this run read; files outside the checkout are pinned by hash only)"))
    return lines


def superseded_lines(manifest: dict) -> list[str]:
    """What a resume set aside and reran (the runner's manifest "superseded" list); the tables above
    hold only the attempts that count."""
    entries = [e for e in manifest.get("superseded") or [] if isinstance(e, dict)]
    if not entries:
        return []
    lines = ["", "Set aside on resume (kept, not analysed):"]
    for e in entries:
        where = RunPaths(Path(".")).superseded_arm(str(e.get("arm_run")), int(e.get("attempt") or 0)).as_posix()
        lines.append(f"- {e.get('arm_run')} attempt {e.get('attempt')} (`{where}`, at {e.get('at', UNKNOWN)}): "
                     f"{e.get('reason', UNKNOWN)}")
    return lines


def gpu_lines(manifest: dict) -> list[str]:
    """One line per host's GPUs (name, clocks, memory) and one per arm run saying which GPUs it used."""
    hosts = manifest.get("hosts") or {}
    lines = []
    for name, facts in hosts.items():
        gpus = (facts or {}).get("gpus") or []
        desc = "; ".join(f"{g.get('index')}: {g.get('name')} (SM {g.get('clocks.sm')} of max {g.get('clocks.max.sm')}, "
                         f"mem clock {g.get('clocks.mem')}, {g.get('memory.total')}, uuid {g.get('uuid')})"
                         for g in gpus) or "none reported (no nvidia-smi)"
        lines.append(f"- host `{name}` ({_where(facts, _get(manifest, 'recipe', 'hosts', name, default={}))}) "
                     f"GPUs: {desc}" + _machine((facts or {}).get("machine"), "; machine: "))
    controller = manifest.get("controller")
    if isinstance(controller, dict) and controller and not any(
            (f or {}).get("machine", {}).get("hostname") == controller.get("hostname") for f in hosts.values()):
        lines.append("- controller (runs aiperf)" + _machine(controller, ": "))
    stages = manifest.get("stages") or {}
    pairing = [f"{a.get('name')} on {a.get('host')} " + _arm_gpus(a, _get(stages, a.get("name"), "server", "slurm_job",
                                                                          default=None))
               + f" port {a.get('port')}" + _load_at_start(_get(stages, a.get("name"), "server", default={}))
               for a in manifest.get("arm_runs") or []]
    if pairing:
        lines.append("- arm runs: " + "; ".join(pairing))
    return lines or [f"- GPUs: {UNKNOWN}"]


def _machine(m: Any, lead: str) -> str:
    """`lead` + hostname, CPU model and count; "" for a manifest from before machines were recorded."""
    if not isinstance(m, dict) or not m:
        return ""
    return f"{lead}{m.get('hostname') or UNKNOWN}, CPU {m.get('cpu_model') or UNKNOWN} x {m.get('cpus') or UNKNOWN}"


def _load_at_start(server: Any) -> str:
    """The 1-minute load average(s) the runner recorded as the arm run started; "" where none was."""
    if not isinstance(server, dict):
        return ""
    parts = [f"{what} {server[k]}" for k, what in (("load_1m", "host"), ("controller_load_1m", "controller"))
             if isinstance(server.get(k), (int, float))]
    return f" (1-min load at start: {', '.join(parts)})" if parts else ""



def _where(facts: dict | None, spec: Any) -> str:
    """A host's kind, and for SSH the account it was reached at (the recipe's), so a reader can find the box."""
    kind = (facts or {}).get("kind", UNKNOWN)
    if kind != "ssh" or not isinstance(spec, dict) or not spec.get("address"):
        return kind
    user = f"{spec['user']}@" if spec.get("user") else ""
    return f"ssh {user}{spec['address']}:{spec.get('port', 22)}"


def _arm_gpus(arm_run: dict, job: Any) -> str:
    """The GPUs an arm run used: the plan's, or for a Slurm arm run the job's node and devices, known only once it
    started."""
    if not isinstance(job, dict):
        return f"GPUs {list(arm_run.get('gpus') or []) or 'none'}"
    node = job.get("SLURMD_NODENAME") or job.get("SLURM_JOB_NODELIST") or UNKNOWN
    return f"Slurm job {job.get('job_id', UNKNOWN)} on {node} GPUs {job.get('CUDA_VISIBLE_DEVICES') or 'none'}"


# What must match for two runs' arms to be compared as a kernel change: the traffic and the engine around it.
# The arms' own env (the kernel switch) and the code's version are what such a comparison is for, so not here.
_COMPARED_FIELDS = ("engine", "model", "tokenizer", "load", "server.args", "server.env", "placement.gpus_per_arm")


def _flat(d: Any, prefix: str) -> dict[str, Any]:
    if isinstance(d, dict):
        return {k: v for key, val in d.items() for k, v in _flat(val, f"{prefix}.{key}").items()}
    return {prefix: d}


def run_differences(a: dict, b: dict) -> list[str]:
    """`field: A / B` for each recipe field of _COMPARED_FIELDS that differs between two runs' manifests."""
    def fields(m: dict) -> dict[str, Any]:
        recipe = m.get("recipe") if isinstance(m.get("recipe"), dict) else {}
        return {k: v for name in _COMPARED_FIELDS
                for k, v in _flat(_get(recipe, *name.split("."), default=None), name).items()}

    fa, fb = fields(a), fields(b)
    return [f"{k}: {_inline(fa.get(k))} / {_inline(fb.get(k))}" for k in sorted(set(fa) | set(fb))
            if fa.get(k) != fb.get(k)]
