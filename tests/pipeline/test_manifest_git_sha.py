"""The manifest's git sha: this checkout's commit, unless PIPELINE_GIT_SHA names the commit a copied tree came from."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.manifest import git_sha

REPO = Path(__file__).resolve().parents[2]


def test_git_sha_names_this_checkouts_commit(monkeypatch):
    monkeypatch.delenv("PIPELINE_GIT_SHA", raising=False)
    head = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=REPO, capture_output=True, text=True) \
        if shutil.which("git") else None
    if head is None or head.returncode != 0:
        pytest.skip("not a git checkout")
    sha = head.stdout.strip()
    assert len(sha) == 40 and git_sha() in (sha, sha + "-dirty")


def test_an_explicit_sha_wins_over_the_checkouts_own(monkeypatch):
    # a tree copied to a GPU host can carry a stale .git: the commit it was copied from is what the run used
    monkeypatch.setenv("PIPELINE_GIT_SHA", "bac34fe1606208b23012ddd97ffe71f976aa916c")
    assert git_sha() == "bac34fe1606208b23012ddd97ffe71f976aa916c"
