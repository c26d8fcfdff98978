"""The manifest's stage entries, read back from the file as a resume and the report read them."""
from __future__ import annotations

import json

from analysis.provenance import stage_rows, wall_time
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


def test_wall_time_sums_the_invocations_and_leaves_out_the_gap_before_a_resume():
    """A run interrupted after 100 s and resumed a day later, which then ran 50 s more: 150 s, not a day."""
    manifest = {"created": "2026-12-01T10:00:00Z", "finished": "2026-12-02T10:00:50Z", "stages": {},
                "invocations": [{"started": "2026-12-01T10:00:00Z", "finished": "2026-12-01T10:01:40Z"},
                                {"started": "2026-12-02T10:00:00Z", "finished": "2026-12-02T10:00:50Z"}]}
    assert wall_time(manifest) == "150.0 s (over 2 invocations, the gaps between them not counted)"


def test_a_killed_invocation_counts_to_its_last_stage_time():
    """SIGKILL leaves a span without its end: it ends at the last stage time written before the next span."""
    manifest = {"created": "2026-12-01T10:00:00Z", "finished": "2026-12-02T10:00:50Z",
                "stages": {"off": {"server": {"started": "2026-12-01T10:00:01Z", "finished": "2026-12-01T10:00:30Z"},
                                   "load": {"started": "2026-12-01T10:00:30Z", "finished": "2026-12-02T10:00:40Z"}}},
                "invocations": [{"started": "2026-12-01T10:00:00Z", "finished": None},
                                {"started": "2026-12-02T10:00:00Z", "finished": "2026-12-02T10:00:50Z"}]}
    assert wall_time(manifest) == ("80.0 s (over 2 invocations, the gaps between them not counted; "
                                   "1 ended without recording its end: counted to its last stage time)")


def test_a_manifest_from_before_invocations_keeps_created_to_finished(tmp_path):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"created": "2026-12-01T10:00:00Z", "finished": "2026-12-01T10:03:11Z", "stages": {}}))
    m = Manifest.load(path)
    m.close_invocation(m.open_invocation())  # a resume of such a run records no span: it would miss the first run's
    assert "invocations" not in json.loads(path.read_text())
    assert wall_time(json.loads(path.read_text())) == "191.0 s"


def test_versions_name_the_analysis_libraries_the_report_is_computed_with():
    from pipeline.manifest import package_versions

    versions = package_versions()
    for name in ("numpy", "matplotlib", "pandas", "pydantic"):
        assert name in versions, name


def test_a_sub_second_stage_keeps_its_duration(tmp_path):
    """Whole-second stamps showed a 0.5 s server start as 0.0 s or 1.0 s."""
    import time

    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"stages": {}}))
    m = Manifest.load(path)
    m.mark("off", "server", "running")
    time.sleep(0.3)
    m.mark("off", "server", "done")
    shown = float(stage_rows(json.loads(path.read_text()))[0][3].removesuffix(" s"))
    assert 0.25 <= shown < 0.9


def test_machine_facts_and_load_average_of_this_machine():
    from pipeline.hosts import LocalHost
    from pipeline.manifest import load_average, machine_facts

    facts = machine_facts(LocalHost())
    assert facts["hostname"] and facts["cpus"] >= 1
    assert isinstance(load_average(LocalHost()), float)
