"""Server stage: start one arm's engine on its host, wait until it serves, record its facts, stop it.

Works the same for every engine (the adapter only names the command and endpoints) and every host.
"""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.engines.base import Engine
from pipeline.hosts import Host, Process, exit_text
from pipeline.io import write_json_atomic
from pipeline.paths import ArmPaths
from pipeline.plan import ArmRun


class ServerError(RuntimeError):
    """The server did not come up; the message carries the tail of its log."""


@dataclass(frozen=True)
class ServerResult:
    url: str
    command: str
    host: str
    gpus: list[int]
    startup_s: float
    info: dict


def port_in_use(host: Host, port: int) -> bool:
    """True if something listens on `port` on the host (checked from the host itself)."""
    probe = ["python3", "-c", "import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, "
             "socket.SO_REUSEADDR, 1)\ntry: s.bind(('0.0.0.0', int(sys.argv[1])))\nexcept OSError: sys.exit(3)",
             str(port)]
    if host.kind in ("local", "slurm"):  # a job's node is not known yet
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                return True
        return False
    return host.run(probe).returncode == 3


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def wait_healthy(proc: Process, host: Host, url: str, log: str, timeout_s: float,
                 progress=lambda msg: None, program: str = "") -> float:
    """Poll until `url` answers 200; fail fast if the process dies. Returns seconds waited.

    program: the command's first word, named when the host could not run it (exit code 126 or 127)."""
    t0 = time.monotonic()
    last_note = t0
    while True:
        code = proc.poll()
        if code is not None:
            raise ServerError(f"server exited {exit_text(code)} before becoming healthy"
                              f"{_not_run_hint(code, host, program)}; last lines of {log}:\n{host.read_tail(log)}")
        try:
            healthy = _get(url, timeout=2.0)[0] == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            healthy = False
        if healthy:
            check_still_running(proc, host, url, log)
            return time.monotonic() - t0
        now = time.monotonic()
        if now - t0 > timeout_s:
            proc.stop()
            raise ServerError(f"server not healthy at {url} after {timeout_s:.0f}s "
                              f"(server.startup_timeout_s); last lines of {log}:\n{host.read_tail(log)}")
        if now - last_note > 30:
            progress(f"waiting for {url} ({now - t0:.0f}s)")
            last_note = now
        time.sleep(0.5)


def check_still_running(proc: Process, host: Host, url: str, log: str) -> None:
    """A healthy answer counts only while our process runs: one that died (its port taken, say) leaves the
    answer to whatever else listens there, and the arm would record and load another server."""
    code = proc.poll()
    if code is not None:
        raise ServerError(f"server exited {exit_text(code)}, yet {url} answered: another process serves that "
                          f"port on host {host.name!r}; stop it or pick a free server.port; last lines of "
                          f"{log}:\n{host.read_tail(log)}")


def _not_run_hint(code: int, host: Host, program: str) -> str:
    """126 / 127 are the shell's 'found but not executable' / 'not found': name the fields that pick the program."""
    if code not in (126, 127) or host.kind == "local":  # locally a missing program fails at start (HostError)
        return ""
    field = f"hosts.{host.name}.slurm.python" if host.kind == "slurm" else f"hosts.{host.name}.python"
    what = "was not found" if code == 127 else "is not executable"
    return (f": a program of its command {what} on host {host.name!r} (the command starts with {program!r}); "
            f"set {field} to an interpreter there that has the engine installed (or, for vllm, server.launch "
            f"to its launch command there)")


def fetch_info(engine: Engine, base_url: str) -> dict:
    for path in engine.info_paths:
        try:
            code, body = _get(base_url + path)
            if code == 200:
                return json.loads(body)
        except (urllib.error.URLError, OSError, ValueError):
            continue
    return {}


def served_url(proc: Process, planned: str) -> str:
    """The planned URL, with the node a scheduler placed the server on (a Slurm job's) as its host."""
    node = getattr(proc, "node", None)
    if not node:
        return planned
    parts = urllib.parse.urlsplit(planned)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{node}:{parts.port}"))


def start_server(engine: Engine, arm_run: ArmRun, host: Host, arm: ArmPaths, *, timeout_s: float,
                 progress=lambda msg: None, started=lambda proc: None) -> tuple[Process, ServerResult]:
    """Start the server and wait for health. The caller stops the returned process. `started(proc)` runs as soon
    as the process exists (the runner records its pid, so that a resume can stop a server a kill left behind).
    Until this returns, anything that goes wrong, a SIGTERM's KeyboardInterrupt included, stops the server."""
    if port_in_use(host, arm_run.port):
        raise ServerError(f"server.port: port {arm_run.port} on host {arm_run.host!r} is in use; pick a free "
                          f"port in the recipe or stop what listens there")
    log = f"{arm_run.artifact_dir}/server.log"
    for here, there in arm_run.uploads:
        host.run(["mkdir", "-p", there.rsplit("/", 1)[0]])
        host.put(Path(here), there)
    proc = host.start(arm_run.argv, env=arm_run.env, log=log)
    try:
        started(proc)
        url = served_url(proc, arm_run.url)
        waited = wait_healthy(proc, host, url + engine.health_path, log, timeout_s, progress, arm_run.argv[0])
        info = fetch_info(engine, url)
        check_still_running(proc, host, url, log)  # the info is this server's only if it still runs
        write_json_atomic(arm.server_info, info)
    except BaseException:
        proc.stop()
        if host.kind != "local":
            host.get(log, arm.server_log)
        raise
    return proc, ServerResult(url=url, command=arm_run.command_line, host=arm_run.host,
                              gpus=list(arm_run.gpus), startup_s=round(waited, 2), info=info)


def save_result(result, path: Path) -> None:
    write_json_atomic(path, asdict(result))


def served_paths(log: Path) -> dict:
    """sglang with the vattn backend: {"base_backend", "paths": {"vattn": {mode: n}, "base": {...}},
    "processes"} from the server log's path counters; {} when the log has none (another engine, a
    server that died before its first line). Read after the server stopped: its exit line is the last."""
    from vattn.sglang.counters import parse_log  # pure Python: no sglang or torch

    if not Path(log).is_file():
        return {}
    counts = parse_log(Path(log).read_text(errors="replace"))
    if not counts["processes"]:
        return {}
    return {"base_backend": counts["base_backend"], "processes": counts["processes"],
            "paths": {k: counts[k] for k in ("vattn", "base")}}
