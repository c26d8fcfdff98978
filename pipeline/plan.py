"""Recipe -> RunPlan: every arm run resolved (host, GPUs, port, env, command, paths) before anything starts.

`pipeline plan` prints this and launches nothing; `pipeline run` executes it group by group.
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.config.arms import arm_server_args
from pipeline.config.placement import HostSpec
from pipeline.config.recipe import Recipe
from pipeline.engines import get_engine
from pipeline.engines.base import LaunchContext
from pipeline.hosts import shell_join
from pipeline.paths import RunPaths, remote_arm_dir, remote_run_dir

STAGES = ("server", "load", "accuracy")
SLURM_NODE = "slurm-node"   # URL host of a slurm arm run until its job lands on a node


def _server_python(host) -> str:
    if host.kind == "local" or (host.kind == "slurm" and host.slurm.python is None):
        return sys.executable
    return host.slurm.python if host.kind == "slurm" else host.python


@dataclass(frozen=True)
class ArmRun:
    name: str            # folder name: "off", "on", "on.2", ...
    arm: str             # "off" | "on"
    round: int           # 1-based; a second round of the same arm is the A/A repeat
    group: int           # arm runs of one group run at the same time (concurrent placement)
    host: str
    gpus: tuple[int, ...]
    port: int
    url: str             # base URL the client uses, e.g. http://127.0.0.1:30000
    env: dict[str, str]  # full env given to the server: server.env + arm env + GPU binding
    argv: tuple[str, ...]
    artifact_dir: str    # on the server's host
    local_dir: str       # this run dir's arms/<name>
    uploads: tuple[tuple[str, str], ...] = ()  # (here, there): files the server reads, put on its host first

    @property
    def command_line(self) -> str:
        return shell_join(self.argv, self.env)


@dataclass(frozen=True)
class RunPlan:
    run_dir: str
    mode: str
    stages: tuple[str, ...]
    arm_runs: tuple[ArmRun, ...]
    env_diff: dict[str, tuple[str | None, str | None]]   # var -> (off, on)

    def groups(self) -> list[list[ArmRun]]:
        out: dict[int, list[ArmRun]] = {}
        for a in self.arm_runs:
            out.setdefault(a.group, []).append(a)
        return [out[g] for g in sorted(out)]

    def to_dict(self) -> dict:
        return asdict(self)


def env_diff(recipe: Recipe) -> dict[str, tuple[str | None, str | None]]:
    off, on = recipe.arms["off"].env, recipe.arms["on"].env
    return {k: (off.get(k), on.get(k)) for k in sorted(set(off) | set(on)) if off.get(k) != on.get(k)}


def _sequence(recipe: Recipe) -> list[tuple[str, int, int, int]]:
    """(arm, round, group, gpu_slot) in execution order; gpu_slot picks the GPU set (0 or 1)."""
    p = recipe.placement
    seq = []
    if p.mode == "sequential":
        one_round = ["off", "on"] if p.order == "AB" else ["off", "on", "on", "off"]
        for r in range(p.repeats):
            for arm in one_round:
                seq.append((arm, r, len(seq), 0))
    else:
        rounds = p.repeats * (2 if p.swap else 1)
        for r in range(rounds):
            swapped = p.swap and r % 2 == 1
            seq.append(("off", r, r, 1 if swapped else 0))
            seq.append(("on", r, r, 0 if swapped else 1))
    return seq


def _server_tokenizer(recipe: Recipe, host: HostSpec, run_dir: Path, run_id: str | None) -> tuple[str | None, tuple]:
    """The tokenizer path the server is given, and what must be put on its host for it. The emulator counts tokens
    with the recipe's tokenizer, a folder on this machine (aiperf's too): on an SSH host it reads a copy of its
    tokenizer.json in the run's folder there (not the arm's, which is pulled back). A real engine uses its
    checkpoint's own tokenizer."""
    if host.kind != "ssh" or not get_engine(recipe.engine).emulated or not recipe.tokenizer:
        return recipe.tokenizer, ()
    there = f"{remote_run_dir(host.workdir, run_dir, run_id)}/tokenizer"
    return there, ((str(Path(recipe.tokenizer) / "tokenizer.json"), f"{there}/tokenizer.json"),)


