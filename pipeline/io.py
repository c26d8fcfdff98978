"""Atomic file writes: a crash leaves either the old file or the new one, never half of one."""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new temporary file next to `path`, created as open() creates files (0666 less the umask): mkstemp's
    would be 0600, and run dirs on a shared file system (Slurm hosts) are read by colleagues."""
    while True:
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def write_json_exclusive(path: Path, obj: Any) -> None:
    """Create `path` whole, or raise FileExistsError if it exists: of writers racing for one path exactly
    one wins. The file is written aside and hard-linked into place, since link(2), unlike rename(2), never
    replaces an existing file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())
