"""Execute a RunPlan: per group of arm runs, start servers, replay the load, score accuracy, stop servers.

Each stage's result is saved in the arm's folder and marked done in the manifest before the next stage
starts, so a crash keeps every finished stage and `--resume` redoes only what is missing.
"""
from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from dataclasses import asdict
from pathlib import Path

from pipeline.config.recipe import Recipe
from pipeline.engines import get_engine
from pipeline.hosts import Host, HostError, LocalHost, SshHost
from pipeline.io import write_json_atomic
from pipeline.manifest import Manifest, gpu_facts, load_average, machine_facts, now
from pipeline.paths import ArmPaths, RunPaths, remote_superseded_dir
from pipeline.plan import ArmRun, RunPlan, gpus_text
from pipeline.stages.server import save_result, served_paths, start_server


class RunError(RuntimeError):
    pass


def progress_line(arm_run: str, stage: str, msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {arm_run:<7} {stage:<9} {msg}", flush=True)


def make_hosts(recipe: Recipe) -> dict[str, Host]:
    hosts: dict[str, Host] = {}
    for name, h in recipe.hosts.items():
        if h.kind == "slurm":
            from pipeline.slurm import SlurmHost

            hosts[name] = SlurmHost(name, h.slurm, recipe.placement.gpus_per_arm,
                                    progress=lambda msg: progress_line("-", "slurm", msg))
        else:
            hosts[name] = (LocalHost() if h.kind == "local" else
                           SshHost(name, h.address, user=h.user, port=h.port, key=h.key))
    return hosts


def host_facts(recipe: Recipe, hosts: dict[str, Host]) -> dict:
    """GPU facts per used host. Reaches every SSH host once: one it cannot reach raises HostError (a new run
    checks this before it makes its run dir)."""
    used = sorted(set(recipe.placement.hosts))
    # a slurm host's GPUs are known per job: each arm run's server stage records its node and GPUs
    facts = {name: {"kind": recipe.hosts[name].kind,
                    "gpus": [] if recipe.hosts[name].kind == "slurm" else gpu_facts(hosts[name])}
             for name in used}
    for name in used:  # a slurm host's node, too, is known per job only
        if recipe.hosts[name].kind != "slurm":
            facts[name]["machine"] = machine_facts(hosts[name])
    return facts


def check_matched_gpus(plan: RunPlan, facts: dict) -> None:
    if plan.mode != "concurrent":
        return
    for group in plan.groups():
        models = set()
        for a in group:
            by_index = {g.get("index"): g.get("name") for g in facts[a.host]["gpus"]}
            models.add(tuple(by_index.get(str(i), "?") for i in a.gpus))
        if len(models) > 1:
            raise RunError(f"placement: concurrent arms got GPUs of different models {sorted(models)}; "
                           f"list same-model GPUs under hosts.<host>.gpus")


def check_same_gpu_models(stages: dict, arm_run: str, job: dict) -> None:
    """A scheduler picks each job's node: refuse an arm run whose GPUs are another model than those an
    earlier arm run of this run got (a recipe pins the node type with hosts.<h>.slurm.constraint)."""
    mine = sorted({g.get("name") for g in job.get("gpus", [])})
    for other, entry in stages.items():
        theirs = sorted({g.get("name") for g in entry.get("server", {}).get("slurm_job", {}).get("gpus", [])})
        if other != arm_run and mine and theirs and mine != theirs:
            raise RunError(f"placement: arm run {arm_run} got GPUs {mine} on {job.get('SLURMD_NODENAME')}, but "
                           f"{other} ran on {theirs}; the arms must run on the same GPU model: pin the node type "
                           f"with hosts.<host>.slurm.constraint")


def _kill_leftover(manifest: Manifest, arm_run: ArmRun, host: Host) -> list[int]:
    """A server left running by a killed run would hold the port: stop it if it is still ours, and return the
    process groups stopped. Ours: the manifest's pid running the arm's command, or any process writing to the
    arm's own server log (a kill can land between the server's start and the manifest's record of it). Where
    it runs is the host's kind (a host's name says nothing of it): on an SSH host, the log's writers; a Slurm
    host cancels the job instead (run_arm)."""
    if host.kind != "local":
        groups = host.kill_writers(f"{arm_run.artifact_dir}/server.log") if host.kind == "ssh" else []
        if groups:
            time.sleep(0.5)
        return groups
    pids = set(_writing_to(f"{arm_run.artifact_dir}/server.log"))
    pid = manifest.stage(arm_run.name, "server").get("pid")
    try:
        if pid and Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1] == list(arm_run.argv):
            pids.add(pid)  # (the pid may have been reused by an unrelated process)
    except OSError:
        pass
    groups = set()
    for p in pids:
        try:
            group = os.getpgid(p)
            if group != os.getpgrp():  # LocalHost starts servers in their own session; never our own group
                os.killpg(group, signal.SIGKILL)  # a server forks workers: its whole group
                groups.add(group)
        except ProcessLookupError:
            pass
    if groups:
        time.sleep(0.5)
    return sorted(groups)


