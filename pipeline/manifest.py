"""manifest.json: what was run (recipe, plan, versions, machines) and how far it got (stage status).

Every update rewrites the file atomically under a lock, so concurrent arms never interleave writes and a
crash leaves the last complete state: `--resume` trusts a stage only when its status is "done".
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
import threading
from datetime import datetime, timezone
from pathlib import Path

from pipeline.hosts import Host, HostError
from pipeline.inputs import run_inputs
from pipeline.io import read_json, write_json_atomic, write_json_exclusive
from pipeline.paths import REPO_ROOT

PACKAGES = ("vattn-pipeline", "aiperf", "torch", "triton", "sglang", "vllm", "pydantic", "pandas", "numpy",
            "matplotlib")


def now() -> str:
    """UTC, to the millisecond: stage durations are differences of these, and a server starts in under a second."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def new_run_id(run_dir: Path, created: str) -> str:
    """A short id unique per run: the absolute local run dir and its creation time, hashed. Remote hosts key
    their artifact folders by it (pipeline/paths.py remote_arm_dir), so two runs whose dirs share a
    basename never share a remote folder; the manifest keeps it, so a resume finds the same one."""
    return hashlib.sha256(f"{Path(run_dir).resolve()}|{created}".encode()).hexdigest()[:10]


def package_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def git_sha() -> str:
    """The checkout's commit (with -dirty for uncommitted changes to tracked files; whether the files the run read
    are committed is each input's own "git" state, pipeline/inputs.py). PIPELINE_GIT_SHA, where set,
    wins: a tree copied to a GPU host may carry no git metadata, or a stale copy of it."""
    if os.environ.get("PIPELINE_GIT_SHA"):
        return os.environ["PIPELINE_GIT_SHA"]
    try:
        head = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, timeout=5)
        if head.returncode != 0:  # not a git checkout
            return "unknown"
        sha = head.stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (sha + ("-dirty" if dirty else "")) or "unknown"


def gpu_facts(host: Host) -> list[dict]:
    """GPUs the host reports (name, clocks, memory), or [] where nvidia-smi is absent or fails. A host that
    cannot be reached raises its HostError: "no GPUs" would hide it, and a new run would claim its dir first."""
    fields = "index,name,uuid,clocks.sm,clocks.max.sm,clocks.mem,memory.total,driver_version"
    try:
        r = host.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], timeout=20)
    except HostError:
        raise
    except Exception:  # missing binary locally raises (OSError); a hung one times out; remotely: a non-zero exit
        return []
    if r.returncode != 0:
        return []
    keys = fields.split(",")
    return [dict(zip(keys, (v.strip() for v in line.split(",")))) for line in r.stdout.strip().splitlines()]


# hostname, online CPUs, CPU model (x86 and most Arm kernels name it "model name"), in one round trip
_MACHINE_SH = "hostname; getconf _NPROCESSORS_ONLN; grep -m1 -i '^model name' /proc/cpuinfo | cut -d: -f2-"


def machine_facts(host: Host) -> dict:
    """{hostname, cpus, cpu_model} of the machine a host runs commands on ({} where it cannot tell): the emulator's
    timings are sleeps computed on that CPU, and aiperf's on the controller's."""
    try:
        r = host.run(["sh", "-c", _MACHINE_SH], timeout=20)
    except HostError:
        raise
    except Exception:  # no sh, a hung command
        return {}
    if r.returncode != 0:
        return {}
    lines = [line.strip() for line in r.stdout.splitlines()] + ["", "", ""]
    return {"hostname": lines[0] or None, "cpus": int(lines[1]) if lines[1].isdigit() else None,
            "cpu_model": lines[2] or None}


def load_average(host: Host) -> float | None:
    """The host's 1-minute load average now, None where it cannot tell (a machine busy with something else
    slows the emulator's steps and aiperf alike)."""
    try:
        if host.kind == "local":
            return round(os.getloadavg()[0], 2)
        r = host.run(["cat", "/proc/loadavg"], timeout=20)
        return round(float(r.stdout.split()[0]), 2) if r.returncode == 0 else None
    except Exception:  # informational: an unreachable host fails the stage that needs it, not this
        return None


