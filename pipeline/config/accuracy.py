"""The recipe's `accuracy:` block: which tasks, which data, how hard to push the server.

The recipe embeds `AccuracySpec`; `pipeline eval` builds the same model from its flags, so
both paths validate identically.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pipeline.config.base import NoBoolNumbers

TaskName = Literal["gsm8k", "gpqa_diamond"]
TASK_NAMES: tuple[str, ...] = ("gsm8k", "gpqa_diamond")

# Per-task defaults. GPQA answers are long chains of thought on hard science questions,
# so it gets more room than GSM8K; both are "generous" on purpose: a truncated answer
# shows up as invalid, which would blame the kernel for a budget choice.
_DEFAULT_REPEATS = {"gsm8k": 1, "gpqa_diamond": 8}
_DEFAULT_MAX_TOKENS = {"gsm8k": 2048, "gpqa_diamond": 8192}
_DEFAULT_SHOTS = {"gsm8k": 5, "gpqa_diamond": 0}
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")  # what pipeline.accuracy.data.read_rows reads


class TaskSpec(NoBoolNumbers):
    """One accuracy task run against one server."""

    model_config = ConfigDict(extra="forbid")

    name: TaskName = Field(description="Task: 'gsm8k' (5-shot chat, final number) or "
                                       "'gpqa_diamond' (4 shuffled options, 'Answer: X').")
    data: Path | None = Field(
        default=None,
        description="Local JSONL, JSON (an array of objects, or JSON Lines), CSV or parquet file in the "
                    "dataset's published field names "
                    "(gsm8k: question, answer ending in '#### N'; gpqa_diamond: Question, "
                    "Correct Answer, Incorrect Answer 1..3). An optional 'split' column "
                    "(train/test) supplies GSM8K shots from 'train'. None: load from the "
                    "HF hub (openai/gsm8k main, Idavidrein/gpqa gpqa_diamond).")
    shots_data: Path | None = Field(
        default=None,
        description="gsm8k only: a separate file of solved problems to draw shots from. "
                    "Without it, shots come from the train split (hub, or rows with "
                    "split=train), else from the first rows of `data`, which are then "
                    "excluded from the eval set.")
    num_shots: int | None = Field(default=None, ge=0, le=16,
                                  description="Few-shot examples per prompt (gsm8k default 5; "
                                              "gpqa_diamond is zero-shot and allows only 0).")
    limit: int | None = Field(default=None, ge=1,
                              description="Evaluate only the first N questions (after shot "
                                          "exclusion); None: all.")
    repeats: int | None = Field(default=None, ge=1, le=64,
                                description="Times each question is asked (gsm8k default 1; "
                                            "gpqa_diamond default 8, each with its own "
                                            "option order).")
    max_tokens: int | None = Field(default=None, ge=16,
                                   description="Completion token budget per request "
                                               "(gsm8k default 2048, gpqa_diamond 8192).")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0,
                               description="Sampling temperature; 0 (greedy) makes arm "
                                           "outputs directly comparable.")
    seed: int = Field(default=0, ge=0,
                      description="Seed of the GPQA option shuffle (per question and repeat) "
                                  "and of the request `seed` when temperature > 0.")
    concurrency: int = Field(default=32, ge=1, le=1024,
                             description="Requests in flight at once.")
    timeout_s: float = Field(default=600.0, gt=0,
                             description="Per-request timeout in seconds (whole response).")
    retries: int = Field(default=3, ge=0, le=20,
                         description="Extra attempts after a connection error, timeout, 429 "
                                     "or 5xx; a question still failing is recorded as failed.")
    retry_backoff_s: float = Field(default=1.0, ge=0.0,
                                   description="First retry delay in seconds; doubles per "
                                               "attempt, capped at 30 s.")
    logprobs: bool = Field(
        default=True,
        description="Ask for the chosen tokens' logprobs (OpenAI chat `logprobs`) and keep them in the records "
                    "(~30 bytes a token): the report compares them between arms over each answer's shared "
                    "prefix, a test of a kernel's numerics that identical greedy outputs alone are not. False "
                    "for an endpoint that refuses the parameter.")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra fields merged into every chat request, e.g. "
                    "{chat_template_kwargs: {enable_thinking: false}}.")

    @field_validator("data", "shots_data")
    @classmethod
    def _local_file(cls, v: Path | None) -> Path | None:
        # checked here, not when the accuracy stage reads it: that stage runs after each arm's load
        if v is None:
            return None
        if not v.is_file():
            raise ValueError(f"no such file{' (it is a directory)' if v.is_dir() else ''}; allowed: a local "
                             f"{', '.join(DATA_SUFFIXES)} file, or leave the field out to load from the HF hub")
        if v.suffix.lower() not in DATA_SUFFIXES:
            raise ValueError(f"unsupported file type '{v.suffix}'; allowed: {', '.join(DATA_SUFFIXES)}")
        return v

    @model_validator(mode="after")
    def _fill_task_defaults(self) -> "TaskSpec":
        if self.name == "gpqa_diamond":
            if self.num_shots not in (None, 0):
                raise ValueError(f"num_shots: {self.num_shots} for gpqa_diamond; it is "
                                 "zero-shot, so only 0 is allowed (omit the field)")
            if self.shots_data is not None:
                raise ValueError("shots_data: set for gpqa_diamond; only gsm8k uses shots "
                                 "(remove the field)")
        if self.num_shots is None:
            self.num_shots = _DEFAULT_SHOTS[self.name]
        if self.repeats is None:
            self.repeats = _DEFAULT_REPEATS[self.name]
        if self.max_tokens is None:
            self.max_tokens = _DEFAULT_MAX_TOKENS[self.name]
        return self


class AccuracySpec(BaseModel):
    """The accuracy stage: tasks run against each arm's server after the load stage."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[TaskSpec] = Field(default_factory=list,
                                  description="Tasks to run, in order; each name at most once "
                                              "(it names the output file accuracy/<name>.jsonl).")

    @model_validator(mode="after")
    def _unique_names(self) -> "AccuracySpec":
        seen: set[str] = set()
        for i, task in enumerate(self.tasks):
            if task.name in seen:
                raise ValueError(f"tasks.{i}.name: '{task.name}' appears twice; each task "
                                 "writes accuracy/<name>.jsonl, so list it once")
            seen.add(task.name)
        return self
