"""Fixtures for the emulator tests; helpers live in emu_harness.py."""
from __future__ import annotations

import pytest
from emu_harness import Emulator, start_emulator


@pytest.fixture
def emulator(tmp_path):
    """Factory: emulator(*flags, env=..., name=...) -> Emulator; all are stopped at teardown."""
    started: list[Emulator] = []

    def start(*args: str, env: dict | None = None, name: str = "emu") -> Emulator:
        emu = start_emulator(tmp_path, *args, env=env, name=name)
        started.append(emu)
        return emu

    yield start
    for emu in started:
        emu.stop()
