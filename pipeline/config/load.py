"""The recipe's `load:` block: what aiperf replays against each arm, how hard, for how long.

The load stage (pipeline/stages/load.py) turns it into an `aiperf profile` command; the sizing notes
for the quickstart live there.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from pipeline.config.base import NoBoolNumbers


# aiperf flags the load stage sets itself (pipeline/stages/load.py aiperf_command; a test holds the two in step),
# under aiperf 0.13's other names too, and what sets each. extra_args may not repeat them: aiperf takes the last
# one, so it would run with a value that the manifest and the report do not show.
PIPELINE_FLAGS = {
    **dict.fromkeys(("--model", "--model-names", "-m"), "from model"),
    **dict.fromkeys(("--url", "-u"), "from the placement and server.port"),
    "--endpoint-type": "always chat",
    "--streaming": "always: load.streaming",
    "--tokenizer": "from tokenizer",
    "--custom-dataset-type": "from load.trace",
    "--input-file": "from load.trace",
    "--public-dataset": "from load.scenario",
    "--concurrency": "from load.concurrency",
    "--benchmark-duration": "from load.benchmark_duration_s",
    "--benchmark-grace-period": "from load.grace_period_s",
    **dict.fromkeys(("--warmup-request-count", "--num-warmup-requests"), "from load.warmup_requests"),
    "--random-seed": "from load.seed",
    **dict.fromkeys(("--artifact-dir", "--output-artifact-dir"), "from the run dir"),
    **dict.fromkeys(("--ui", "--ui-type"), "always none: nobody watches aiperf's terminal"),
    "--no-gpu-telemetry": "from load.gpu_telemetry",
}
# aiperf 0.13 never ends a run bounded by a request count: it waits out load.timeout_s (the load stage's docstring)
NEVER_ENDS = "aiperf 0.13 never ends a run bounded by a request count (it waits until load.timeout_s kills it)"
REFUSED_FLAGS = dict.fromkeys(("--request-count", "--num-requests"),
                              f"{NEVER_ENDS}; set load.benchmark_duration_s (a window in seconds) instead")
# aiperf adds up repeated --extra-inputs, so one in extra_args adds to the pipeline's ignore_eos:true
APPENDABLE_FLAGS = ("--extra-inputs",)


class LoadSpec(NoBoolNumbers):
    """The recipe's `load:` block: what aiperf replays, how hard, for how long."""

    model_config = ConfigDict(extra="forbid")

    trace: Path | None = Field(
        None, description="Directory of agentic traces in aiperf's weka_trace format (one JSON "
        "per session), e.g. recipes/data/traces/quickstart. Relative paths resolve against the "
        "recipe's directory when the recipe passes it as context, else the working directory. "
        "Exactly one of trace / scenario.")
    scenario: str | None = Field(
        None, min_length=1, description="aiperf public dataset name (`--public-dataset`, e.g. "
        "semianalysis-cc-traces-weka-with-subagents); needs a host that can reach the HF hub. "
        "Exactly one of trace / scenario.")
    concurrency: int = Field(8, ge=1, le=4096, description="Concurrent requests aiperf keeps "
                             "in flight (agentic sessions overlap up to this).")
    benchmark_duration_s: float | None = Field(
        None, gt=0, le=86_400, description="Profiling window in seconds (aiperf --benchmark-duration). Required.")
    request_count: int | None = Field(
        None, ge=1, le=10_000_000, description="Refused: aiperf 0.13 never ends a run bounded "
        "by a request count. Kept so that old manifests (request_count: null) still load.")
    grace_period_s: float = Field(
        30.0, ge=0, le=3_600, description="After the window, how long in-flight responses may "
        "still finish and count (aiperf --benchmark-grace-period).")
    warmup_requests: int = Field(0, ge=0, le=100_000, description="Requests sent before "
                                 "profiling starts; not counted in the records.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="aiperf --random-seed: prompt "
                      "synthesis and sampling; the same in both arms.")
    timeout_s: float = Field(
        900.0, gt=0, le=86_400, description="Hard bound on aiperf's wall time, start-up "
        "included; on expiry its process group is killed and the load fails. Must cover start-up + "
        "warm-up + window + grace.")
    streaming: Literal[True] = Field(True, description="Always stream: TTFT and per-token "
                                     "latency (TPOT) need it.")
    ignore_eos: Literal[True] = Field(True, description="Always ignore EOS so every request "
                                      "decodes its trace's output length in both arms.")
    gpu_telemetry: bool = Field(False, description="Let aiperf collect DCGM GPU telemetry "
                                "(needs a DCGM exporter on the server host).")
    min_records: int = Field(1, ge=1, description="Fewest successful profiling records "
                             "accepted; fewer fails the stage.")
    extra_args: list[str] = Field(default_factory=list, description="Appended verbatim to "
                                  "`aiperf profile` (e.g. ['--use-server-token-count']).")

    @field_validator("trace")
    @classmethod
    def _trace_dir(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        if v is None:
            return None
        base = (info.context or {}).get("base_dir")
        if base is not None and not v.is_absolute():
            v = Path(base) / v
        check_trace_dir(v, field="")  # pydantic's error location already names load.trace
        return v

    @field_validator("request_count")
    @classmethod
    def _never_ends(cls, v: int | None) -> int | None:
        if v is not None:
            raise ValueError(f"{NEVER_ENDS}; set load.benchmark_duration_s (a window in seconds) instead")
        return v

    @field_validator("extra_args")
    @classmethod
    def _not_the_pipelines(cls, args: list[str]) -> list[str]:
        ours = [a.split("=", 1)[0] for a in args if a.split("=", 1)[0] in PIPELINE_FLAGS]  # --flag and --flag=value
        if ours:
            raise ValueError("; ".join(f"{f}: set by the pipeline ({PIPELINE_FLAGS[f]}); remove it" for f in ours))
        refused = [a.split("=", 1)[0] for a in args if a.split("=", 1)[0] in REFUSED_FLAGS]
        if refused:
            raise ValueError("; ".join(f"{f}: {REFUSED_FLAGS[f]}" for f in refused))
        return args

    @model_validator(mode="after")
    def _one_of_each(self) -> "LoadSpec":
        if (self.trace is None) == (self.scenario is None):
            raise ValueError("set exactly one of trace (a weka_trace directory) or "
                             f"scenario (an aiperf public dataset); got trace={self.trace}, "
                             f"scenario={self.scenario!r}")
        if self.benchmark_duration_s is None:
            raise ValueError("benchmark_duration_s: required, the profiling window in seconds (aiperf "
                             "--benchmark-duration)")
        need = self.benchmark_duration_s + self.grace_period_s
        if self.timeout_s <= need:
            # only the window is known here; start-up and warm-up depend on the host and server
            raise ValueError(f"timeout_s: {self.timeout_s} must exceed "
                             f"benchmark_duration_s + grace_period_s = {need} and also cover "
                             "aiperf's start-up (~30 s on 2 cores) and the warm-up "
                             f"({self.warmup_requests} requests); a run killed at timeout_s fails")
        return self


def check_trace_dir(path: Path, field: str = "load.trace: ") -> None:
    """Raise ValueError (prefixed by `field`) unless `path` is a directory of *.json traces in aiperf's format."""
    hint = "generate one with `python -m pipeline.tracegen traces --out DIR` or fix the path"
    if not path.exists():
        raise ValueError(f"{field}directory '{path}' does not exist; {hint}")
    if not path.is_dir():
        raise ValueError(f"{field}'{path}' is not a directory (a weka_trace directory holds "
                         f"one JSON file per session); {hint}")
    files = sorted(path.glob("*.json"))
    if not files:
        raise ValueError(f"{field}directory '{path}' holds no *.json trace files; {hint}")
    for f in files:
        check_trace_file(f, field)


def check_trace_file(path: Path, field: str = "load.trace: ") -> None:
    """Raise ValueError unless `path` parses as aiperf's own weka_trace model, the one its loader applies: else
    the error surfaces only after the server started, buried in aiperf's log, as a load with 0 records."""
    try:
        from aiperf.dataset.loader.weka_trace_models import WekaTrace  # ~1 s to import: only where it checks
    except ImportError:
        WekaTrace = None  # no aiperf here to check against; the load stage needs it and says so
    hint = "fix the file or regenerate the traces with `python -m pipeline.tracegen traces --out DIR`"
    try:
        blob = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{field}'{path}': invalid JSON ({e}); {hint}") from None
    if WekaTrace is None:
        return
    try:
        WekaTrace.model_validate(blob)
    except ValidationError as e:
        err, more = e.errors()[0], e.error_count() - 1
        loc = ".".join(str(x) for x in err["loc"]) or "(the whole file)"
        found = "" if err["type"] == "missing" else f" (found {str(err.get('input'))[:80]})"
        raise ValueError(f"{field}'{path}' does not match aiperf's weka_trace schema: {loc}: {err['msg']}{found}"
                         + (f" (and {more} more errors)" if more else "") + f"; {hint}") from None
