"""The manifest's stage entries, read back from the file as a resume and the report read them."""
from __future__ import annotations

import json

from analysis.provenance import stage_rows
from pipeline.manifest import Manifest


def test_a_stage_that_failed_then_finished_shows_no_error(tmp_path):
    """An interrupted load resumed to completion: its entry must not keep the interruption's error."""
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"stages": {}}))
    m = Manifest.load(path)
    m.mark("on", "load", "running")
    m.mark("on", "load", "failed", error="KeyboardInterrupt: ")
    assert json.loads(path.read_text())["stages"]["on"]["load"]["error"] == "KeyboardInterrupt: "
    m.mark("on", "load", "running")  # the resume
    assert not {"error", "finished"} & json.loads(path.read_text())["stages"]["on"]["load"].keys()
    m.mark("on", "load", "done", cycle_log_lifetime=2)
    entry = json.loads(path.read_text())["stages"]["on"]["load"]
    assert entry["status"] == "done" and "error" not in entry and entry["cycle_log_lifetime"] == 2
    assert stage_rows(json.loads(path.read_text()))[0][:3] == ("on", "load", "done")
