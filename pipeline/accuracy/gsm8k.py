"""GSM8K: 5-shot chat prompts and final-number extraction (strict `#### N` and flexible).

Answers compare as exact decimals after normalisation ("1,234.50", "$1234.5" and
"1234.5" are one answer), so float rounding never decides a question.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from pipeline.accuracy.data import DataError, HubSource, load_hub, read_rows, require_fields, row_id, sibling
from pipeline.config.accuracy import TaskSpec

HUB = HubSource("openai/gsm8k", "main", ("test", "train"), "question, answer ('... #### N')")
FIELDS = ("question", "answer")

INSTRUCTION = ("Solve each grade-school math problem. Reason step by step, then write the final "
               "answer alone on the last line in the form '#### <number>'.")

# A number: optional sign (not a hyphen glued to a preceding word or digit, so "5-3"
# ends in 3, not -3), optional $, thousands groups or plain digits, optional decimals.
_NUM_CORE = r"(-)?\$?(-)?((?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?)"
_NUMBER = re.compile(r"(?<![\w.,])" + _NUM_CORE)
_STRICT = re.compile(r"####\s*" + _NUM_CORE)
_CALC = re.compile(r"<<[^>]*>>")   # GSM8K's calculator annotations: noise in a shot


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answer: str    # the full published solution, ending in '#### N'
    gold: str      # normalised final number


@dataclass(frozen=True)
class Score:
    extracted: str | None          # flexible: last number in the output
    correct: bool
    extracted_strict: str | None   # strict: the number after the first '####'
    correct_strict: bool


def normalize_number(text: str) -> str | None:
    """'1,234.50' -> '1234.5', '$-3' -> '-3', '7.0' -> '7'; None if not a number."""
    cleaned = text.replace(",", "").replace("$", "").strip()
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == 0:
        return "0"
    return format(value.normalize(), "f")


def _match_value(m: re.Match) -> str | None:
    sign = "-" if (m.group(1) or m.group(2)) else ""
    return normalize_number(sign + m.group(3))


def extract_strict(output: str) -> str | None:
    m = _STRICT.search(output)
    return _match_value(m) if m else None


def extract_flexible(output: str) -> str | None:
    matches = list(_NUMBER.finditer(output))
    return _match_value(matches[-1]) if matches else None


def score(output: str, gold: str) -> Score:
    flexible, strict = extract_flexible(output), extract_strict(output)
    return Score(flexible, flexible == gold, strict, strict == gold)


def gold_of(answer: str, where: str, qid: str) -> str:
    head, sep, tail = str(answer).rpartition("####")
    gold = normalize_number(tail) if sep else None
    if gold is None:
        raise DataError(f"{where}: question {qid}: answer does not end in '#### <number>' "
                        f"(found {str(answer)[-60:]!r})")
    return gold


def _questions(rows: list[dict], where: str, path: object) -> list[Question]:
    require_fields(rows, FIELDS, where, path)
    out = []
    for i, row in enumerate(rows):
        qid = row_id(row, i)
        out.append(Question(qid, str(row["question"]).strip(), str(row["answer"]).strip(),
                            gold_of(row["answer"], where, qid)))
    return out


def load(spec: TaskSpec, where: str) -> tuple[list[Question], list[Question]]:
    """(eval questions, shot pool). Shots never appear in the eval set."""
    if spec.data is None:
        test, train = load_hub(HUB, where)
        evals, pool = _questions(test, where, HUB.repo), _questions(train, where, HUB.repo)
    else:
        rows = read_rows(spec.data, where)
        if any("split" in r for r in rows):
            evals = _questions([r for r in rows if r.get("split") != "train"], where, spec.data)
            pool = _questions([r for r in rows if r.get("split") == "train"], where, spec.data)
        else:
            evals, pool = _questions(rows, where, spec.data), []
    if spec.shots_data is not None:
        shots_where = sibling(where, "shots_data")
        pool = _questions(read_rows(spec.shots_data, shots_where), shots_where, spec.shots_data)
    if not pool:
        # No train split anywhere: spend the first rows of the eval file on shots.
        pool, evals = evals[:spec.num_shots], evals[spec.num_shots:]
    shots = pool[:spec.num_shots]
    if len(shots) < spec.num_shots:
        raise DataError(f"{where}: {spec.num_shots} shots requested but only {len(shots)} "
                        f"solved problems are available; lower {sibling(where, 'num_shots')} or add train rows")
    shot_texts = {s.question for s in shots}
    evals = [q for q in evals if q.question not in shot_texts]
    if not evals:
        raise DataError(f"{where}: no questions left to evaluate after taking "
                        f"{spec.num_shots} shots")
    return evals[:spec.limit] if spec.limit else evals, shots


def messages(question: Question, shots: list[Question]) -> list[dict]:
    """Multi-turn chat: each shot is a user question and the assistant's worked solution."""
    msgs: list[dict] = []
    for shot in shots:
        msgs.append({"role": "user", "content": f"Question: {shot.question}"})
        msgs.append({"role": "assistant", "content": _CALC.sub("", shot.answer)})
    msgs.append({"role": "user", "content": f"Question: {question.question}"})
    msgs[0] = {"role": "user", "content": f"{INSTRUCTION}\n\n{msgs[0]['content']}"}
    return msgs
