"""Build a small but real run directory: real aiperf runs against tests/analysis/stream_server.py.

    python tests/analysis/analysis_make_fixture.py OUT_DIR [--slim]
    python tests/analysis/analysis_make_fixture.py --slim-only RUN_DIR   # slim a copy of e.g. a quickstart run

Arm runs: off (6 ms/token), on (4.5 ms/token, the "faster kernel"), off.2 (repeat of off, for
the A/A noise floor). Every 11th request gets HTTP 500, so error records are real too.
`--slim` drops aiperf's http_req_* trace metrics from the records (analysis does not read
them) so the committed copy under tests/analysis/data/ stays small; the records are otherwise
aiperf's own lines.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pipeline.io import write_json_atomic
from pipeline.paths import RunPaths

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TOKENIZER = REPO / "recipes" / "data" / "tokenizer"
ARM_RUNS = [("off", "off", 1, 6.0), ("on", "on", 1, 4.5), ("off.2", "off", 2, 6.0)]
AIPERF_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(port: int, proc: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"stream_server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"stream_server on port {port} did not come up in {timeout_s} s")


def aiperf_command(port: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "aiperf", "profile", "-m", "tiny", "--url", f"http://127.0.0.1:{port}", "--endpoint-type", "chat",
            "--streaming", "--tokenizer", str(TOKENIZER), "--conversation-num", "12",
            "--conversation-turn-mean", "3", "--conversation-turn-stddev", "0",
            "--synthetic-input-tokens-mean", "40", "--output-tokens-mean", "16", "--output-tokens-stddev", "4",
            "--concurrency", "4", "--warmup-request-count", "2", "--random-seed", "7",
            "--server-metrics-formats", "json", "--export-level", "records", "--ui", "none",
            "--artifact-dir", str(out)]


def run_arm(paths: RunPaths, name: str, itl_ms: float) -> dict:
    arm = paths.arm(name)
    arm.root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = subprocess.Popen([sys.executable, str(HERE / "stream_server.py"), "--port", str(port),
                               "--itl-ms", str(itl_ms), "--fail-every", "11", "--seed", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = time.time()
    try:
        wait_up(port, server)
        cmd = aiperf_command(port, arm.aiperf_dir)
        arm.aiperf_scratch.mkdir(exist_ok=True)  # aiperf's mmap dataset, as the load stage places it
        with open(arm.aiperf_log, "w") as log:
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=AIPERF_TIMEOUT_S, check=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1",
                                "AIPERF_DATASET_MMAP_BASE_PATH": str(arm.aiperf_scratch)})
    finally:
        shutil.rmtree(arm.aiperf_scratch, ignore_errors=True)
        server.terminate()
        server.wait(10)
    return {"command": " ".join(cmd), "started": started, "finished": time.time()}


KEEP = ("profile_export.jsonl", "phase_manifest.json", "server_metrics_export.json", "load_result.json")
MAX_CYCLES = 100


def slim_run(root: Path) -> None:
    """Keep only what analysis reads, so a committed copy stays small.

    Drops aiperf's other artifacts, the http_req_* trace metrics and per-chunk latency arrays
    from the records (analysis reads neither), and keeps the first MAX_CYCLES lines of an
    emulator cycle log. Accuracy records are kept whole.
    """
    paths = RunPaths(Path(root))
    for name in paths.arm_runs():
        arm = paths.arm(name)
        logs = [*arm.emulator_cycle_logs().values(), arm.legacy_emulator_cycles]
        for p in sorted(arm.root.rglob("*"), reverse=True):
            if p.is_file() and p.name not in KEEP and p.parent != arm.accuracy_dir and p not in logs:
                p.unlink()
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()
        slim(arm.profile_export)
        for log in (p for p in logs if p.is_file()):
            lines = log.read_text().splitlines()[:MAX_CYCLES]
            log.write_text("\n".join(lines) + "\n")


def slim(export: Path) -> None:
    lines = []
    for line in export.read_text().splitlines():
        rec = json.loads(line)
        rec["metrics"] = {k: v for k, v in rec.get("metrics", {}).items()
                          if not k.startswith("http_req_") and k != "inter_chunk_latency"}
        lines.append(json.dumps(rec, separators=(",", ":")))
    export.write_text("\n".join(lines) + "\n")


def build(out: Path, slim_records: bool = False, arm_runs: list[tuple[str, str, int, float]] = ARM_RUNS) -> Path:
    paths = RunPaths(Path(out))
    stages, commands = {}, {}
    for name, _, _, itl in arm_runs:
        info = run_arm(paths, name, itl)
        commands[name] = info["command"]
        stages[name] = {"load": {"status": "done", "started": info["started"], "finished": info["finished"]}}
    write_json_atomic(paths.manifest, {
        "recipe": {"name": "analysis-fixture", "engine": "stream_server", "load": {"seed": 7, "trace": "synthetic"}},
        "plan": {"arms": ["off", "on"], "order": ", ".join(n for n, *_ in arm_runs), "commands": commands},
        "arm_runs": [{"name": n, "arm": a, "order": o} for n, a, o, _ in arm_runs],
        "env_diff": {"STREAM_ITL_MS": {"off": "6.0", "on": "4.5"}},
        "versions": {"aiperf": "0.13.0", "python": sys.version.split()[0]},
        "git_sha": "fixture", "started": stages["off"]["load"]["started"],
        "finished": stages[arm_runs[-1][0]]["load"]["finished"], "stages": stages,
    })
    if slim_records:
        slim_run(paths.root)
    return paths.root


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--slim", action="store_true")
    ap.add_argument("--slim-only", action="store_true", help="only slim the existing run dir OUT")
    a = ap.parse_args()
    if a.slim_only:
        slim_run(a.out)
    else:
        print(build(a.out, a.slim))
