"""Answer extraction edge cases: GSM8K strict/flexible numbers, GPQA letters."""
from __future__ import annotations

import pytest

from pipeline.accuracy.data import DataError
from pipeline.accuracy.gpqa import extract_letter
from pipeline.accuracy.gsm8k import extract_flexible, extract_strict, gold_of, normalize_number, score


@pytest.mark.parametrize("text, want", [
    ("The answer is 42.", "42"),
    ("#### 1,234", "1234"),
    ("She pays $1,234.50 in total", "1234.5"),
    ("It fell to -13.", "-13"),
    ("-5 degrees", "-5"),
    ("5-3 = 2", "2"),
    ("from 10-4", "4"),                 # a hyphen after a digit is not a sign
    ("a loss of -$5", "-5"),
    ("a loss of $-5", "-5"),
    ("3.0 apples", "3"),
    ("0.50 dollars", "0.5"),
    ("-0", "0"),
    ("grew 12.5%", "12.5"),
    ("Answer: 7. Check: 7 * 3 = 21", "21"),   # flexible = the last number, by definition
    ("x2 and y3", None),                # digits glued to words are not numbers
    ("no numbers here", None),
    ("", None),
    ("1,234,567 grains", "1234567"),
])
def test_flexible(text, want):
    assert extract_flexible(text) == want


@pytest.mark.parametrize("text, want", [
    ("so 8 * 9 = 72\n#### 72", "72"),
    ("####72", "72"),
    ("#### $1,000", "1000"),
    ("#### -3.5", "-3.5"),
    ("#### 5\nQuestion: next\n#### 6", "5"),   # the first marker: later text is run-on
    ("The answer is 72", None),
    ("#### ten", None),
])
def test_strict(text, want):
    assert extract_strict(text) == want


def test_score_compares_normalised_numbers():
    s = score("Total: 1,000.0 dollars\n#### $1,000", "1000")
    assert (s.extracted, s.correct, s.extracted_strict, s.correct_strict) == ("1000", True,
                                                                              "1000", True)
    s = score("I think 999", "1000")
    assert not s.correct and s.extracted == "999" and s.extracted_strict is None


def test_normalize_number():
    assert normalize_number("1,234.500") == "1234.5"
    assert normalize_number("$7") == "7"
    assert normalize_number("1e400x") is None and normalize_number("inf") is None


def test_gold_parse_and_error():
    assert gold_of("48 + 24 = 72\n#### 1,072", "w", "q1") == "1072"
    with pytest.raises(DataError, match=r"w: question q9: answer does not end in '#### <number>' "
                                        r"\(found 'about seventy'\)"):
        gold_of("about seventy", "w", "q9")


@pytest.mark.parametrize("text, want", [
    ("Answer: B", "B"),
    ("**Answer:** C", "C"),
    ("**Answer: C**", "C"),
    ("answer: (D)", "D"),
    ("ANSWER: A", "A"),
    ("Answer:B.", "B"),
    ("Answer: [A]", "A"),
    ("Answer: \\boxed{C}", "C"),
    ("Answer: $\\boxed{D}$", "D"),
    ("Answer: $\\text{B}$", "B"),
    ("Answer: B\nOn reflection.\nAnswer: C", "C"),   # the last one counts
    ("Answer: a reaction happens", None),            # lower-case prose is not option A
    ("Answer: E", None),
    ("Answer: AB", None),
    ("The answer is B", None),                       # the required form is 'Answer: X'
    ("", None),
])
def test_gpqa_letter(text, want):
    assert extract_letter(text) == want
