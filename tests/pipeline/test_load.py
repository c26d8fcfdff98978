"""Load stage: the spec's rules and messages, the aiperf command, and real aiperf runs.

The end-to-end tests run the real aiperf against a real streaming HTTP server started here
(a small aiohttp app: OpenAI chat SSE, or HTTP 500s, or no answer) and against the project's
emulator.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeline.config.load import APPENDABLE_FLAGS, PIPELINE_FLAGS, LoadSpec
from pipeline.paths import ArmPaths
from pipeline.stages.load import LoadError, aiperf_command, count_records, log_tail, primed_sessions, run_load
from pipeline.tracegen import PRESETS, read_traces, write_traces

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "recipes" / "data" / "traces" / "quickstart"
TOKENIZER = str(ROOT / "recipes" / "data" / "tokenizer")
MODEL = "agentic-emulated"


# ---------------------------------------------------------------- the spec


def test_spec_defaults_and_trace_dir():
    s = LoadSpec(trace=QUICKSTART, benchmark_duration_s=60)
    assert s.streaming is True and s.ignore_eos is True and s.concurrency == 8
    assert s.trace == QUICKSTART and s.timeout_s > 60 + s.grace_period_s


@pytest.mark.parametrize("kw, msg", [
    ({"trace": "/nonexistent/traces"},
     r"directory '/nonexistent/traces' does not exist; generate one with "
     r"`python -m pipeline.tracegen traces --out DIR`"),
    ({}, r"set exactly one of trace \(a weka_trace directory\) or scenario"),
    ({"trace": str(QUICKSTART), "scenario": "sharegpt"}, r"set exactly one of trace"),
    ({"scenario": "x", "request_count": 10}, r"request_count\n.*aiperf 0.13 never ends a run bounded by a "
     r"request count \(it waits until load.timeout_s kills it\); set load.benchmark_duration_s"),
    ({"scenario": "x", "benchmark_duration_s": None}, r"benchmark_duration_s: required, the profiling window"),
    ({"scenario": "x", "timeout_s": 80}, r"timeout_s: 80.0 must exceed benchmark_duration_s \+ "
     r"grace_period_s = 90.0 and also cover aiperf's start-up \(~30 s on 2 cores\) and the warm-up "
     r"\(0 requests\); a run killed at timeout_s fails"),
    ({"scenario": "x", "concurrency": 0}, r"concurrency\n.*greater than or equal to 1"),
    ({"scenario": "x", "streaming": False}, r"streaming\n.*Input should be True"),
    ({"scenario": "x", "ignore_eos": False}, r"ignore_eos\n.*Input should be True"),
    ({"scenario": "x", "duration": 5}, r"duration\n.*Extra inputs are not permitted"),
])
def test_spec_rejects(kw, msg):
    data = {"benchmark_duration_s": 60} | kw
    with pytest.raises(ValidationError, match=msg):
        LoadSpec(**data)


def test_trace_must_be_a_directory_of_json(tmp_path):
    (tmp_path / "f.json").write_text("{}")
    with pytest.raises(ValidationError, match=r"'.*f.json' is not a directory"):
        LoadSpec(trace=tmp_path / "f.json", benchmark_duration_s=10)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValidationError, match=r"directory '.*empty' holds no \*.json trace files"):
        LoadSpec(trace=tmp_path / "empty", benchmark_duration_s=10)


def test_every_trace_file_must_match_aiperfs_trace_model(tmp_path):
    """Checked against aiperf's own WekaTrace when validating, else the error surfaces only after the server
    started, as a load with 0 records and the cause buried in aiperf's log."""
    d = tmp_path / "t"
    shutil.copytree(ROOT / "recipes" / "data" / "traces" / "short", d)
    bad = sorted(d.glob("*.json"))[1]
    trace = json.loads(bad.read_text())
    del next(r for r in trace["requests"] if r["type"] == "s")["out"]
    bad.write_text(json.dumps(trace))
    fix = r"; fix the file or regenerate the traces with `python -m pipeline.tracegen traces --out DIR`"
    with pytest.raises(ValidationError, match=rf"trace\n.*'{re.escape(str(bad))}' does not match aiperf's weka_trace "
                       rf"schema: requests.0.s.out: Field required{fix}"):
        LoadSpec(trace=d, benchmark_duration_s=10)
    bad.write_text('{"id": ')
    with pytest.raises(ValidationError, match=rf"'{re.escape(str(bad))}': invalid JSON \(Expecting value: line 1 "
                       rf"column 8 \(char 7\)\){fix}"):
        LoadSpec(trace=d, benchmark_duration_s=10)
    # run_load checks again, with the field named: the files may change between validation and the run
    spec = LoadSpec(trace=ROOT / "recipes" / "data" / "traces" / "short", benchmark_duration_s=10)
    with pytest.raises(ValueError, match=r"^load.trace: '.*' does not match aiperf's weka_trace schema: requests"):
        bad.write_text(json.dumps(trace))
        run_load(spec.model_copy(update={"trace": d}), url="http://127.0.0.1:9", model=MODEL, tokenizer=TOKENIZER,
                 arm=ArmPaths(tmp_path / "a"))


