"""Load stage: aiperf replays an agentic trace against one arm's server.

The client always runs here, on the controller (the server may be remote): a subprocess in its
own process group, logged to `arm.aiperf_log`, artifacts in `arm.aiperf_dir`, bounded by a hard
timeout (aiperf 0.13 never ends a `--request-count` run, which cuts sessions mid-way, so the recipe
refuses load.request_count; it ends normally with `--benchmark-duration`; a run killed at the timeout
fails), then the server is checked to be still alive (a dead one leaves only failed records, which
measure nothing) and the record count in profile_export.jsonl is checked.

Its own session outlives a hard kill of the pipeline and would go on sending to whatever listens on
the arm's port, a resumed server included. Every process of one aiperf run carries its session id (the
leader's pid); `arm.aiperf_process` records that pid, the leader's start time and the boot, by which a
resume finds and stops them (stop_leftover). Not by their command line or environment: aiperf retitles
its processes (setproctitle), which overwrites both in /proc.

Records are matched across arms on (conversation_id, turn_index, k-th occurrence), which
aiperf writes in each record's metadata; x_correlation_id is random per run.

Sizing (2-core box, emulator h200 / qwen3.5-397b-a17b-tp2, recipes/data/traces/quickstart,
concurrency 8): each session's first call is a cold prefill of 17k-200k tokens, ~65 s of
emulated prefill for the ten sessions. Without warmup a 60 s window holds ~11 records, all
inside that cold phase (TPOT dominated by prefill chunks, equal in both arms). With
warmup_requests = number of sessions (10) most first calls run in the warm-up: 145-153 s per arm in
all (start-up ~15 s, warmup ~66 s, window 60 s + drain), 77-85 records per arm. Not every one: in
concurrency mode aiperf sends a session's waiting next turn before a new session, so some warm-up
requests are second turns (the quickstart's primes 8 of its 10 sessions), and the window carries on
aiperf's session order rather than starting over; the sessions left cold start in the window with
their cold prefill, the same in both arms. The stage says how many it primed (LoadResult.warmup_primed).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.config.load import LoadSpec, check_trace_dir
from pipeline.io import read_json, write_json_atomic
from pipeline.paths import ArmPaths

# aiperf's own loader for kv-cache-tester agentic traces (what pipeline.tracegen writes).
TRACE_DATASET_TYPE = "weka_trace"
POLL_S = 0.5
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # pids and start times count from boot


class LoadError(RuntimeError):
    """The load stage failed; the message carries the cause and aiperf's log tail."""


@dataclass(frozen=True)
class LoadResult:
    """What one aiperf run produced; saved as JSON by the caller (`arm.stage_result('load')`)."""

    command: list[str]
    returncode: int | None   # None: killed at timeout_s
    timed_out: bool
    records: int             # successful profiling records in profile_export.jsonl
    errors: int              # failed profiling records
    duration_s: float        # aiperf wall time, start-up included
    aiperf_dir: str
    profile_export: str
    log: str
    warmup_primed: int | None = None   # trace sessions whose first call ran in the warm-up
    trace_sessions: int | None = None  # sessions in the trace (its session files)

    def to_json(self) -> dict:
        return asdict(self)


def aiperf_command(spec: LoadSpec, *, url: str, model: str, tokenizer: str,
                   artifact_dir: Path) -> list[str]:
    """The `aiperf profile` argv for one arm (pure: the plan prints it, run_load runs it)."""
    cmd = [sys.executable, "-m", "aiperf", "profile", "--model", model, "--url", url,
           "--endpoint-type", "chat", "--streaming", "--tokenizer", str(tokenizer)]
    if spec.trace is not None:
        cmd += ["--custom-dataset-type", TRACE_DATASET_TYPE, "--input-file", str(spec.trace)]
    else:
        cmd += ["--public-dataset", spec.scenario]
    cmd += ["--concurrency", str(spec.concurrency), "--benchmark-duration", f"{spec.benchmark_duration_s:g}",
            "--benchmark-grace-period", f"{spec.grace_period_s:g}"]
    if spec.warmup_requests:
        cmd += ["--warmup-request-count", str(spec.warmup_requests)]
    cmd += ["--random-seed", str(spec.seed), "--extra-inputs", "ignore_eos:true",
            "--artifact-dir", str(artifact_dir), "--ui", "none"]
    if not spec.gpu_telemetry:
        cmd.append("--no-gpu-telemetry")
    return cmd + list(spec.extra_args)


