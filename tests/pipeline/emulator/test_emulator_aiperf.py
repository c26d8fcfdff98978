"""The real aiperf client against the real emulator: a small synthetic streaming chat load."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from emu_harness import MODEL, TOKENIZER

REQUESTS, OUT_TOKENS = 16, 100


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("aiperf") is None, reason="aiperf is not installed")
def test_aiperf_profile_writes_records(emulator, tmp_path):
    emu = emulator("--tokenizer", str(TOKENIZER), env={"VATTN": "1"})
    out = tmp_path / "aiperf"
    cmd = ["aiperf", "profile", "--model", MODEL, "--url", emu.url, "--endpoint-type", "chat", "--streaming",
           "--tokenizer", str(TOKENIZER), "--synthetic-input-tokens-mean", "200", "--output-tokens-mean",
           str(OUT_TOKENS), "--extra-inputs", "ignore_eos:true", "--request-count", str(REQUESTS),
           "--concurrency", "4", "--random-seed", "1", "--ui-type", "none", "--export-level", "records",
           "--artifact-dir", str(out)]
    # aiperf can hang after its last record (DESIGN.md): bound it.
    scratch = tmp_path / "aiperf-scratch"  # aiperf's mmap dataset, not the system temp directory
    scratch.mkdir()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "AIPERF_DATASET_MMAP_BASE_PATH": str(scratch)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = [json.loads(line) for line in (out / "profile_export.jsonl").read_text().splitlines()]
    assert len(records) == REQUESTS
    for rec in records:
        m = rec["metrics"]
        assert m["output_sequence_length"]["value"] == OUT_TOKENS  # aiperf re-tokenized our text: same count
        assert m["inter_token_latency"]["value"] > 0 and m["time_to_first_token"]["value"] > 0