def test_relative_trace_resolves_against_context_base_dir():
    s = LoadSpec.model_validate({"trace": "data/traces/quickstart", "benchmark_duration_s": 10},
                                context={"base_dir": ROOT / "recipes"})
    assert s.trace == QUICKSTART


# ---------------------------------------------------------------- the command


def _flags(cmd: list[str]) -> list[str]:
    return [a for a in cmd if a.startswith("--")]


def test_command_trace_duration():
    s = LoadSpec(trace=QUICKSTART, benchmark_duration_s=60, grace_period_s=15, concurrency=8,
                 warmup_requests=2, seed=7, extra_args=["--use-server-token-count"])
    cmd = aiperf_command(s, url="http://h:1", model="m", tokenizer="tok", artifact_dir=Path("/a"))
    assert cmd[:4] == [sys.executable, "-m", "aiperf", "profile"]
    line = " ".join(cmd)
    for part in ("--model m", "--url http://h:1", "--endpoint-type chat", "--streaming",
                 "--tokenizer tok", f"--custom-dataset-type weka_trace --input-file {QUICKSTART}",
                 "--concurrency 8", "--benchmark-duration 60", "--benchmark-grace-period 15",
                 "--warmup-request-count 2", "--random-seed 7", "--extra-inputs ignore_eos:true",
                 "--artifact-dir /a", "--ui none", "--no-gpu-telemetry"):
        assert part in line, part
    assert cmd[-1] == "--use-server-token-count" and "--request-count" not in cmd


def test_command_scenario():
    s = LoadSpec(scenario="semianalysis-cc-traces-weka", benchmark_duration_s=50, gpu_telemetry=True,
                 timeout_s=100)
    cmd = aiperf_command(s, url="u", model="m", tokenizer="t", artifact_dir=Path("/a"))
    line = " ".join(cmd)
    assert "--public-dataset semianalysis-cc-traces-weka" in line and "--benchmark-duration 50" in line
    assert "--input-file" not in cmd and "--request-count" not in cmd
    assert "--no-gpu-telemetry" not in cmd and "--warmup-request-count" not in cmd