def count_records(profile_export: Path, phase: str = "profiling") -> tuple[int, int]:
    """(successful, failed) records of `phase` (profiling or warmup) in an aiperf profile_export.jsonl (0, 0 if
    absent). A request aiperf cancelled at the window's end carries an error too, but it is no failure: it is
    counted in neither, so that a long request's window (as many in flight at its end as finished) reads as sound."""
    ok = failed = 0
    if not profile_export.is_file():
        return 0, 0
    with open(profile_export) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line aiperf is still writing
            if rec.get("metadata", {}).get("benchmark_phase", "profiling") != phase:
                continue
            if rec.get("metadata", {}).get("was_cancelled"):
                continue
            if rec.get("error"):
                failed += 1
            else:
                ok += 1
    return ok, failed


def primed_sessions(profile_export: Path) -> set[str]:
    """The sessions whose first call (turn 0 of the main conversation, not a subagent's `<session>::sa:...`) ran
    in the warm-up phase: their first calls' cold prefill is outside the window."""
    primed: set[str] = set()
    if not profile_export.is_file():
        return primed
    with open(profile_export) as f:
        for line in f:
            try:
                meta = json.loads(line).get("metadata", {})
            except json.JSONDecodeError:
                continue
            conv = str(meta.get("conversation_id", ""))
            if meta.get("benchmark_phase") == "warmup" and meta.get("turn_index") == 0 and conv and "::" not in conv:
                primed.add(conv)
    return primed


def log_tail(path: Path, lines: int = 40) -> str:
    if not path.is_file():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# aiperf's log lines: "19:05:38.564 ERROR    Dataset configuration failed: ValueError(...) (dataset_manager.py:193)"
ERROR_LINE = re.compile(r"^\S+ ERROR\s+(.*?)(?: \([\w.]+\.py:\d+\))?$")


def first_error(path: Path) -> str | None:
    """The first ERROR line of aiperf's log, its source location dropped: with no record at all, the cause (a bad
    trace, a refused connection) is there, above tracebacks and a boxed summary that a log tail may cut."""
    if not path.is_file():
        return None
    with open(path, errors="replace") as f:
        for line in f:
            if m := ERROR_LINE.match(line.rstrip("\n")):
                return m.group(1)[:500]
    return None


MMAP_BASE_ENV = "AIPERF_DATASET_MMAP_BASE_PATH"


