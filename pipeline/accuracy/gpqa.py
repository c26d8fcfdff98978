"""GPQA-diamond: four options shuffled per (question, repeat), `Answer: X` extraction.

The shuffle is a pure function of (seed, question id, repeat), so both arms of an A/B
see the identical prompt for every (question, repeat) and can be paired line by line.
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from pipeline.accuracy.data import HubSource, load_hub, read_rows, require_fields, row_id
from pipeline.config.accuracy import TaskSpec

HUB = HubSource("Idavidrein/gpqa", "gpqa_diamond", ("train",),
                "Question, Correct Answer, Incorrect Answer 1, Incorrect Answer 2, "
                "Incorrect Answer 3")
FIELDS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
          "Incorrect Answer 3")
LETTERS = "ABCD"

INSTRUCTION = ("Answer this multiple-choice question. Think it through step by step, then end "
               "your response with a line of the form 'Answer: X', where X is one of A, B, C, D.")

# 'Answer' in any case, then the letter in upper case only, so prose such as
# "answer: a reaction..." is not read as option A. Markdown bold is stripped first;
# brackets, $ and LaTeX \boxed{...} / \text{...} around the letter are allowed.
_ANSWER = re.compile(r"(?i:answer)\s*:(?:\s|[\(\[$]|\\boxed\{|\\text\{)*([A-D])(?![\w])")


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    correct: str
    incorrect: tuple[str, str, str]


@dataclass(frozen=True)
class Score:
    extracted: str | None
    correct: bool


def extract_letter(output: str) -> str | None:
    """The letter of the last 'Answer: X' in the output, or None."""
    matches = _ANSWER.findall(output.replace("*", ""))
    return matches[-1] if matches else None


def score(output: str, gold: str) -> Score:
    letter = extract_letter(output)
    return Score(letter, letter == gold)


def shuffled_options(q: Question, repeat: int, seed: int) -> tuple[list[str], str]:
    """(options in presented order, gold letter) for one (question, repeat)."""
    # sha256, not hash(): Python salts str hashes per process, arms must agree.
    digest = hashlib.sha256(f"{seed}:{q.id}:{repeat}".encode()).digest()
    options = [q.correct, *q.incorrect]
    random.Random(int.from_bytes(digest[:8], "big")).shuffle(options)
    return options, LETTERS[options.index(q.correct)]


def load(spec: TaskSpec, where: str) -> list[Question]:
    if spec.data is None:
        (rows,) = load_hub(HUB, where)
        path: object = HUB.repo
    else:
        rows, path = read_rows(spec.data, where), spec.data
    require_fields(rows, FIELDS, where, path)
    out = []
    for i, row in enumerate(rows):
        q = Question(row_id(row, i), str(row["Question"]).strip(),
                     str(row["Correct Answer"]).strip(),
                     tuple(str(row[f"Incorrect Answer {k}"]).strip() for k in (1, 2, 3)))
        out.append(q)
    return out[:spec.limit] if spec.limit else out


def messages(q: Question, repeat: int, seed: int) -> tuple[list[dict], str]:
    options, gold = shuffled_options(q, repeat, seed)
    lines = "\n".join(f"{letter}) {text}" for letter, text in zip(LETTERS, options))
    content = f"{INSTRUCTION}\n\n{q.question}\n\n{lines}"
    return [{"role": "user", "content": content}], gold
