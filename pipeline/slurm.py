"""A `Host` whose servers run as Slurm jobs: each arm run is one `sbatch` job, driven by the Slurm CLI.

Nothing here schedules anything: sbatch submits, `scontrol show job` (falling back to `sacct` once the
controller has forgotten the job) reports its state, scancel stops it. The job script records where it
landed (node, CUDA_VISIBLE_DEVICES, SLURM_JOB_GPUS, GPU uuids) and then execs the server, so the server
is the job. Run dirs are on a file system the nodes share with the controller, so `get`/`put` are copies.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

from pipeline.config.placement import SlurmSpec
from pipeline.hosts import CommandResult, HostError, LocalHost
from pipeline.paths import SlurmJobPaths

# Job states after which the job no longer runs (squeue/scontrol/sacct spell them the same).
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
WAITING = {"PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED"}
# A job on its way out: its processes are being killed or its epilog runs; how it ended is known seconds later.
SETTLING = {"COMPLETING", "SIGNALING", "STAGE_OUT"}

# Written by the job before it execs the server: JSON of where it runs (python3 is on every node that
# can run an engine; nvidia-smi only where there are NVIDIA GPUs).
_FACTS = r'''python3 - "$1" <<'PY'
import json, os, subprocess, sys
keys = ("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_JOB_NODELIST", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS",
        "ROCR_VISIBLE_DEVICES", "SLURM_JOB_PARTITION")
facts = {k: os.environ.get(k) for k in keys}
try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20).stdout
    facts["gpus"] = [dict(zip(("index", "uuid", "name"), (v.strip() for v in l.split(","))))
                     for l in out.strip().splitlines()]
except (OSError, subprocess.SubprocessError):
    facts["gpus"] = []
json.dump(facts, open(sys.argv[1] + ".tmp", "w")); os.replace(sys.argv[1] + ".tmp", sys.argv[1])
PY'''


def job_script(argv: Sequence[str], env: Mapping[str, str], log: str, facts: Path) -> str:
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in env.items())
    return (f"#!/bin/bash\nset -e\nfacts() {{\n{_FACTS}\n}}\nfacts {shlex.quote(str(facts))}\n{exports}\n"
            f"exec {shlex.join(list(argv))} >>{shlex.quote(log)} 2>&1 </dev/null\n")


def sbatch_argv(spec: SlurmSpec, *, gpus: int, name: str, output: Path, script: Path) -> list[str]:
    argv = ["sbatch", "--parsable", f"--job-name={name}", f"--output={output}", f"--time={spec.time_limit}",
            "--nodes=1", "--ntasks=1"]
    for flag, value in (("--partition", spec.partition), ("--account", spec.account),
                        ("--constraint", spec.constraint), ("--cpus-per-task", spec.cpus_per_task)):
        if value is not None:
            argv.append(f"{flag}={value}")
    if gpus:
        argv.append(f"--gres={spec.gres}:{gpus}")
    return argv + list(spec.extra_args) + [str(script)]


def _cli(argv: list[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise HostError(f"slurm: `{argv[0]}` not found on this machine; a slurm host submits from here, so "
                        f"run the pipeline on a login node with the Slurm client installed") from None


def job_state(job_id: str) -> tuple[str, dict]:
    """(state, fields) of a job: scontrol while the controller holds it, else sacct's record."""
    r = _cli(["scontrol", "show", "job", "-o", job_id])
    if r.returncode == 0 and "JobState=" in r.stdout:
        fields = dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)
        return fields["JobState"], fields
    r = _cli(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode,NodeList,Reason"])
    if r.returncode == 0 and r.stdout.strip():
        state, code, nodes, reason = (r.stdout.strip().splitlines()[0].split("|") + [""] * 4)[:4]
        return state.split()[0], {"ExitCode": code, "NodeList": nodes, "Reason": reason}
    return "UNKNOWN", {}


class SlurmJob:
    """The `Process` of one arm run: the Slurm job that runs its server."""

    def __init__(self, job_id: str, files: SlurmJobPaths, log: str):
        self.job_id, self._files, self._log = job_id, files, log
        self.pid = None            # no local pid: _kill_leftover must not touch anything
        self.facts: dict = {}
        self.state, self._fields = "PENDING", {}

    @property
    def node(self) -> str | None:
        return self.facts.get("SLURMD_NODENAME")

    def refresh(self) -> str:
        self.state, self._fields = job_state(self.job_id)
        if not self.facts and self._files.facts.is_file():
            self.facts = {"job_id": self.job_id, **json.loads(self._files.facts.read_text())}
        return self.state

    def poll(self) -> int | None:
        if self.refresh() not in ENDED:
            return None
        code = self._fields.get("ExitCode", "1:0").split(":")[0]
        return int(code) if code.isdigit() and int(code) else 1 if self.state != "COMPLETED" else 0

    def describe(self, settle_s: float = 20.0) -> str:
        """The job's state for an error message: id, state, reason, node, exit code, Slurm's own output.

        A job still COMPLETING is given settle_s to reach its final state (CANCELLED, FAILED, ...), which
        is what the message must name."""
        deadline = time.monotonic() + settle_s
        while self.refresh() in SETTLING and time.monotonic() < deadline:
            time.sleep(0.5)
        f = self._fields
        out = LocalHost().read_tail(str(self._files.output), 10)
        return (f"slurm job {self.job_id} {self.state} (reason {f.get('Reason', '?')}, exit "
                f"{f.get('ExitCode', '?')}, node {f.get('NodeList', '?')})"
                + (f"; {self._files.output}:\n{out}" if out.strip() else ""))

    def stop(self, grace_s: float = 10.0) -> int | None:
        """scancel: SIGTERM to the server first (Slurm sends SIGKILL after the cluster's KillWait)."""
        if self.refresh() not in ENDED:
            _cli(["scancel", "--full", "--signal=TERM", self.job_id])
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and self.refresh() not in ENDED:
                time.sleep(0.5)
            if self.state not in ENDED:
                _cli(["scancel", self.job_id])
        return 0

    def client_prefix(self) -> list[str]:
        """argv prefix that runs a client as a step of this job, beside the server (load: allocation)."""
        return ["srun", f"--jobid={self.job_id}", "--overlap", "--ntasks=1", "--nodes=1", "--gres=none"]


class SlurmHost:
    """Submits arm runs as jobs from this machine; short commands (`run`) run here, on the controller."""

    kind = "slurm"  # its servers run where the scheduler puts them, not on a machine known in advance

    def __init__(self, name: str, spec: SlurmSpec, gpus_per_job: int, progress=print):
        self.name, self.spec, self.gpus_per_job = name, spec, gpus_per_job
        self._local = LocalHost()
        self._progress = progress
        self.jobs: dict[str, SlurmJob] = {}   # by server log path: read_tail names the job's state

    def run(self, argv, *, env=None, timeout=None) -> CommandResult:
        return self._local.run(argv, env=env, timeout=timeout)

    def put(self, local, remote) -> None:
        self._local.put(local, remote)

    def get(self, remote, local) -> None:
        self._local.get(remote, local)

    def read_tail(self, path, lines=40) -> str:
        job = self.jobs.get(str(path))
        head = job.describe() + "\n" if job else ""
        return head + self._local.read_tail(path, lines)

    def start(self, argv, *, env, log) -> SlurmJob:
        """sbatch the server, then wait until the job runs and has written its facts (or has ended)."""
        files = SlurmJobPaths(Path(log).parent)
        files.root.mkdir(parents=True, exist_ok=True)
        for stale in (files.facts, files.output):  # a resumed arm run must not read the last job's
            stale.unlink(missing_ok=True)
        files.script.write_text(job_script(argv, env, log, files.facts))
        os.chmod(files.script, 0o755)
        cmd = sbatch_argv(self.spec, gpus=self.gpus_per_job, name=f"vattn-{files.root.name}",
                          output=files.output, script=files.script)
        r = _cli(cmd)
        job_id = r.stdout.strip().split(";")[0]
        if r.returncode != 0 or not job_id.isdigit():
            raise HostError(f"hosts.{self.name}.slurm: sbatch refused the job: {r.stderr.strip()} "
                            f"(command: {shlex.join(cmd)}); check partition/account/gres/constraint")
        files.job_id.write_text(job_id)
        job = SlurmJob(job_id, files, log)
        self.jobs[str(log)] = job
        self._progress(f"slurm job {job_id} submitted")
        try:
            self._wait_running(job)
        except BaseException:
            job.stop(grace_s=2)
            raise
        return job

    def cancel_leftover(self, artifact_dir: str) -> str | None:
        """Cancel the job an earlier, hard-killed pipeline left running for this arm run; its id or None."""
        files = SlurmJobPaths(Path(artifact_dir))
        if not files.job_id.is_file():
            return None
        job = SlurmJob(files.job_id.read_text().strip(), files, "")
        if job.refresh() in ENDED or job.state == "UNKNOWN":
            return None
        job.stop(grace_s=5)
        return job.job_id

    def _wait_running(self, job: SlurmJob) -> None:
        t0 = time.monotonic()
        while True:
            state = job.refresh()
            if state in ENDED or (state not in WAITING and job.facts):
                return  # an ended job is reported by the caller's poll(), with its state and log
            if time.monotonic() - t0 > self.spec.queue_timeout_s:
                raise HostError(f"hosts.{self.name}.slurm.queue_timeout_s: job {job.job_id} still {state} "
                                f"after {self.spec.queue_timeout_s:.0f}s ({job.describe()}); it was cancelled. "
                                f"Raise queue_timeout_s or pick a less busy partition")
            time.sleep(0.5)
