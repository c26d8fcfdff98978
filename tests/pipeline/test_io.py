"""pipeline.io's atomic writes: whole files, with the mode a plain open() gives."""
from __future__ import annotations

import json
import os
import stat

import pytest

from pipeline import io


@pytest.mark.parametrize("write", [io.write_json_atomic, io.write_json_exclusive])
def test_written_files_take_the_umask_not_mkstemps_0600(tmp_path, write):
    """Run dirs on a shared file system are read by others: a report or manifest must not be owner-only."""
    umask = os.umask(0o022)
    try:
        path = tmp_path / "manifest.json"
        write(path, {"a": 1})
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert json.loads(path.read_text()) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_an_exclusive_write_never_replaces(tmp_path):
    path = tmp_path / "claim.json"
    io.write_json_exclusive(path, {"first": True})
    with pytest.raises(FileExistsError):
        io.write_json_exclusive(path, {"first": False})
    assert io.read_json(path) == {"first": True} and len(list(tmp_path.iterdir())) == 1