@pytest.mark.parametrize("args, match", [
    (["--concurrency", "3"], r"extra_args\n.*--concurrency: set by the pipeline \(from load.concurrency\); remove it"),
    (["--use-server-token-count", "--artifact-dir=/x"], r"--artifact-dir: set by the pipeline \(from the run dir\)"),
    (["--num-requests", "9"], r"--num-requests: aiperf 0.13 never ends a run bounded by a request count"),  # alias
    (["--request-count=9"], r"--request-count: aiperf 0.13 never ends .*; set load.benchmark_duration_s"),
])
def test_extra_args_may_not_set_the_pipelines_own_flags(args, match):
    """Else aiperf runs with a value that the manifest and report do not show (the last --concurrency wins)."""
    with pytest.raises(ValidationError, match=match):
        LoadSpec(trace=QUICKSTART, benchmark_duration_s=60, extra_args=args)
    assert LoadSpec(trace=QUICKSTART, benchmark_duration_s=60,
                    extra_args=["--use-server-token-count", "--extra-inputs", "top_k:1"]).extra_args


def test_the_refused_flags_cover_every_flag_the_command_sets():
    s = LoadSpec(trace=QUICKSTART, benchmark_duration_s=60, warmup_requests=1)
    s2 = LoadSpec(scenario="sharegpt", benchmark_duration_s=5, timeout_s=60, gpu_telemetry=True)
    used = set(_flags(aiperf_command(s, url="u", model="m", tokenizer="t", artifact_dir=Path("a"))))
    used |= set(_flags(aiperf_command(s2, url="u", model="m", tokenizer="t", artifact_dir=Path("a"))))
    assert used - set(APPENDABLE_FLAGS) <= PIPELINE_FLAGS.keys(), used - set(APPENDABLE_FLAGS) - PIPELINE_FLAGS.keys()


def test_every_flag_exists_in_the_installed_aiperf():
    s = LoadSpec(trace=QUICKSTART, benchmark_duration_s=60, warmup_requests=1)
    s2 = LoadSpec(scenario="sharegpt", benchmark_duration_s=5, timeout_s=60, gpu_telemetry=True)
    used = set(_flags(aiperf_command(s, url="u", model="m", tokenizer="t", artifact_dir=Path("a"))))
    used |= set(_flags(aiperf_command(s2, url="u", model="m", tokenizer="t", artifact_dir=Path("a"))))
    out = subprocess.run([sys.executable, "-m", "aiperf", "profile", "--help"], capture_output=True,
                         text=True, timeout=120, env=os.environ | {"COLUMNS": "200"}).stdout
    known = set(re.findall(r"(--[a-z][a-z0-9-]+)", out))
    assert used <= known, used - known


def test_count_records(tmp_path):
    f = tmp_path / "p.jsonl"
    ok = {"metadata": {"benchmark_phase": "profiling"}, "metrics": {}}
    lines = [ok, ok, {"metadata": {"benchmark_phase": "warmup"}, "metrics": {}},
             {"metadata": {"benchmark_phase": "profiling"}, "error": {"code": 500}},
             # cancelled at the window's end: not a failure, nor a finished request
             {"metadata": {"benchmark_phase": "profiling", "was_cancelled": True}, "error": {"type": "Cancelled"}}]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"metadata": {"bench')
    assert count_records(f) == (2, 1) and count_records(f, "warmup") == (1, 0)
    assert count_records(tmp_path / "missing.jsonl") == (0, 0)


def test_primed_sessions_are_those_whose_first_call_ran_in_the_warm_up(tmp_path):
    f = tmp_path / "p.jsonl"

    def rec(conv: str, turn: int, phase: str) -> dict:
        return {"metadata": {"conversation_id": conv, "turn_index": turn, "benchmark_phase": phase}, "metrics": {}}

    lines = [rec("session_000", 0, "warmup"), rec("session_001", 0, "warmup"),
             rec("session_001", 1, "warmup"),        # a waiting second turn, sent before a new session's first
             rec("session_002::sa:1", 0, "warmup"),  # a subagent's first call is not its session's
             rec("session_003", 0, "profiling")]     # left cold: its first call is in the window
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert primed_sessions(f) == {"session_000", "session_001"}
    assert primed_sessions(tmp_path / "missing.jsonl") == set()


# ---------------------------------------------------------------- a real streaming server


class ChatServer:
    """OpenAI chat-completions SSE server in a thread. mode: ok | error | hang."""

    def __init__(self, mode: str = "ok", tpot_s: float = 0.002):
        from aiohttp import web

        self.mode, self.tpot_s, self.bodies = mode, tpot_s, []
        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app)
        self._loop = asyncio.new_event_loop()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        self.url = f"http://127.0.0.1:{self.port}"
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(web, ready), daemon=True)
        self._thread.start()
        assert ready.wait(10), "test server did not start"

    def _serve(self, web, ready):
        asyncio.set_event_loop(self._loop)
        self._closing = asyncio.Event()
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        ready.set()
        self._loop.run_forever()

    async def _metrics(self, request):
        from aiohttp import web
        return web.Response(text="# none\n")

    async def _models(self, request):
        from aiohttp import web
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _chat(self, request):
        from aiohttp import web

        body = await request.json()
        self.bodies.append({k: v for k, v in body.items() if k != "messages"})
        if self.mode == "error":
            return web.json_response({"error": {"message": "boom", "type": "server_error"}},
                                     status=500)
        if self.mode == "hang":
            await self._closing.wait()
            return web.Response(status=503)
        n = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n + 1):
            await asyncio.sleep(self.tpot_s)
            delta, fin = ({"content": " the"}, None) if i < n else ({}, "length")
            chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": fin}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def close(self):
        self._loop.call_soon_threadsafe(self._closing.set)
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def server(request):
    s = ChatServer(getattr(request, "param", "ok"))
    yield s
    s.close()