def build_plan(recipe: Recipe, run_dir: Path, run_id: str | None = None) -> RunPlan:
    """run_id: the manifest's; it names the run's folders on SSH hosts (None: the basename-only layout
    of runs made before run ids, so that their resume finds their remote folders)."""
    p, paths = recipe.placement, RunPaths(Path(run_dir))
    engine = get_engine(recipe.engine)
    seen: dict[str, int] = {}
    arm_runs = []
    for arm, _, group, slot in _sequence(recipe):
        seen[arm] = seen.get(arm, 0) + 1
        name = arm if seen[arm] == 1 else f"{arm}.{seen[arm]}"
        host_name = p.hosts[slot] if len(p.hosts) == 2 else p.hosts[0]
        host = recipe.hosts[host_name]
        # both arms on one machine (validation refuses a host named twice; count distinct names anyway, so a
        # plan can never give two servers one GPU set and one port)
        one_host_pair = p.mode == "concurrent" and len(set(p.hosts)) == 1
        first = slot * p.gpus_per_arm if one_host_pair else 0
        gpus = tuple(host.gpus[first:first + p.gpus_per_arm])
        port = recipe.server.port + (slot if one_host_pair else 0)
        local = host.kind == "local"
        # slurm: the job writes into the run dir itself, which lies on the FS the nodes share
        on_this_fs = host.kind in ("local", "slurm")
        artifact_dir = (str(paths.arm(name).root.resolve()) if on_this_fs
                        else remote_arm_dir(host.workdir, run_dir, run_id, name))
        env = {**recipe.server.env, **recipe.arms[arm].env}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
            env["HIP_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
        tokenizer, uploads = _server_tokenizer(recipe, host, run_dir, run_id)
        ctx = LaunchContext(model=recipe.model, tokenizer=tokenizer, port=port,
                            bind="127.0.0.1" if local else "0.0.0.0",
                            server_args=arm_server_args(recipe.server, recipe.arms[arm]),
                            launch=recipe.server.launch, artifact_dir=artifact_dir,
                            python=_server_python(host))
        # a slurm job's node is known once it runs; the runner puts it in place of SLURM_NODE
        address = "127.0.0.1" if local else SLURM_NODE if host.kind == "slurm" else host.address
        arm_runs.append(ArmRun(name=name, arm=arm, round=seen[arm], group=group, host=host_name, gpus=gpus,
                               port=port, url=f"http://{address}:{port}", env=env,
                               argv=tuple(engine.command(ctx)), artifact_dir=artifact_dir,
                               local_dir=str(paths.arm(name).root), uploads=uploads))
    stages = STAGES if recipe.accuracy and recipe.accuracy.tasks else STAGES[:2]
    return RunPlan(run_dir=str(run_dir), mode=p.mode, stages=stages, arm_runs=tuple(arm_runs),
                   env_diff=env_diff(recipe))


def format_plan(plan: RunPlan, recipe: Recipe, load_commands: dict[str, list[str]]) -> str:
    """Human-readable plan: order, hosts, GPUs, ports, commands, env diff, paths."""
    lines = [f"run dir   {plan.run_dir}", f"engine    {recipe.engine} ({recipe.model})",
             f"placement {plan.mode}" + (f", order {recipe.placement.order} x{recipe.placement.repeats}"
                                          if plan.mode == "sequential" else
                                          f", swap={recipe.placement.swap} x{recipe.placement.repeats}"),
             f"stages    {' -> '.join(plan.stages)}",
             "env diff  " + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in plan.env_diff.items())]
    for group in plan.groups():
        together = " (at once)" if len(group) > 1 else ""
        lines.append(f"\ngroup {group[0].group + 1}{together}")
        for a in group:
            remote = f" (on {a.host}: {a.artifact_dir})" if recipe.hosts[a.host].kind == "ssh" else ""
            lines += [f"  [{a.name}] host={a.host} gpus={gpus_text(recipe, a)} url={a.url}",
                      f"    server: {a.command_line}",
                      f"    load:   {shell_join(load_commands[a.name])}",
                      f"    files:  {a.local_dir}{remote}"]
            lines += [f"    puts:   {here} -> {there}" for here, there in a.uploads]
            if "accuracy" in plan.stages:
                lines += _accuracy_lines(recipe, RunPaths(Path(plan.run_dir)).arm(a.name))
    return "\n".join(lines)


def _accuracy_lines(recipe: Recipe, arm) -> list[str]:
    """The accuracy stage of one arm run (against its url, from this machine): each task's data, the settings that
    size it, and its records file."""
    lines = []
    for task in recipe.accuracy.tasks:
        data = f"data={task.data}" if task.data else "data=HF hub"
        shots = f" shots={task.num_shots}" + (f" from {task.shots_data}" if task.shots_data else "")
        sizes = (f" limit={task.limit or 'all'} repeats={task.repeats} max_tokens={task.max_tokens} "
                 f"temperature={task.temperature} concurrency={task.concurrency}")
        lines.append(f"    accuracy: {task.name}: {data}{shots}{sizes} -> {arm.accuracy_records(task.name)}")
    return lines


def gpus_text(recipe: Recipe, a: ArmRun) -> str:
    """The GPUs an arm run gets, as the plan and the progress lines say it: a Slurm job's are the scheduler's pick."""
    if recipe.hosts[a.host].kind == "slurm":
        n = recipe.placement.gpus_per_arm
        return f"{n} from Slurm (--gres={recipe.hosts[a.host].slurm.gres}:{n})" if n else "none (Slurm job)"
    return ",".join(map(str, a.gpus)) or "none"