def _stop_leftover_server(manifest: Manifest, a: ArmRun, host: Host) -> None:
    """_kill_leftover, said on the arm's progress line (as a Slurm host's cancelled job is)."""
    groups = _kill_leftover(manifest, a, host)
    if groups:
        progress_line(a.name, "server", f"stopped the server left running by an earlier attempt "
                                        f"(process group {', '.join(map(str, groups))})")


def _writing_to(log: str) -> list[int]:
    """Local processes whose stdout is this file (how LocalHost starts a server), read from /proc."""
    target = os.path.realpath(log)
    found = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if os.readlink(d / "fd" / "1") == target:
                found.append(int(d.name))
        except OSError:  # gone, or not ours to look at
            continue
    return found


def _stop_leftover_loads(plan: RunPlan) -> None:
    """Stop every aiperf a hard-killed run left sending (pipeline.stages.load.stop_leftover), before any stage
    runs again: arm runs share ports, so one arm's leftover would load another's resumed server too."""
    from pipeline.stages.load import stop_leftover

    paths = RunPaths(Path(plan.run_dir))
    for a in plan.arm_runs:
        pids = stop_leftover(paths.arm(a.name))
        if pids:
            progress_line(a.name, "load", f"stopped aiperf left running by an earlier attempt "
                                          f"({len(pids)} processes, pids {', '.join(map(str, pids))})")


def _pending(plan: RunPlan, manifest: Manifest, a: ArmRun) -> list[str]:
    return [s for s in plan.stages[1:] if not manifest.is_done(a.name, s)]


def _served_by(info: dict) -> dict:
    """The server lifetime whose cycle log covers a stage (the emulator reports it in /server_info)."""
    log = info.get("cycle_log")
    return {"cycle_log_lifetime": log["lifetime"]} if isinstance(log, dict) and log.get("lifetime") else {}


def _supersede_half_finished(plan: RunPlan, manifest: Manifest, hosts: dict[str, Host],
                             group: list[ArmRun]) -> None:
    """Concurrent placement pairs a group's arm runs because their loads ran at the same time. A resume
    that finds the load done in some of them and not in the others would pair loads from different
    times, so the finished ones are set aside (files under superseded/, stage entries under the
    manifest's "superseded") and the whole group runs again. Once every load is done, a pending accuracy
    stage reruns alone: accuracy does not depend on timing."""
    done = [a for a in group if manifest.is_done(a.name, "load")]
    if plan.mode != "concurrent" or not done or len(done) == len(group):
        return
    paths = RunPaths(Path(plan.run_dir))
    for a in done:
        _stop_leftover_server(manifest, a, hosts[a.host])
        attempt = manifest.next_attempt(a.name)
        local = paths.arm(a.name).root
        if local.is_dir():
            aside = paths.superseded_arm(a.name, attempt)
            aside.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(local), str(aside))
        if hosts[a.host].kind == "ssh":  # else the rerun would append to its old server log and pull it
            hosts[a.host].run(["mv", a.artifact_dir, remote_superseded_dir(a.artifact_dir, attempt)])
        unfinished = ", ".join(b.name for b in group if b not in done)
        manifest.supersede(a.name, attempt, group=a.group,
                           reason=f"concurrent group rerun as a whole: the load of {unfinished} had not "
                                  f"finished, and a group's loads must run at the same time")
        where = paths.superseded_arm(a.name, attempt).relative_to(paths.root)
        progress_line(a.name, "-", f"load done but not {unfinished}'s: set aside to {where}; the group reruns")


def run_arm(recipe: Recipe, plan: RunPlan, manifest: Manifest, host: Host, a: ArmRun,
            barrier: threading.Barrier | None) -> None:
    arm = RunPaths(Path(plan.run_dir)).arm(a.name)
    pending = _pending(plan, manifest, a)
    engine = get_engine(recipe.engine)
    say = lambda stage: (lambda msg: progress_line(a.name, stage, msg))  # noqa: E731
    _stop_leftover_server(manifest, a, host)
    if hasattr(host, "cancel_leftover"):  # a scheduler's job outlives a hard-killed pipeline
        left = host.cancel_leftover(a.artifact_dir)
        if left:
            say("server")(f"cancelled job {left}, left running by an earlier attempt")
    say("server")(f"starting on {a.host} gpus={gpus_text(recipe, a)} port={a.port}")
    manifest.mark(a.name, "server", "running", **_loads(host))
    proc, current, launched = None, "server", []

    def started(p):
        launched.append(p)
        manifest.note(a.name, "server", pid=getattr(p, "pid", None))

    try:
        proc, result = start_server(engine, a, host, arm, timeout_s=recipe.server.startup_timeout_s,
                                    progress=say("server"), started=started)
        served_by = _served_by(result.info)
        job = {"slurm_job": proc.facts} if getattr(proc, "facts", None) is not None else {}
        if job:
            check_same_gpu_models(manifest.data["stages"], a.name, proc.facts)
        manifest.mark(a.name, "server", "done", pid=getattr(proc, "pid", None), startup_s=result.startup_s,
                      url=result.url, **served_by, **job)
        save_result(result, arm.stage_result("server"))
        say("server")(f"healthy after {result.startup_s:.1f}s at {result.url}")
        if barrier is not None:
            barrier.wait()  # concurrent arms start their load together
        for stage in pending:
            current = stage
            manifest.mark(a.name, stage, "running")
            say(stage)("started")
            t0 = time.monotonic()
            res = _run_client_stage(stage, recipe, a, arm, result.url, proc, say(stage))
            write_json_atomic(arm.stage_result(stage), asdict(res))
            manifest.mark(a.name, stage, "done", **served_by)
            say(stage)(f"done in {time.monotonic() - t0:.0f}s")
    except BaseException as e:
        # a scheduler's job says why the server went away (FAILED, PREEMPTED, TIMEOUT...) and Slurm's output
        job = f"\n{proc.describe()}" if hasattr(proc, "describe") and current != "server" else ""
        manifest.mark(a.name, current, "failed", error=(f"{type(e).__name__}: {e}"[:2000] + job[:2000]))
        if barrier is not None:
            barrier.abort()
        raise
    finally:
        if proc is not None:
            proc.stop()
            say("server")("stopped")
        _collect_server_artifacts(recipe, manifest, host, a, arm, launched=bool(launched), say=say("server"))


