"""End to end, no doubles: concurrent placement with a swap on this CPU machine.

Two real emulator servers at once (one per GPU-set slot, told apart by port), real aiperf against each,
then the swapped group, then the real report with its "Placement: concurrent with swap" section. Run twice:
without GPU binding, and with TP2 pairs of GPU ids 0-3 (recipes/h200x4-sglang-tp2-concurrent.yaml's placement;
the emulator ignores CUDA_VISIBLE_DEVICES, so the ids need not exist here).
"""
from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def free_port_pair() -> int:
    """A port P with P and P + 1 free: concurrent arms use server.port and server.port + 1."""
    rng = random.Random()
    for _ in range(200):
        p = rng.randrange(31000, 39000)
        socks = []
        try:
            for q in (p, p + 1):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no two consecutive free ports in 31000-39000")


def make_recipe(tmp_path: Path, port: int, gpus_per_arm: int = 0) -> Path:
    trace = tmp_path / "trace"
    subprocess.run([sys.executable, "-m", "pipeline.tracegen", "traces", "--out", str(trace), "--preset",
                    "quickstart", "--sessions", "6", "--first-context-median", "8000", "--max-context", "40000",
                    "--output-mean", "120"], cwd=REPO, check=True, capture_output=True, timeout=60)
    recipe = {
        "name": "concurrent-e2e", "engine": "emulator", "model": "qwen3.5-397b-a17b-emulated",
        "tokenizer": str(REPO / "recipes/data/tokenizer"),
        "arms": {"off": {"env": {"VATTN": "0"}}, "on": {"env": {"VATTN": "1", "VATTN_PLAN": "balanced"}}},
        "server": {"args": {"hardware": "h200", "model_preset": "qwen3.5-397b-a17b-tp2",
                            "max_running_requests": 16}, "port": port, "startup_timeout_s": 120},
        "placement": {"mode": "concurrent", "swap": True, "gpus_per_arm": gpus_per_arm},
        # 20 s window; the grace lets requests in flight at the window's end finish (aiperf drops the
        # rest), and the timeout bounds a stuck aiperf on a loaded machine.
        "load": {"trace": str(trace), "concurrency": 6, "benchmark_duration_s": 20, "grace_period_s": 20,
                 "timeout_s": 150, "seed": 7},
    }
    if gpus_per_arm:
        recipe["hosts"] = {"local": {"kind": "local", "gpus": list(range(2 * gpus_per_arm))}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def ts(s: str) -> datetime:
    return datetime.fromisoformat(s)


def request_span(arm_dir: Path) -> tuple[int, int, int]:
    """(first request start ns, last request end ns, completed records) of an arm run's aiperf export."""
    lines = [json.loads(x) for x in (arm_dir / "aiperf/profile_export.jsonl").read_text().splitlines() if x.strip()]
    meta = [x["metadata"] for x in lines]
    ok = sum(1 for x in lines if not x.get("error") and "inter_token_latency" in x.get("metrics", {}))
    return min(m["request_start_ns"] for m in meta), max(m["request_end_ns"] for m in meta), ok


@pytest.mark.parametrize("gpus_per_arm", [0, 2], ids=["no-gpus", "tp2-pairs"])
def test_concurrent_swap_ab_end_to_end(tmp_path, gpus_per_arm):
    port = free_port_pair()
    out = tmp_path / "run"
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "pipeline.cli", "run", str(make_recipe(tmp_path, port, gpus_per_arm)),
                        "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]

    m = json.loads((out / "manifest.json").read_text())
    runs = {a["name"]: a for a in m["arm_runs"]}
    assert sorted(runs) == ["off", "off.2", "on", "on.2"]
    assert all(m["stages"][n][s]["status"] == "done" for n in runs for s in ("server", "load"))
    groups = {g: [n for n, a in runs.items() if a["group"] == g] for g in (0, 1)}
    assert sorted(groups[0]) == ["off", "on"] and sorted(groups[1]) == ["off.2", "on.2"]

    # Both ports served, and the swap moved each arm to the other one.
    assert (runs["off"]["port"], runs["on"]["port"]) == (port, port + 1)
    assert (runs["off.2"]["port"], runs["on.2"]["port"]) == (port + 1, port)
    pair_a, pair_b = ([0, 1], [2, 3]) if gpus_per_arm else ([], [])
    assert [runs[n]["gpus"] for n in ("off", "on", "off.2", "on.2")] == [pair_a, pair_b, pair_b, pair_a]
    spans = {}
    for name, a in runs.items():
        arm = out / "arms" / name
        info = json.loads((arm / "server_info.json").read_text())
        load = json.loads((arm / "load_result.json").read_text())
        assert info["config"]["port"] == a["port"] and f"http://127.0.0.1:{a['port']}" in load["command"]
        assert load["records"] > 0 and load["errors"] == 0, load
        spans[name] = request_span(arm)
        assert spans[name][2] >= 5, f"{name}: only {spans[name][2]} completed requests"

    # Each group's two arm runs overlapped: the manifest's load stages, and the requests themselves.
    stage = lambda n, s, k: ts(m["stages"][n][s][k])  # noqa: E731
    for a, b in (("off", "on"), ("off.2", "on.2")):
        assert abs((stage(a, "load", "started") - stage(b, "load", "started")).total_seconds()) <= 2
        assert max(stage(a, "load", "started"), stage(b, "load", "started")) < \
            min(stage(a, "load", "finished"), stage(b, "load", "finished"))
        overlap = min(spans[a][1], spans[b][1]) - max(spans[a][0], spans[b][0])
        assert overlap > 0.5 * (spans[a][1] - spans[a][0]), f"{a}/{b} overlapped only {overlap / 1e9:.1f}s"
    # ... and the groups did not: group 2's servers started after group 1's loads ended, and no request of
    # group 2 began before the last one of group 1 ended.
    end_1 = max(stage(n, "load", "finished") for n in groups[0])
    assert all(stage(n, "server", "started") >= end_1 for n in groups[1])
    assert max(spans[n][1] for n in groups[0]) < min(spans[n][0] for n in groups[1])

    report = (out / "report.md").read_text()
    sec = report.split("## Placement: concurrent with swap\n", 1)[1].split("\n## ", 1)[0]
    assert "group 1: off on A, on on B; group 2 (swapped): off.2 on B, on.2 on A." in sec
    sets = ("A (local, GPU 0,1); B (local, GPU 2,3)" if gpus_per_arm else
            f"A (local, no GPU binding, port {port}); B (local, no GPU binding, port {port + 1})")
    assert sets in sec
    for label in ("kernel: on vs off, both groups pooled", "GPU set: B vs A, both arms pooled (A/A)"):
        assert f"| {label} | Decode time per token (ms) |" in sec
    assert "| 1 (off / on) | A | B |" in sec and "| 2 (off.2 / on.2) | B | A |" in sec
    assert elapsed < 300, f"concurrent e2e took {elapsed:.0f}s; keep it under ~4 minutes on 2 cores"
