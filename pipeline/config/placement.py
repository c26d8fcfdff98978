"""The recipe's `hosts:` and `placement:` blocks: the machines, and which arm runs where and when."""
from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config.base import Strict

# Placement owns these; an arm setting them would move it onto other devices.
PLACEMENT_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


# sbatch --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")


class SlurmSpec(Strict):
    """hosts.<name>.slurm: how each arm run is submitted as one Slurm job (sbatch through the Slurm CLI).

    The run dir must lie on a file system the compute nodes share with the controller (as Slurm clusters
    have): the job writes the server log and engine artifacts straight into it."""

    partition: str | None = Field(None, min_length=1, description="sbatch --partition; None: the cluster's default")
    account: str | None = Field(None, min_length=1, description="sbatch --account; None: the user's default")
    time_limit: str = Field("01:00:00", description="sbatch --time of each arm run's job, e.g. 02:00:00 or "
                                                   "1-00:00:00; must cover server start-up, load and accuracy")
    constraint: str | None = Field(None, min_length=1, description="sbatch --constraint: pins the node type so "
                                                                   "both arms run on the same GPUs, e.g. mi355x")
    gres: str = Field("gpu", pattern=r"^[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)?$",
                      description="GPU gres name (and type), e.g. gpu or gpu:h200; the count is "
                                  "placement.gpus_per_arm")
    cpus_per_task: int | None = Field(None, ge=1, le=1024, description="sbatch --cpus-per-task")
    load: Literal["controller", "allocation"] = Field(
        "controller", description="where aiperf runs: controller (this machine, reaching the node over the "
                                  "network) or allocation (a job step of the arm's job, beside the server)")
    python: str | None = Field(None, min_length=1, description="the server's interpreter on the nodes; None: "
                                                             "the controller's own (a venv on the shared FS)")
    queue_timeout_s: float = Field(3600.0, gt=0, description="how long a job may stay pending before the "
                                                             "server stage fails (the job is then cancelled)")
    extra_args: list[str] = Field(default_factory=list, description="more sbatch options, e.g. ['--qos=high']")

    @field_validator("time_limit")
    @classmethod
    def _time_form(cls, v: str) -> str:
        if not _SLURM_TIME.match(v):
            raise ValueError(f"{v!r} is not a Slurm time; allowed forms: MM, MM:SS, HH:MM:SS, D-HH, "
                             f"D-HH:MM, D-HH:MM:SS (e.g. 02:00:00 for two hours)")
        return v

    @field_validator("extra_args")
    @classmethod
    def _no_owned_options(cls, v: list[str]) -> list[str]:
        owned = ("--gres", "--gpus", "--partition", "--account", "--time", "--constraint", "--output",
                 "--job-name", "-p", "-A", "-t", "-C", "-o", "-J")
        for a in v:
            if a.split("=")[0] in owned:
                raise ValueError(f"{a!r} sets an option the slurm block owns; use its own field "
                                 f"(partition, account, time_limit, constraint, gres, placement.gpus_per_arm)")
        return v


class HostSpec(Strict):
    kind: Literal["local", "ssh", "slurm"] = Field(
        "local", description="local: this machine; ssh: reached with fabric; slurm: each arm run is a Slurm "
                             "job submitted from this machine (settings under `slurm`)")
    slurm: SlurmSpec | None = Field(None, description="kind slurm: partition, account, gres, time limit, "
                                                      "constraint, where the load runs")
    address: str | None = Field(None, description="SSH address (name or IP); required for kind ssh")
    user: str | None = Field(None, description="SSH user; default: the current user")
    port: int = Field(22, ge=1, le=65535, description="SSH port")
    key: str | None = Field(None, description="SSH private key file; default: the agent / ~/.ssh")
    gpus: list[int] = Field(default_factory=list, description="GPU ids on this host the run may use (not for "
                                                              "slurm: the job gets its GPUs from Slurm)")
    workdir: str = Field("/tmp/pipeline", description="remote folder for logs and artifacts (ssh hosts)")
    python: str = Field("python3", description="ssh hosts: the interpreter that has the engine installed "
                                               "(e.g. a venv's bin/python)")

    @field_validator("key")
    @classmethod
    def _home(cls, v: str | None) -> str | None:
        return os.path.expanduser(v) if v else v  # `~/.ssh/id_ed25519`, as ssh takes it; paramiko would not

    @field_validator("gpus")
    @classmethod
    def _distinct_ids(cls, v: list[int]) -> list[int]:
        # a repeated id would give two arms (or one arm twice) the same device; a negative one is no device
        bad = [g for g in v if g < 0]
        if bad:
            raise ValueError(f"GPU id {bad[0]} is negative; GPU ids are distinct integers >= 0, as "
                             f"nvidia-smi / rocm-smi number them: e.g. gpus: [0, 1]")
        twice = sorted({g for g in v if v.count(g) > 1})
        if twice:
            raise ValueError(f"GPU id {twice[0]} is listed more than once; GPU ids are distinct integers >= 0: "
                             f"list each GPU once, e.g. gpus: {sorted(set(v))}")
        return v

    @model_validator(mode="after")
    def _ssh_needs_address(self):
        if self.kind == "ssh" and not self.address:
            raise ValueError("kind ssh needs `address` (host name or IP)")
        if self.kind == "ssh" and self.key and not os.path.isfile(self.key):  # the SSH client here reads it
            raise ValueError(f"key: no such file {self.key!r} on this machine; allowed: a private key file here, or "
                             f"leave key out for the SSH agent and ~/.ssh")
        if self.kind == "slurm" and self.slurm is None:
            raise ValueError("kind slurm needs a `slurm:` block (at least `slurm: {}` for the cluster's "
                             "defaults; e.g. slurm: {partition: gpu, time_limit: '02:00:00'})")
        if self.kind != "slurm" and self.slurm is not None:
            raise ValueError(f"slurm: set on a host of kind {self.kind!r}; set kind: slurm or remove the block")
        if self.kind == "slurm" and self.gpus:
            raise ValueError(f"gpus: {self.gpus} on a slurm host; Slurm assigns each job its GPUs "
                             f"(placement.gpus_per_arm sets how many): remove gpus")
        return self


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


def check_placement(p: PlacementSpec, hosts: dict[str, HostSpec]) -> None:
    """Cross-block rules: placement names defined hosts, and those hosts have the GPUs it asks for."""
    for i, h in enumerate(p.hosts):
        if h not in hosts:
            raise ValueError(f"placement.hosts[{i}]: unknown host {h!r}; defined hosts: {sorted(hosts)}")
    twice = sorted({h for h in p.hosts if p.hosts.count(h) > 1})
    if twice:
        raise ValueError(f"placement.hosts: {p.hosts} names host {twice[0]!r} more than once; to run both arms "
                         f"on one host name it once (hosts: [{twice[0]}]): concurrent arms there get disjoint "
                         f"GPUs and ports")
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
        if hosts[h].kind == "slurm":  # each job asks Slurm for gpus_per_arm GPUs of its own
            continue
        have = hosts[h].gpus
        if need > len(have):
            raise ValueError(f"hosts.{h}.gpus: {have} has {len(have)} GPU(s); placement needs {need} "
                             f"({p.mode}, gpus_per_arm={p.gpus_per_arm})")
