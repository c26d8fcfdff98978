"""A small valid recipe on disk, with any top-level block replaced."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
TRACE = str(REPO / "recipes/data/traces/quickstart")
TOKENIZER = str(REPO / "recipes/data/tokenizer")


@pytest.fixture
def write_recipe(tmp_path):
    def write(**over) -> Path:
        base = {"name": "t", "engine": "emulator", "model": "m", "tokenizer": TOKENIZER,
                "arms": {"off": {"env": {"VATTN": "0"}}, "on": {"env": {"VATTN": "1"}}},
                "load": {"trace": TRACE, "benchmark_duration_s": 10, "timeout_s": 120}}
        base.update(over)
        path = tmp_path / "r.yaml"
        path.write_text(yaml.safe_dump(base))
        return path

    return write
