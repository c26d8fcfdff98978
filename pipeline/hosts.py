"""Where commands run: a small `Host` protocol, with a local (subprocess) and an SSH (fabric) implementation.

Stages only see `Host`; fabric is imported inside `SshHost`, so nothing else depends on it.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Protocol, Sequence

from pipeline.paths import exit_status_file


class HostError(RuntimeError):
    """A host could not be reached or a command could not be started there."""


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


class Process(Protocol):
    """A background process started by `Host.start`."""

    def poll(self) -> int | None: ...
    def stop(self, grace_s: float = 10.0) -> int | None: ...


class Host(Protocol):
    name: str
    kind: str   # the recipe's hosts.<name>.kind: "local", "ssh" or "slurm" (whose servers run where jobs land)

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            timeout: float | None = None) -> CommandResult: ...
    def start(self, argv: Sequence[str], *, env: Mapping[str, str], log: str) -> Process: ...
    def put(self, local: Path, remote: str) -> None: ...
    def get(self, remote: str, local: Path) -> None: ...
    def read_tail(self, path: str, lines: int = 40) -> str: ...


def shell_join(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The command as one shell line, env first: what `pipeline plan` prints and what SSH runs."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
    cmd = shlex.join(list(argv))
    return f"{prefix} {cmd}" if prefix else cmd


# ---------------------------------------------------------------- local


class LocalProcess:
    def __init__(self, popen: subprocess.Popen, log_file):
        self._popen = popen
        self._log_file = log_file
        self.pid = popen.pid

    def poll(self) -> int | None:
        return self._popen.poll()

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the whole process group (servers fork workers), SIGKILL after `grace_s`."""
        if self._popen.poll() is None:
            _signal_group(self.pid, signal.SIGTERM)
            try:
                self._popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.pid, signal.SIGKILL)
                self._popen.wait()
        self._log_file.close()
        return self._popen.returncode


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