def _proc_groups() -> dict[int, tuple[int, str]]:
    """pid -> (process group, command line) of every live (non-zombie) process we can read."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                state, _, pgrp = (d / "stat").read_text().rsplit(")", 1)[1].split()[:3]
                if state == "Z":  # dead, waiting for init to reap it
                    continue
                out[int(d.name)] = (int(pgrp), (d / "cmdline").read_bytes().decode(errors="replace"))
            except (OSError, ValueError):
                continue
    return out



def test_progress_says_what_the_warm_up_waits_for_then_the_windows_elapsed_seconds(tmp_path):
    from pipeline.stages.load import _progress

    arm = ArmPaths(tmp_path / "arms" / "off")
    arm.profile_export.parent.mkdir(parents=True)
    spec = LoadSpec(trace=QUICKSTART, warmup_requests=8, benchmark_duration_s=60, grace_period_s=20)
    warm = {"metadata": {"benchmark_phase": "warmup"}, "metrics": {}}
    arm.profile_export.write_text(json.dumps(warm) + "\n" + json.dumps(warm) + "\n")
    assert _progress(spec, arm) == ("warm-up: 2/8 unmeasured requests exported so far (sessions' first calls: cold "
                                    "prefills that may take a minute); the 60 s measured window starts once all have "
                                    "ended")
    arm.profile_export.write_text((json.dumps(warm) + "\n") * 8)
    assert _progress(spec, arm) == "warm-up done (8 requests); the 60 s measured window runs, its first record pending"
    t0 = 1_800_000_000.0
    with open(arm.profile_export, "a") as f:
        for start in (t0 + 5, t0):
            meta = {"benchmark_phase": "profiling", "request_start_ns": int(start * 1e9)}
            f.write(json.dumps({"metadata": meta, "metrics": {}}) + "\n")
    assert _progress(spec, arm, now=t0 + 23.2) == "measured window 23/60 s, 2 records so far"
    assert _progress(spec, arm, now=t0 + 65) == ("measured window over (60 s), 2 records; waiting up to 20 s for the "
                                                 "requests still in flight")


@pytest.mark.slow
def test_run_load_replays_the_trace_faithfully(server, tmp_path):
    spec = LoadSpec(trace=QUICKSTART, concurrency=4, benchmark_duration_s=10, grace_period_s=10,
                    timeout_s=240, seed=3, min_records=3)
    arm = ArmPaths(tmp_path / "arms" / "off")
    lines: list[str] = []
    scratch: list[list[str]] = []

    def progress(line: str) -> None:  # while aiperf runs: what it keeps in the arm's scratch directory
        lines.append(line)
        scratch.append(sorted(p.name for p in arm.aiperf_scratch.glob("aiperf_mmap_*")))

    res = run_load(spec, url=server.url, model=MODEL, tokenizer=TOKENIZER, arm=arm,
                   progress=progress, progress_every_s=3)
    assert res.returncode == 0 and not res.timed_out and res.errors == 0
    # aiperf's memory-mapped dataset lived in the arm's scratch directory, which is gone afterwards
    assert any(scratch[:-1]) and not arm.aiperf_scratch.exists()
    assert res.records >= 3 and res.profile_export == str(arm.profile_export)
    assert res.command == aiperf_command(spec, url=server.url, model=MODEL, tokenizer=TOKENIZER,
                                         artifact_dir=arm.aiperf_dir)
    assert arm.aiperf_log.read_text().startswith("$ " + " ".join(res.command))
    assert any(re.fullmatch(r"aiperf running \d+s, measured window \d+/10 s, \d+ records so far", x)
               for x in lines), lines
    assert re.fullmatch(rf"aiperf done in \d+s, {res.records} records, 0 errors", lines[-1])
    assert all(b["stream"] is True and b["ignore_eos"] is True and b["model"] == MODEL
               for b in server.bodies)
    # Every record maps back to a trace call: same input length (aiperf rebuilt the prompt from
    # the hash ids with our tokenizer) and the trace's output length was requested.
    calls = {s["id"]: [r for r in s["requests"] if r["type"] == "s"] for s in read_traces(QUICKSTART)}
    recs = [json.loads(x) for x in arm.profile_export.read_text().splitlines()]
    checked = 0
    for r in recs:
        m = r["metadata"]
        if m["conversation_id"] in calls:
            call = calls[m["conversation_id"]][m["turn_index"]]
            assert abs(r["metrics"]["input_sequence_length"]["value"] - call["in"]) <= 0.002 * call["in"]
            assert r["metrics"]["output_sequence_length"]["value"] == call["out"]
            checked += 1
    assert checked >= 3


@pytest.mark.slow
@pytest.mark.parametrize("server", ["error"], indirect=True)
def test_run_load_with_no_successful_records_raises_with_log_tail(server, tmp_path):
    arm = ArmPaths(tmp_path / "off")
    arm.aiperf_dir.mkdir(parents=True)
    stale = {"metadata": {"benchmark_phase": "profiling"}, "metrics": {}}
    arm.profile_export.write_text(json.dumps(stale) + "\n")  # a previous attempt's leftovers
    spec = LoadSpec(trace=QUICKSTART, concurrency=2, benchmark_duration_s=4, grace_period_s=2,
                    timeout_s=180)
    with pytest.raises(LoadError, match=r"(?s)load: 0 successful records in .*profile_export"
                       r"\.jsonl \(\d+ failed\), below min_records=1; aiperf exit code 1; aiperf's first "
                       r"error: [^\n]+; aiperf log "
                       r".*aiperf\.log, "
                       r"last lines:\n.+"):
        run_load(spec, url=server.url, model=MODEL, tokenizer=TOKENIZER, arm=arm)
    assert server.bodies and count_records(arm.profile_export)[1] >= 1


@pytest.mark.slow
def test_run_load_killed_at_timeout_fails_even_with_records(server, tmp_path):
    """Killed mid-window, aiperf leaves records of a window cut short (by a different amount in each arm): the
    stage fails, naming load.timeout_s and what it must cover, and keeps the records on disk; nothing of aiperf's
    process group survives."""
    arm = ArmPaths(tmp_path / "cut")
    spec = LoadSpec(trace=QUICKSTART, concurrency=4, benchmark_duration_s=20, grace_period_s=0, timeout_s=21)
    groups: set[int] = set()

    def watch(_msg: str) -> None:  # while aiperf runs: remember its process group
        groups.update(g for g, cmd in _proc_groups().values() if str(arm.aiperf_dir) in cmd)

    t0 = time.monotonic()
    with pytest.raises(LoadError, match=r"^load: aiperf was killed at load.timeout_s=21 after [1-9]\d* records "
                       r"\(kept in .*cut/aiperf/profile_export\.jsonl but not counted\); timeout_s must cover "
                       r"aiperf's start-up \(~30 s on 2 cores\) \+ the warm-up \(0 requests\) \+ "
                       r"benchmark_duration_s=20 \+ grace_period_s=0; raise it and run with --resume; "
                       r"aiperf log .*cut/aiperf\.log$"):
        run_load(spec, url=server.url, model=MODEL, tokenizer=TOKENIZER, arm=arm,
                 progress=watch, progress_every_s=1)
    assert time.monotonic() - t0 < 21 + 20   # SIGTERM grace 10 s, then SIGKILL
    assert count_records(arm.profile_export)[0] >= 1  # kept, as other failures keep theirs
    assert len(groups) == 1 and os.getpgrp() not in groups
    # nothing of aiperf's group survives (its services are children in the same group)
    assert [p for p, (g, _) in _proc_groups().items() if g in groups] == []


def test_a_killed_run_fails_the_stage_whatever_its_record_count(tmp_path):
    from pipeline.stages.load import LoadResult, _check

    arm = ArmPaths(tmp_path / "off")
    spec = LoadSpec(trace=QUICKSTART, benchmark_duration_s=20, grace_period_s=0, timeout_s=25, warmup_requests=4)
    result = LoadResult(command=[], returncode=None, timed_out=True, records=25, errors=0, duration_s=26.0,
                        aiperf_dir="", profile_export="", log="")
    with pytest.raises(LoadError, match=r"load: aiperf was killed at load.timeout_s=25 after 25 records .*"
                       r"the warm-up \(4 requests\) \+ benchmark_duration_s=20 \+ grace_period_s=0"):
        _check(spec, result, arm)


def test_more_failed_than_successful_records_fail_the_stage(tmp_path):
    from pipeline.stages.load import LoadResult, _check

    arm = ArmPaths(tmp_path / "off")
    spec = LoadSpec(trace=QUICKSTART, benchmark_duration_s=10)
    result = LoadResult(command=[], returncode=0, timed_out=False, records=8, errors=9, duration_s=41.0,
                        aiperf_dir="", profile_export="", log="")
    with pytest.raises(LoadError, match=r"load: 9 of 17 profiling records in .*off/aiperf/profile_export\.jsonl "
                       r"failed, more than succeeded, so the rest do not measure the arm; see the server's log "
                       r".*off/server\.log and the aiperf log .*off/aiperf\.log, last lines:"):
        _check(spec, result, arm)
    _check(spec, replace(result, errors=8), arm)  # as many as succeeded: kept, the report shows them


# Stands in for aiperf: a session leader that starts a child and, like aiperf's services, retitles itself
# (setproctitle overwrites /proc/PID/environ and cmdline); the child also leaves the leader's process group.
STAND_IN = """import os, subprocess, sys, time, setproctitle
if sys.argv[1] == "leader":
    subprocess.Popen([sys.executable, __file__, "child"])