def _child_env(tokenizer: str, scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    if Path(tokenizer).is_dir():
        # aiperf treats a local tokenizer path as a hub repo id when HF_HUB_OFFLINE is set.
        env.pop("HF_HUB_OFFLINE", None)
        env.pop("TRANSFORMERS_OFFLINE", None)
    # aiperf writes its memory-mapped dataset to aiperf_mmap_<id>/ under the system temp directory and
    # leaves it there (a sweep left hundreds in /tmp); the arm's own scratch directory is removed after
    # the run. A base path the user set is theirs to keep.
    env.setdefault(MMAP_BASE_ENV, str(scratch))
    return env


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM aiperf's process group (its services are children), then SIGKILL the group and
    wait (bounded) until no member is left, so a returned stage leaves nothing running."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # also what the leader's exit left behind
        except ProcessLookupError:
            break
        time.sleep(0.2)
    proc.poll()


def run_load(spec: LoadSpec, *, url: str, model: str, tokenizer: str, arm: ArmPaths,
             progress: Callable[[str], None] | None = None,
             progress_every_s: float = 10.0, prefix: Sequence[str] = (),
             server_alive: Callable[[], bool] | None = None) -> LoadResult:
    """Run aiperf for one arm; raise LoadError (with the log tail) unless it left enough records.

    prefix: argv that runs aiperf elsewhere, e.g. a Slurm job step beside the server (`srun --jobid ...`).
    server_alive: whether the arm's server still runs, asked at each progress line and once aiperf ends; a
    server that died fails the stage (aiperf is stopped at once rather than left to time out)."""
    if spec.trace is not None:
        check_trace_dir(Path(spec.trace))
    if arm.aiperf_dir.exists():
        shutil.rmtree(arm.aiperf_dir)  # a rerun (--resume) must not count stale records
    arm.root.mkdir(parents=True, exist_ok=True)
    cmd = aiperf_command(spec, url=url, model=model, tokenizer=tokenizer,
                         artifact_dir=arm.aiperf_dir)
    cmd = list(prefix) + cmd
    say = progress or (lambda _msg: None)
    alive = server_alive or (lambda: True)
    env = _child_env(tokenizer, arm.aiperf_scratch)
    if env[MMAP_BASE_ENV] == str(arm.aiperf_scratch):
        arm.aiperf_scratch.mkdir(exist_ok=True)
    t0 = time.monotonic()
    try:
        proc, stopped = _run_aiperf(cmd, env, spec, arm, say, alive, progress_every_s, t0)
    finally:
        shutil.rmtree(arm.aiperf_scratch, ignore_errors=True)
    duration = time.monotonic() - t0
    timed_out = stopped == "timeout"
    if not timed_out:
        try:  # a service the exited leader left behind would hold ports and CPU
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    ok, failed = count_records(arm.profile_export)
    if stopped == "server" or not alive():
        raise LoadError(f"load: arm {arm.root.name}: its server exited while aiperf ran ({ok} records, "
                        f"{failed} errors after {duration:.0f}s); the load is not kept and --resume redoes it; "
                        f"why the server died: {arm.server_log}")
    sessions = len(list(Path(spec.trace).glob("*.json"))) if spec.trace is not None else None
    primed = len(primed_sessions(arm.profile_export)) if spec.warmup_requests else None
    result = LoadResult(command=cmd, returncode=None if timed_out else proc.returncode,
                        timed_out=timed_out, records=ok, errors=failed,
                        duration_s=round(duration, 3), aiperf_dir=str(arm.aiperf_dir),
                        profile_export=str(arm.profile_export), log=str(arm.aiperf_log),
                        warmup_primed=primed, trace_sessions=sessions)
    _check(spec, result, arm)
    say(f"aiperf done in {duration:.0f}s, {ok} records, {failed} errors")
    if primed is not None and sessions and primed < sessions:
        say(f"the warm-up primed the first call of {primed} of the trace's {sessions} sessions; the other "
            f"{sessions - primed} start in the window with a cold prefill (in both arms alike)")
    return result


def _run_aiperf(cmd: list[str], env: dict[str, str], spec: LoadSpec, arm: ArmPaths, say: Callable[[str], None],
                server_alive: Callable[[], bool], progress_every_s: float,
                t0: float) -> tuple[subprocess.Popen, str | None]:
    """aiperf in its own process group, its output in the arm's log, a progress line every progress_every_s;
    killed at spec.timeout_s, or as soon as a progress tick finds the server dead. Returns (the process, why it
    was killed: "timeout", "server", or None if it ended by itself)."""
    arm.aiperf_process.unlink(missing_ok=True)  # the last run's, stopped or finished by now
    with open(arm.aiperf_log, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        # Popen returns once the child has called setsid and exec'd: its pid is the session id of every
        # process aiperf starts. A kill before the record below is written leaves that run unrecorded.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        stopped, next_say = None, t0 + progress_every_s
        try:
            write_json_atomic(arm.aiperf_process, {"pid": proc.pid, "start": _stat(proc.pid)[2],
                                                   "boot": BOOT_ID.read_text().strip()})
            while proc.poll() is None:
                now = time.monotonic()
                if now - t0 > spec.timeout_s:
                    stopped = "timeout"
                elif now >= next_say:
                    if not server_alive():
                        stopped = "server"
                    else:
                        say(f"aiperf running {now - t0:.0f}s, {_progress(spec, arm)}")
                        next_say += progress_every_s
                if stopped:
                    _kill_group(proc)
                    break
                time.sleep(POLL_S)
        except BaseException:
            _kill_group(proc, grace_s=2.0)
            raise
    return proc, stopped


def stop_leftover(arm: ArmPaths, wait_s: float = 10.0) -> list[int]:
    """SIGKILL what is left of the arm's last aiperf run, wait (bounded) until none of it runs, and return the
    pids stopped ([] if nothing).

    A hard kill of the pipeline leaves aiperf running in its own session, sending to the arm's port, where a
    resumed server would answer it beside the new run's aiperf. Its processes are the members of the session
    recorded in `arm.aiperf_process` (_session). aiperf's only child that leaves the session, the code grader
    of its accuracy mode (which the pipeline does not use), kills itself when its parent dies. aiperf always
    runs on this machine, whichever host serves; a Slurm job step (load: allocation) ends with its job, which
    the resume cancels."""
    try:
        rec = read_json(arm.aiperf_process)
        leader, start, boot = int(rec["pid"]), int(rec["start"]), str(rec["boot"])
    except (OSError, ValueError, KeyError, TypeError):
        # No run, or a record written before sessions were recorded (an environment token only, which
        # aiperf's retitling erased): nothing left can be told apart from other processes.
        return []
    if boot != BOOT_ID.read_text().strip() or leader == os.getsid(0):  # another boot's pids; never our session
        return []
    stopped: set[int] = set()
    deadline = time.monotonic() + wait_s
    while (pids := _session(leader, start)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                stopped.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.2)
    return sorted(stopped)


def _session(leader: int, start: int) -> list[int]:
    """Live local processes of the session that `leader`, started at `start` (clock ticks since boot), created.

    The kernel gives no new process a pid that a live process still holds as its session id, so the members
    found are ours, or, once all of ours are gone, those of a later session whose leader drew the same pid.
    That leader, if alive, has another start time: nothing is ours. If it has exited too, its members are
    taken for ours (it takes a pid wrap-around between the kill and the resume, and a leader that left its
    members behind). A member started before our leader cannot be ours either."""
    members = {}
    for d in Path("/proc").glob("[0-9]*"):
        st = _stat(int(d.name))
        if st is not None and st[1] == leader:
            members[int(d.name)] = st
    if leader in members and members[leader][2] != start:
        return []
    return [pid for pid, (state, _, t) in members.items() if state != "Z" and t >= start]  # Z: dead, unreaped


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, session id, start time in clock ticks since boot) of a local process from /proc/PID/stat, None if
    it is gone. The command name in parentheses may hold spaces and parentheses: fields count from the last ')'."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # fields[0] is stat's field 3 (state)
    return fields[0], int(fields[3]), int(fields[19])


def _progress(spec: LoadSpec, arm: ArmPaths, now: float | None = None) -> str:
    """Where aiperf is, in one line: the warm-up's count and what it waits for, then the measured window's
    elapsed/total seconds (its start: the earliest request of a measured record), then the grace period's drain.
    Without it, a long first prefill in the warm-up looks like a stuck run, and the window like an open-ended one."""
    ok, failed = count_records(arm.profile_export)
    window = f"{spec.benchmark_duration_s:g} s"
    start = window_start(arm.profile_export)
    if start is not None:
        elapsed = (time.time() if now is None else now) - start
        if elapsed <= spec.benchmark_duration_s:
            return f"measured window {elapsed:.0f}/{window}, {ok} records so far"
        return (f"measured window over ({window}), {ok} records; waiting up to {spec.grace_period_s:g} s "
                f"for the requests still in flight")
    if ok + failed:
        return f"{ok} records so far in the {window} window"
    if not spec.warmup_requests:
        return f"waiting for aiperf's start-up and the first measured record ({window} window)"
    done = sum(count_records(arm.profile_export, "warmup"))
    if done < spec.warmup_requests:
        # aiperf exports records in batches: the count trails the requests that ended by up to ~30 s
        return (f"warm-up: {done}/{spec.warmup_requests} unmeasured requests exported so far (sessions' first calls: "
                f"cold prefills that may take a minute); the {window} measured window starts once all have ended")
    return f"warm-up done ({done} requests); the {window} measured window runs, its first record pending"


def window_start(profile_export: Path) -> float | None:
    """Unix time of the earliest request start among the measured (profiling) records so far, None before one."""
    if not profile_export.is_file():
        return None
    first = None
    with open(profile_export) as f:
        for line in f:
            try:
                meta = json.loads(line).get("metadata", {})
            except json.JSONDecodeError:
                continue  # a line aiperf is still writing
            ns = meta.get("request_start_ns")
            if meta.get("benchmark_phase", "profiling") == "profiling" and isinstance(ns, (int, float)):
                first = ns if first is None else min(first, ns)
    return None if first is None else first / 1e9


def _check(spec: LoadSpec, r: LoadResult, arm: ArmPaths) -> None:
    where = f"aiperf log {arm.aiperf_log}, last lines:\n{log_tail(arm.aiperf_log)}"
    if r.timed_out:
        # aiperf killed mid-window or mid-drain: the window is cut short by a different amount in each arm,
        # so the records, however many, measure unequal windows; failing lets --resume redo the load.
        raise LoadError(f"load: aiperf was killed at load.timeout_s={spec.timeout_s:g} after {r.records} records "
                        f"(kept in {arm.profile_export} but not counted); timeout_s must cover aiperf's start-up "
                        f"(~30 s on 2 cores) + the warm-up ({spec.warmup_requests} requests) + "
                        f"benchmark_duration_s={spec.benchmark_duration_s:g} + grace_period_s="
                        f"{spec.grace_period_s:g}; raise it and run with --resume; aiperf log {arm.aiperf_log}")
    if r.records < spec.min_records:
        first = first_error(arm.aiperf_log) if r.records == 0 else None
        raise LoadError(f"load: {r.records} successful records in {arm.profile_export} "
                        f"({r.errors} failed), below min_records={spec.min_records}; aiperf "
                        f"exit code {r.returncode}" + (f"; aiperf's first error: {first}" if first else "")
                        + f"; {where}")
    if r.errors > r.records:  # the requests that succeeded are a biased sample of the window, not its traffic
        raise LoadError(f"load: {r.errors} of {r.errors + r.records} profiling records in {arm.profile_export} "
                        f"failed, more than succeeded, so the rest do not measure the arm; see the server's log "
                        f"{arm.server_log} and the {where}")
    if r.returncode != 0:
        raise LoadError(f"load: aiperf exited with code {r.returncode} after "
                        f"{r.duration_s:.0f}s ({r.records} records); {where}")