class Manifest:
    def __init__(self, path: Path, data: dict):
        self.path, self.data = Path(path), data
        self._lock = threading.Lock()

    @classmethod
    def create(cls, path: Path, *, recipe: dict, recipe_path: str, plan: dict, hosts: dict, run_id: str,
               created: str, controller: dict | None = None) -> "Manifest":
        """Write a new run's manifest; FileExistsError if the run dir already has one. This write claims
        the run dir: of two runs started at once on one path, only the first to link its manifest goes on."""
        data = {"recipe_path": recipe_path, "recipe": recipe, "plan": plan, "env_diff": plan["env_diff"],
                "arm_runs": [{k: a[k] for k in ("name", "arm", "round", "group", "host", "gpus", "port")}
                             for a in plan["arm_runs"]],
                "inputs": run_inputs(recipe_path, recipe),
                "versions": package_versions(), "git_sha": git_sha(), "hosts": hosts, "controller": controller or {},
                "run_id": run_id,
                "created": created, "finished": None, "stages": {}, "invocations": []}
        write_json_exclusive(path, data)
        return cls(path, data)

    @classmethod
    def load(cls, path: Path) -> "Manifest":
        return cls(path, read_json(path))

    def save(self) -> None:
        write_json_atomic(self.path, self.data)

    def stage(self, arm_run: str, stage: str) -> dict:
        return self.data["stages"].get(arm_run, {}).get(stage, {})

    def is_done(self, arm_run: str, stage: str) -> bool:
        return self.stage(arm_run, stage).get("status") == "done"

    def mark(self, arm_run: str, stage: str, status: str, **extra) -> None:
        with self._lock:
            entry = self.data["stages"].setdefault(arm_run, {}).setdefault(stage, {})
            entry["status"] = status
            if status != "failed":  # an earlier attempt's error (say, an interrupt) would blame a stage that ran again
                entry.pop("error", None)
            if status == "running":  # and its end time would precede this attempt's start
                entry.pop("finished", None)
            entry["started" if status == "running" else "finished"] = now()
            entry.update(extra)
            self.save()

    def note(self, arm_run: str, stage: str, **extra) -> None:
        """Add facts to a stage's entry without touching its status or times (e.g. after the server stops)."""
        with self._lock:
            self.data["stages"].setdefault(arm_run, {}).setdefault(stage, {}).update(extra)
            self.save()

    def next_attempt(self, arm_run: str) -> int:
        """1 + how many times this arm run was set aside already."""
        return 1 + sum(1 for e in self.data.get("superseded", []) if e["arm_run"] == arm_run)

    def supersede(self, arm_run: str, attempt: int, **why) -> None:
        """Set aside an arm run's stage entries (kept under "superseded") so that all its stages run again."""
        with self._lock:
            self.data.setdefault("superseded", []).append(
                {"arm_run": arm_run, "attempt": attempt, "at": now(), **why,
                 "stages": self.data["stages"].pop(arm_run, {})})
            self.save()

    def open_invocation(self) -> dict | None:
        """Record that a `pipeline run` (new or --resume) starts working on this run dir; close it with
        close_invocation. The report's wall time sums these spans, so the idle time between an interrupt and its
        resume does not count. A manifest written before spans were kept gets none: its spans would miss the
        first run's."""
        if "invocations" not in self.data:
            return None
        with self._lock:
            span = {"started": now(), "finished": None}
            self.data["invocations"].append(span)
            self.save()
            return span

    def close_invocation(self, span: dict | None) -> None:
        if span is None:
            return
        with self._lock:
            span["finished"] = now()
            self.save()

    def set(self, key: str, value) -> None:
        with self._lock:
            self.data[key] = value
            self.save()