else:
    os.setpgid(0, 0)
setproctitle.setproctitle("stand-in " + sys.argv[1])
time.sleep(60)
"""


def _sessions() -> dict[int, int]:
    """pid -> session id of every live (non-zombie) process."""
    out = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            out[int(d.name)] = int(fields[3])
    return out


def _session_of(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is `sid`."""
    return sorted(p for p, s in _sessions().items() if s == sid)


def _writing_to(log: Path) -> list[int]:
    """Live (non-zombie) processes whose stdout is `log`."""
    out = []
    for pid in _sessions():
        try:
            if os.readlink(f"/proc/{pid}/fd/1") == str(log):
                out.append(pid)
        except OSError:
            continue
    return sorted(out)


def _record(arm: ArmPaths, pid: int, **kw) -> None:
    from pipeline.stages.load import BOOT_ID, _stat

    arm.root.mkdir(parents=True, exist_ok=True)
    leader = _stat(pid)  # None: the session's leader has exited, and any start time of its members fits
    rec = {"pid": pid, "start": leader[2] if leader else 0, "boot": BOOT_ID.read_text().strip()}
    arm.aiperf_process.write_text(json.dumps(rec | kw))


def test_stop_leftover_stops_the_recorded_aiperf_run_and_nothing_else(tmp_path):
    """A hard-killed pipeline's aiperf is found by its session, recorded with the leader's start time and the
    boot: its retitled processes, children that left its group included. Another session is left alone, as is
    one whose leader has the recorded pid but not the recorded start time (the pid reused), one recorded on
    another boot, our own, and a record from before sessions were recorded (a token only)."""
    from pipeline.stages.load import stop_leftover

    (tmp_path / "stand_in.py").write_text(STAND_IN)
    tree = [sys.executable, str(tmp_path / "stand_in.py"), "leader"]
    ours = subprocess.Popen(tree, start_new_session=True)
    theirs = subprocess.Popen(tree, start_new_session=True)
    arm = ArmPaths(tmp_path / "off")
    try:
        deadline = time.monotonic() + 20
        while not all(len(_session_of(p.pid)) == 2 and b"stand-in child" in b"".join(
                Path(f"/proc/{c}/cmdline").read_bytes() for c in _session_of(p.pid)) for p in (ours, theirs)):
            assert time.monotonic() < deadline, "the stand-ins did not start and retitle"
            time.sleep(0.1)
        assert b"PATH=" not in Path(f"/proc/{ours.pid}/environ").read_bytes()  # wiped, as aiperf's are
        members = _session_of(ours.pid)
        for pid, kw in [(theirs.pid, {"start": 1}), (ours.pid, {"boot": "another-boot"}),
                        (os.getsid(0), {})]:
            _record(arm, pid, **kw)
            assert stop_leftover(arm, wait_s=2) == []
        arm.aiperf_process.write_text(json.dumps({"token": "0123abcd"}))
        assert stop_leftover(arm, wait_s=2) == []
        assert len(_session_of(ours.pid)) == 2

        _record(arm, ours.pid)
        assert stop_leftover(arm) == members
        assert _session_of(ours.pid) == [] and len(_session_of(theirs.pid)) == 2
        assert stop_leftover(arm) == []
        assert stop_leftover(ArmPaths(tmp_path / "never-loaded")) == []
    finally:
        for p in (ours, theirs):
            for pid in _session_of(p.pid):
                os.kill(pid, signal.SIGKILL)
            p.wait(5)


