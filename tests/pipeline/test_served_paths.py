"""The server stage's record of what served the calls of an sglang run: the vattn wrapper's base
backend and path counts, read from the server log after the server stops, noted in the manifest."""
from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.manifest import Manifest
from pipeline.stages.server import served_paths

LOGS = Path(__file__).resolve().parents[1] / "analysis" / "data" / "sglang_logs"


def test_served_paths_of_a_vattn_server_log(tmp_path):
    log = tmp_path / "server.log"
    shutil.copy(LOGS / "off.server.log", log)
    assert served_paths(log) == {
        "base_backend": "flashinfer", "processes": 1,
        "paths": {"vattn": {"target_verify": 0, "draft_extend": 0, "decode": 0, "extend": 0, "other": 0},
                  "base": {"target_verify": 300, "draft_extend": 300, "decode": 0, "extend": 60, "other": 0}}}


def test_no_counters_no_record(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[t] The server is fired up and ready to roll!\n")
    assert served_paths(log) == {} and served_paths(tmp_path / "missing.log") == {}


def test_note_adds_to_a_stage_without_changing_its_status(tmp_path):
    m = Manifest(tmp_path / "manifest.json", {"stages": {}})
    m.mark("off", "server", "done", pid=7)
    m.note("off", "server", base_backend="fa3")
    entry = Manifest.load(tmp_path / "manifest.json").stage("off", "server")
    assert (entry["status"], entry["pid"], entry["base_backend"]) == ("done", 7, "fa3")
