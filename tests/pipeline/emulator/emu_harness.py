"""Start the real emulator (python -m pipeline.emulator) in a subprocess on a free port.

A uniquely named module (not conftest) so `from emu_harness import ...` cannot pick up another
directory's conftest."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


REPO = Path(__file__).resolve().parents[3]
TOKENIZER = REPO / "recipes" / "data" / "tokenizer"
MODEL = "emu"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Emulator:
    url: str
    proc: subprocess.Popen
    log: Path
    cycle_log: Path

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, **kw)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path: str, data: bytes) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def cycles(self) -> list[dict]:
        return [json.loads(line) for line in self.cycle_log.read_text().splitlines()]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_emulator(tmp: Path, *args: str, env: dict | None = None, name: str = "emu",
                   timeout: float = 60) -> Emulator:
    port = free_port()
    log, cycle_log = tmp / f"{name}.log", tmp / f"{name}.cycles.jsonl"
    cmd = [sys.executable, "-m", "pipeline.emulator", "--host", "127.0.0.1", "--port", str(port),
           "--model", MODEL, "--cycle-log", str(cycle_log), *args]
    full_env = {**os.environ, **(env or {})}
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
    emu = Emulator(f"http://127.0.0.1:{port}", proc, log, cycle_log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"emulator exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if emu.get("/health")[0] == 200:
                return emu
        except OSError:
            pass
        time.sleep(0.1)
    emu.stop()
    raise RuntimeError(f"emulator not healthy after {timeout}s:\n{log.read_text()[-3000:]}")