@pytest.mark.slow
def test_stop_leftover_stops_a_real_aiperf_left_by_a_killed_pipeline(server, tmp_path):
    """The load stage in a child process, SIGKILLed while aiperf sends: aiperf lives on in its own session,
    retitled, still loading the server; stop_leftover stops every process of it and nothing else."""
    from pipeline.stages.load import stop_leftover

    traces = tmp_path / "traces"
    write_traces(traces, replace(PRESETS["quickstart"], sessions=2, first_context_median=2_000,
                                 fresh_mean=500, output_mean=32, output_cap=64), seed=1)
    arm = ArmPaths(tmp_path / "off")
    load = (f"from pathlib import Path; from pipeline.config.load import LoadSpec; "
            f"from pipeline.paths import ArmPaths; from pipeline.stages.load import run_load; "
            f"run_load(LoadSpec(trace=Path({str(traces)!r}), concurrency=2, benchmark_duration_s=300, "
            f"timeout_s=600), url={server.url!r}, model={MODEL!r}, tokenizer={TOKENIZER!r}, "
            f"arm=ArmPaths(Path({str(arm.root)!r})))")
    # As from a shell: with pytest's PYTEST_CURRENT_TEST inherited, part of aiperf's environment stayed readable
    # after it retitled itself (enough for the token this once looked for); without, none of it does.
    shell_env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    controller = subprocess.Popen([sys.executable, "-c", load], cwd=ROOT, env=shell_env)
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    leader = None
    try:
        deadline = time.monotonic() + 120
        while not server.bodies:  # aiperf is up and sending
            assert controller.poll() is None and time.monotonic() < deadline, log_tail(arm.aiperf_log)
            time.sleep(0.2)
        controller.kill()
        controller.wait(10)
        leader = json.loads(arm.aiperf_process.read_text())["pid"]
        left, sent = _session_of(leader), len(server.bodies)
        assert len(left) >= 5 and all(Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"aiperf ")
                                      for p in left), left  # its services, retitled
        assert left == _writing_to(arm.aiperf_log)  # all of aiperf's processes, and no other
        time.sleep(1.5)
        assert len(server.bodies) > sent and _session_of(leader) == left  # it outlived the kill, still sending

        assert stop_leftover(arm) == left
        assert _session_of(leader) == [] and bystander.poll() is None  # all of it, and nothing else
        sent = len(server.bodies)
        time.sleep(1)
        assert len(server.bodies) == sent
    finally:
        controller.kill()
        controller.wait(10)
        if leader is not None:
            for pid in _session_of(leader):
                os.kill(pid, signal.SIGKILL)
        bystander.kill()
        bystander.wait(5)