def _loads(host: Host) -> dict:
    """1-minute load averages at an arm run's start: its server's machine (not a Slurm job's: unknown until it
    starts) and, where that is another machine, the controller's, which runs aiperf."""
    out = {} if host.kind == "slurm" else {"load_1m": load_average(host)}
    if host.kind != "local":
        out["controller_load_1m"] = load_average(LocalHost())
    return out


def _run_client_stage(stage: str, recipe: Recipe, a: ArmRun, arm: ArmPaths, url: str, proc, progress):
    """The load (aiperf) or accuracy stage against the arm's healthy server; its typed result."""
    from pipeline.accuracy.stage import run_accuracy
    from pipeline.stages.load import run_load

    if stage == "load":
        return run_load(recipe.load, url=url, model=recipe.model, tokenizer=recipe.tokenizer, arm=arm,
                        progress=progress, prefix=_load_prefix(recipe, a, proc),
                        server_alive=lambda: proc.poll() is None)
    return run_accuracy(recipe.accuracy, url=url, model=recipe.model, out_dir=arm.accuracy_dir, progress=progress)


def _collect_server_artifacts(recipe: Recipe, manifest: Manifest, host: Host, a: ArmRun, arm: ArmPaths, *,
                              launched: bool, say) -> None:
    """After the server stopped: its log and engine artifacts from an SSH host, and sglang's path counters."""
    # from where this attempt's server wrote them; none when it never started (a refused port): its folder there
    # may not exist, and pulling it would only add noise
    if launched and host.kind == "ssh":
        try:  # a failed pull must not hide the stage's own error
            host.get(a.artifact_dir, arm.root)
        except HostError as e:
            say(f"could not pull {a.artifact_dir}: {e}")
    if recipe.engine == "sglang":  # the base backend and vattn/base forward counts, into the manifest
        manifest.note(a.name, "server", **served_paths(arm.server_log))


def _load_prefix(recipe: Recipe, a: ArmRun, proc) -> list[str]:
    """aiperf runs on this machine, or as a step of the arm's Slurm job when its host says load: allocation."""
    spec = recipe.hosts[a.host]
    if spec.kind == "slurm" and spec.slurm.load == "allocation":
        return proc.client_prefix()
    return []


def _run_group(recipe, plan, manifest, hosts, group: list[ArmRun]) -> bool:
    """Run the group's unfinished arm runs; False if every one was done already."""
    _supersede_half_finished(plan, manifest, hosts, group)
    todo = [a for a in group if _pending(plan, manifest, a)]
    for a in group:
        if a not in todo:
            progress_line(a.name, "-", "all stages done (resume): skipped")
    if not todo:
        return False
    if len(todo) == 1:
        run_arm(recipe, plan, manifest, hosts[todo[0].host], todo[0], None)
        return True
    barrier = threading.Barrier(len(todo))
    errors: list[BaseException] = []

    def work(a):
        try:
            run_arm(recipe, plan, manifest, hosts[a.host], a, barrier)
        except BaseException as e:  # reported after both threads finish
            errors.append(e)

    threads = [threading.Thread(target=work, args=(a,), name=a.name) for a in todo]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return True


def execute(recipe: Recipe, plan: RunPlan, manifest: Manifest, hosts: dict[str, Host]) -> None:
    def on_term(signum, frame):  # SIGTERM behaves like Ctrl-C: stages unwind and stop their servers
        raise KeyboardInterrupt(signal.Signals(signum).name)  # the CLI names it and exits 128 + its number

    previous = signal.signal(signal.SIGTERM, on_term)
    span = manifest.open_invocation()
    try:
        _stop_leftover_loads(plan)
        ran = [_run_group(recipe, plan, manifest, hosts, group) for group in plan.groups()]
        # a resume with nothing left to run keeps the finish time: the report's wall time ends there
        if any(ran) or not manifest.data.get("finished"):
            manifest.set("finished", now())
    finally:
        manifest.close_invocation(span)
        signal.signal(signal.SIGTERM, previous)
