"""The CI entry point and the test configuration name only files that exist."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cited_paths(text: str) -> list[str]:
    """Repository paths a script or config mentions: tests/..., pipeline/..., ... ending in a file suffix."""
    return re.findall(r"\b((?:tests|pipeline|analysis|vattn|recipes|configs)/[\w./-]+\.(?:py|yaml|txt|json))", text)


def test_ci_run_cites_existing_files():
    for name in (".ci/run", "tox.ini"):
        cited = cited_paths((REPO / name).read_text())
        missing = [p for p in cited if not (REPO / p).exists()]
        assert not missing, f"{name} cites files that do not exist: {missing}"
    assert cited_paths((REPO / ".ci/run").read_text()), ".ci/run should say where its SSH tests live"
