"""The recipe's `hosts:` and `placement:` blocks: the machines, and which arm runs where and when."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.config.base import Strict

# Placement owns these; an arm setting them would move it onto other devices.
PLACEMENT_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


class HostSpec(Strict):
    kind: Literal["local", "ssh"] = Field("local", description="local: this machine; ssh: reached with fabric")
    address: str | None = Field(None, description="SSH address (name or IP); required for kind ssh")
    user: str | None = Field(None, description="SSH user; default: the current user")
    port: int = Field(22, ge=1, le=65535, description="SSH port")
    key: str | None = Field(None, description="SSH private key file; default: the agent / ~/.ssh")
    gpus: list[int] = Field(default_factory=list, description="GPU ids on this host the run may use")
    workdir: str = Field("/tmp/pipeline", description="remote folder for logs and artifacts (ssh hosts)")
    python: str = Field("python3", description="ssh hosts: the interpreter that has the engine installed "
                                               "(e.g. a venv's bin/python)")

    @model_validator(mode="after")
    def _ssh_needs_address(self):
        if self.kind == "ssh" and not self.address:
            raise ValueError("kind ssh needs `address` (host name or IP)")
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
        have = hosts[h].gpus
        if need > len(have):
            raise ValueError(f"hosts.{h}.gpus: {have} has {len(have)} GPU(s); placement needs {need} "
                             f"({p.mode}, gpus_per_arm={p.gpus_per_arm})")
