"""Hand-made aiperf 0.13 record lines (MetricRecordInfo shape) for frames small enough to check by hand."""
from __future__ import annotations

import json
from pathlib import Path

T0 = 1_700_000_000_000_000_000


def record(conv: str, turn: int, start_ms: float, tpot: float | None = 5.0, ttft: float = 20.0,
           latency: float | None = None, osl: int = 11, phase: str = "profiling", error: str | None = None,
           cancelled: bool = False) -> dict:
    """One aiperf line. Errors carry no latency metrics, as in aiperf's own export."""
    latency = latency if latency is not None else ttft + (tpot or 0) * (osl - 1)
    start = T0 + int(start_ms * 1e6)
    meta = {"session_num": 0, "x_request_id": f"r-{conv}-{turn}-{start_ms}", "x_correlation_id": "random",
            "conversation_id": conv, "turn_index": turn, "request_start_ns": start,
            "request_end_ns": start + int(latency * 1e6), "worker_id": "w", "record_processor_id": "p",
            "benchmark_phase": phase, "was_cancelled": cancelled}
    if error or cancelled:
        return {"metadata": meta, "metrics": {"error_isl": {"value": 10, "unit": "tokens"}},
                "error": {"code": 500 if error else 499, "type": error or "RequestCancellationError",
                          "message": error or "cancelled"}}
    metrics = {"time_to_first_token": {"value": ttft, "unit": "ms"},
               "request_latency": {"value": latency, "unit": "ms"},
               "output_sequence_length": {"value": osl, "unit": "tokens"},
               "input_sequence_length": {"value": 100, "unit": "tokens"}}
    if tpot is not None:
        metrics["inter_token_latency"] = {"value": tpot, "unit": "ms"}
    return {"metadata": meta, "metrics": metrics}


def write_jsonl(path: Path, lines: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def make_run(root: Path, arm_runs: dict[str, list[dict]], **manifest) -> Path:
    """A run dir from hand-made records: arms/<name>/aiperf/profile_export.jsonl + manifest.json."""
    for name, lines in arm_runs.items():
        write_jsonl(root / "arms" / name / "aiperf" / "profile_export.jsonl", lines)
    doc = {"arm_runs": [{"name": n, "arm": n.split(".")[0], "round": int(n.split(".")[1]) if "." in n else 1}
                        for n in arm_runs], **manifest}
    (root / "manifest.json").write_text(json.dumps(doc))
    return root
