"""Runner pieces that a killed run depends on, with real processes."""
from __future__ import annotations

import sys
import time

from pipeline.hosts import LocalHost
from pipeline.manifest import Manifest
from pipeline.plan import ArmRun


def _arm_run(argv: tuple[str, ...]) -> ArmRun:
    return ArmRun(name="on", arm="on", round=1, group=1, host="local", gpus=(), port=1, url="http://x",
                  env={}, argv=argv, artifact_dir="/tmp", local_dir="/tmp")


def test_resume_stops_a_server_left_by_a_killed_run_and_nothing_else(tmp_path):
    from pipeline.runner import _kill_leftover

    argv = (sys.executable, "-c", "import time; time.sleep(60)", "server-of-arm-on")
    ours = LocalHost().start(argv, env={}, log=str(tmp_path / "a.log"))
    other = LocalHost().start((sys.executable, "-c", "import time; time.sleep(60)"), env={},
                              log=str(tmp_path / "b.log"))
    manifest = Manifest(tmp_path / "manifest.json", {"stages": {"on": {"server": {"pid": ours.pid}}}})
    time.sleep(0.3)

    _kill_leftover(manifest, _arm_run(argv))
    time.sleep(0.3)
    assert ours.poll() is not None

    # A recorded pid now owned by a different command is left alone.
    manifest.data["stages"]["on"]["server"]["pid"] = other.pid
    _kill_leftover(manifest, _arm_run(argv))
    assert other.poll() is None
    other.stop(grace_s=1)
    ours.stop(grace_s=1)