def test_run_load_names_a_trace_dir_removed_after_validation(tmp_path):
    d = tmp_path / "t"
    write_traces(d, replace(PRESETS["quickstart"], sessions=1), seed=0)
    spec = LoadSpec(trace=d, benchmark_duration_s=5)
    shutil.rmtree(d)
    with pytest.raises(ValueError, match=r"load.trace: directory '.*t' does not exist"):
        run_load(spec, url="http://127.0.0.1:9", model=MODEL, tokenizer=TOKENIZER,
                 arm=ArmPaths(tmp_path / "a"))


@pytest.mark.slow
def test_run_load_against_the_emulator(tmp_path):
    """The project's own server (pipeline.emulator) under aiperf, small contexts to stay fast."""
    traces = tmp_path / "traces"
    write_traces(traces, replace(PRESETS["quickstart"], sessions=4, first_context_median=12_000,
                                 fresh_mean=2_000, output_mean=64, output_cap=128), seed=1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = open(tmp_path / "emulator.log", "w")
    emu = subprocess.Popen([sys.executable, "-m", "pipeline.emulator", "--host", "127.0.0.1",
                            "--port", str(port), "--model", MODEL, "--tokenizer", TOKENIZER],
                           stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"VATTN": "1"})
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", emu, tmp_path / "emulator.log")
        spec = LoadSpec(trace=traces, concurrency=4, benchmark_duration_s=15, grace_period_s=15,
                        timeout_s=240, min_records=2, warmup_requests=4)
        res = run_load(spec, url=f"http://127.0.0.1:{port}", model=MODEL, tokenizer=TOKENIZER,
                       arm=ArmPaths(tmp_path / "on"))
        assert res.returncode == 0 and res.records >= 2 and res.errors == 0
        # four sessions, four slots: the warm-up's four requests are the four first calls
        assert (res.warmup_primed, res.trace_sessions) == (4, 4)
    finally:
        emu.terminate()
        emu.wait(15)
        log.close()


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
    import urllib.request

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        assert proc.poll() is None, f"emulator exited: {log.read_text()[-2000:]}"
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"emulator not healthy after {timeout_s}s: {log.read_text()[-2000:]}")
