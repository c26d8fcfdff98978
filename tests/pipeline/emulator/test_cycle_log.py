"""The cycle log holds one server lifetime per file: a server restarted on the same arm folder (what
`pipeline run --resume` does) writes a new file instead of appending to the old one."""
from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from emu_harness import MODEL, free_port

from pipeline.engines.base import LaunchContext
from pipeline.engines.emulator import EmulatorEngine
from pipeline.hosts import LocalHost


def _serve_one_lifetime(arm_dir: Path, max_tokens: int) -> dict:
    """Start the emulator with the pipeline's own command for this arm folder, complete one request,
    stop it; returns its /server_info."""
    port = free_port()
    ctx = LaunchContext(model=MODEL, tokenizer=None, port=port, bind="127.0.0.1", server_args={"time_scale": 0.1},
                        launch=None, artifact_dir=str(arm_dir), python=sys.executable)
    proc = LocalHost().start(EmulatorEngine().command(ctx), env={}, log=str(arm_dir / "server.log"))
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                info = json.loads(urllib.request.urlopen(url + "/server_info", timeout=2).read())
                break
            except OSError:
                assert proc.poll() is None, (arm_dir / "server.log").read_text()[-2000:]
                time.sleep(0.1)
        body = json.dumps({"model": MODEL, "prompt": "one two three", "max_tokens": max_tokens,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        assert urllib.request.urlopen(req, timeout=60).status == 200
    finally:
        proc.stop(grace_s=15)  # SIGTERM: the emulator flushes its cycle log on the way out
    return info


def test_a_restarted_server_writes_a_new_cycle_log(tmp_path):
    arm_dir = tmp_path / "arms" / "on"
    first = _serve_one_lifetime(arm_dir, max_tokens=12)
    second = _serve_one_lifetime(arm_dir, max_tokens=20)

    logs = sorted(arm_dir.rglob("*.jsonl"))
    per_file = {p.name: [json.loads(x)["cycle"] for x in p.read_text().splitlines()] for p in logs}
    # Each lifetime counts its cycles from 1: a counter that goes back down means two servers in one file.
    mixed = {name: c for name, c in per_file.items() if any(b <= a for a, b in zip(c, c[1:]))}
    assert not mixed, f"cycle logs that mix server lifetimes: {sorted(mixed)}"
    assert len(logs) == 2 and all(per_file.values()), per_file
    assert (first["cycle_log"]["lifetime"], second["cycle_log"]["lifetime"]) == (1, 2)
    assert [Path(i["cycle_log"]["path"]) for i in (first, second)] == logs


def test_an_existing_cycle_log_file_is_refused(tmp_path):
    from pipeline.emulator.__main__ import main
    from pipeline.config.emulator import config_from_argv
    from pipeline.emulator.cyclelog import CycleLogError
    from pipeline.emulator.server import open_cycle_log

    log = tmp_path / "cycles.jsonl"
    log.write_text('{"cycle": 1}\n')
    with pytest.raises(CycleLogError, match=r"cycle_log: .*cycles\.jsonl exists; a cycle log holds one server "
                                            r"lifetime\. Remove it, pick a new file, or use --cycle-log-dir"):
        open_cycle_log(config_from_argv(["--cycle-log", str(log)]))
    assert main(["--cycle-log", str(log), "--cycle-log-dir", str(tmp_path)]) == 2  # one or the other
    assert log.read_text() == '{"cycle": 1}\n'
