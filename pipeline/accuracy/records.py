"""The per-question record file (`accuracy/<task>.jsonl`) and its summary.

One JSON object per (question, repeat):
    id, repeat, prompt_hash, output, extracted, gold, correct, latency_s, finish_reason,
    retried, failed, attempts, error, model, generation, tokens, token_logprobs
    gsm8k adds extracted_strict, correct_strict (the `#### N` form; `correct` is flexible).
A failed record (no answer after retries) has output/extracted None and correct False; tokens and
token_logprobs (the output's tokens and each one's logprob) are None where the server returned none.
`generation` holds the settings the answer was asked with (max_tokens, temperature, seed where sampled,
extra_body); a resume refuses records whose settings differ from the run's.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable

from pipeline.io import write_text_atomic


def prompt_hash(messages: list[dict]) -> str:
    blob = json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def read_records(path: Path) -> list[dict]:
    """Records already on disk. A torn last line (crash mid-write) is dropped: that
    question is simply asked again."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return answer_records(out)


def answer_records(rows: list) -> list[dict]:
    """The rows that are answers to a question: dicts with an id and a repeat."""
    return [r for r in rows if isinstance(r, dict) and "id" in r and "repeat" in r]


def write_records(path: Path, records: Iterable[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def summarize(task: str, records: list[dict], *, model: str, n_questions: int,
              repeats: int, generation: dict | None = None) -> dict:
    """Accuracy counts failed records as wrong (the denominator is every question asked);
    `accuracy_answered` excludes them, so a flaky server is visible, not hidden."""
    n = len(records)
    failed = [r for r in records if r["failed"]]
    answered = [r for r in records if not r["failed"]]
    invalid = [r for r in answered if r["extracted"] is None]
    n_correct = sum(bool(r["correct"]) for r in records)
    out: dict = {
        "task": task, "model": model, "generation": generation, "n_questions": n_questions, "repeats": repeats,
        "n_records": n, "n_answered": len(answered), "n_failed": len(failed),
        "n_retried": sum(bool(r["retried"]) for r in records),
        "n_correct": n_correct, "accuracy": _ratio(n_correct, n),
        "accuracy_answered": _ratio(sum(bool(r["correct"]) for r in answered), len(answered)),
        "n_invalid": len(invalid), "invalid_rate": _ratio(len(invalid), n),
        "n_truncated": sum(r["finish_reason"] == "length" for r in answered),
        "mean_latency_s": _ratio(sum(r["latency_s"] for r in answered), len(answered)),
    }
    if task == "gsm8k":
        strict_ok = sum(bool(r["correct_strict"]) for r in records)
        strict_invalid = sum(r["extracted_strict"] is None for r in answered)
        out.update(n_correct_strict=strict_ok, accuracy_strict=_ratio(strict_ok, n),
                   n_invalid_strict=strict_invalid,
                   invalid_rate_strict=_ratio(strict_invalid, n))
    by_repeat: dict[int, list[bool]] = {}
    by_question: dict[str, list[bool]] = {}
    for r in records:
        by_repeat.setdefault(r["repeat"], []).append(bool(r["correct"]))
        by_question.setdefault(r["id"], []).append(bool(r["correct"]))
    out["accuracy_by_repeat"] = [_ratio(sum(v), len(v)) for _, v in sorted(by_repeat.items())]
    if repeats > 1:
        # Mean correctness per question over its repeats: what the paired test compares.
        out["per_question_accuracy"] = {q: sum(v) / len(v) for q, v in by_question.items()}
    return out


def _ratio(num: float, den: int) -> float | None:
    return num / den if den else None