class LocalHost:
    name = kind = "local"

    def run(self, argv, *, env=None, timeout=None) -> CommandResult:
        p = subprocess.run(list(argv), env={**os.environ, **(env or {})}, capture_output=True,
                           text=True, timeout=timeout)
        return CommandResult(p.returncode, p.stdout, p.stderr)

    def start(self, argv, *, env, log) -> LocalProcess:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log, "ab")
        try:
            popen = subprocess.Popen(list(argv), env={**os.environ, **env}, stdout=log_file,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        except OSError as e:
            log_file.close()
            raise HostError(f"local: cannot start {argv[0]!r}: {e}") from e
        return LocalProcess(popen, log_file)

    def put(self, local, remote) -> None:
        if Path(local).resolve() != Path(remote).resolve():
            _copy(Path(local), Path(remote))

    def get(self, remote, local) -> None:
        if Path(remote).resolve() != Path(local).resolve():
            _copy(Path(remote), Path(local))

    def read_tail(self, path, lines=40) -> str:
        try:
            return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def _copy(src: Path, dst: Path) -> None:
    import shutil

    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


# ---------------------------------------------------------------- ssh


# What SshProcess.poll returns for a process that ended without leaving its exit status: SIGKILL took the
# wrapper that records it along with the command, or an older pipeline started it without one. No exit code
# (0..255) and no signal death (-1..-64, subprocess's convention) has this value.
EXIT_UNKNOWN = -1000


def exit_text(code: int) -> str:
    """How an error message states a poll() result: 'with code 127', or that the status is unknown."""
    return "with an unknown exit status" if code == EXIT_UNKNOWN else f"with code {code}"


class SshProcess:
    """A remote process started under `setsid` by a wrapper `sh` (see `SshHost.start`); the wrapper's pid is
    the process group id, and the wrapper writes the command's exit status to `status` when it ends."""

    def __init__(self, host: "SshHost", pid: int, status: str):
        self._host, self.pid, self._status = host, pid, status

    def poll(self) -> int | None:
        """None while it runs; its exit status once ended (128+N for a death by signal N, as the shell gives
        it; 143 after `stop`'s SIGTERM); EXIT_UNKNOWN if it ended without leaving one."""
        r = self._host.run(["sh", "-c", 'kill -0 "$1" 2>/dev/null && echo running || cat "$2" 2>/dev/null',
                            "sh", str(self.pid), self._status])
        out = r.stdout.strip()
        if out == "running":
            return None
        return int(out) if out.isdigit() else EXIT_UNKNOWN

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the group, SIGKILL after `grace_s`; returns poll(): 143 after a SIGTERM the command did not
        handle, EXIT_UNKNOWN after a SIGKILL (None while the killed wrapper is not yet reaped)."""
        self._host.run(["kill", "-TERM", f"-{self.pid}"])
        deadline = time.monotonic() + grace_s
        while (code := self.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        if code is None:
            self._host.run(["kill", "-KILL", f"-{self.pid}"])
            code = self.poll()
        return code


class SshHost:
    """A remote machine reached over SSH with fabric. Remote paths are strings (POSIX)."""

    kind = "ssh"

    def __init__(self, name: str, address: str, *, user: str | None = None, port: int = 22,
                 key: str | None = None, connect_timeout: float = 10.0):
        self.name, self.address, self.user, self.port = name, address, user, port
        self._key, self._timeout = key, connect_timeout
        self._conn = None

    def _connection(self):
        if self._conn is None:
            from fabric import Connection

            kwargs = {"key_filename": self._key} if self._key else {}
            self._conn = Connection(self.address, user=self.user, port=self.port,
                                    connect_timeout=self._timeout, connect_kwargs=kwargs)
            try:
                self._conn.open()
            except Exception as e:  # paramiko/socket raise many kinds; all mean "unreachable"
                self._conn = None
                raise HostError(f"host {self.name!r} ({self.user or ''}@{self.address}:{self.port}) "
                                f"is unreachable over SSH: {e}. Check hosts.{self.name}.address/port/user/key "
                                f"and that `{self.ssh_command()}` works.") from e
        return self._conn

    def ssh_command(self) -> str:
        """The OpenSSH command that connects as `_connection` does (same port, user and key): the check an
        unreachable-host error suggests. Without user or key both fall back alike (current user; agent/~/.ssh)."""
        argv = ["ssh", "-p", str(self.port)]
        argv += ["-l", self.user] if self.user else []
        argv += ["-i", self._key] if self._key else []
        return shlex.join([*argv, self.address])

    def run(self, argv, *, env=None, timeout=None) -> CommandResult:
        r = self._connection().run(shell_join(argv, env), hide=True, warn=True, timeout=timeout,
                                   in_stream=False)
        return CommandResult(r.exited, r.stdout, r.stderr)

    def start(self, argv, *, env, log) -> SshProcess:
        status = exit_status_file(log)
        log_q, status_q = shlex.quote(log), shlex.quote(status)
        # The wrapper `sh` runs the command and writes its exit status to `status` (poll reads it: the remote
        # process is no child of ours). It catches TERM with a no-op so that stop's SIGTERM to the group ends the
        # command but not the wrapper, which then records 143; a caught signal is default again in the command.
        # The wrapper's own stderr goes nowhere (a shell reports a command's death by signal, "Terminated"), the
        # command's to the log; in a subshell, as dash applies a command's redirections in the waiting shell. The
        # subshell execs the command: a subshell of its own would die of the TERM at once and the wrapper would
        # record an end while the server still shuts down.
        # `env` because the command's leading VAR=value would otherwise be taken as the program.
        # `;` not `&&`: `a && b &` backgrounds a subshell that holds the SSH channel open until b exits.
        wrapper = shlex.quote('trap : TERM; exec 3>&2 2>/dev/null; (exec "$@" 2>&3 3>&-); echo $? > "$0"')
        line = (f"mkdir -p $(dirname {log_q}); rm -f {status_q}; setsid nohup sh -c {wrapper} {status_q} "
                f"env {shell_join(argv, env)} >>{log_q} 2>&1 < /dev/null & echo $!")
        r = self._connection().run(line, hide=True, warn=True, in_stream=False)
        if r.exited != 0 or not r.stdout.strip().isdigit():
            raise HostError(f"host {self.name!r}: cannot start {argv[0]!r}: {r.stderr.strip()}")
        return SshProcess(self, int(r.stdout.strip()), status)

    def put(self, local, remote) -> None:
        self._connection().put(str(local), remote)

    def get(self, remote, local) -> None:
        """Pull a file, or a directory recursively (fabric's get is per file)."""
        conn = self._connection()
        listing = self.run(["find", remote, "-type", "f"])
        if listing.returncode != 0:
            raise HostError(f"host {self.name!r}: cannot list {remote}: {listing.stderr.strip()}")
        files = listing.stdout.split()
        is_dir = files != [remote]
        for f in files:
            dest = Path(local) / os.path.relpath(f, remote) if is_dir else Path(local)
            dest.parent.mkdir(parents=True, exist_ok=True)
            conn.get(f, str(dest))

    def read_tail(self, path, lines=40) -> str:
        return self.run(["tail", "-n", str(lines), path]).stdout

    def kill_writers(self, log: str) -> list[int]:
        """SIGKILL the process group of every remote process whose stdout is `log` (how `start` runs a server,
        under setsid) and return the groups: a server left by a killed run would hold its port. Reads the
        remote /proc, so a Linux host."""
        script = ('t=$(readlink -f "$1") || exit 0; for d in /proc/[0-9]*; do '
                  '[ "$(readlink "$d/fd/1" 2>/dev/null)" = "$t" ] || continue; '
                  'g=$(ps -o pgid= -p "${d#/proc/}" | tr -d " "); '
                  '[ -n "$g" ] && [ "$g" != "$(ps -o pgid= -p $$ | tr -d " ")" ] && kill -s KILL -- "-$g" && echo "$g"; '
                  'done; true')
        r = self.run(["sh", "-c", script, "sh", log])
        return sorted({int(g) for g in r.stdout.split() if g.isdigit()})
