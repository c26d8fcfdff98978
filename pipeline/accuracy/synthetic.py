"""Synthetic GSM8K-style and GPQA-style items, generated from a seed (no benchmark text).

    python -m pipeline.accuracy.synthetic --out recipes/data/accuracy --seed 0

GSM8K rows: id, split (train|test), question, answer (worked steps ending '#### N').
GPQA rows: Record ID, Question, Correct Answer, Incorrect Answer 1..3.
The answers cover what extraction must handle: thousands, decimals, money, negatives.
"""
from __future__ import annotations

import argparse
import json
import random
from decimal import Decimal
from pathlib import Path

_NAMES = ["Ana", "Bo", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun", "Kemi",
          "Lars", "Mira", "Nils", "Oona", "Pavel"]
_ITEMS = ["marbles", "stickers", "apples", "pencils", "stamps", "shells", "cards", "beads"]


def _fmt(x: Decimal | int) -> str:
    d = Decimal(x)
    return format(d.normalize(), "f") if d != d.to_integral() else str(int(d))


def _gsm_gain_loss(rng: random.Random) -> tuple[str, list[str], Decimal]:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b, c = rng.randint(10, 90), rng.randint(5, 60), rng.randint(2, 30)
    q = (f"{name} has {a} {item}. A friend gives {name} {b} more, and then {name} gives "
         f"{c} away. How many {item} does {name} have now?")
    return q, [f"After the gift {name} has {a} + {b} = {a + b} {item}.",
               f"After giving some away {name} has {a + b} - {c} = {a + b - c} {item}."], \
        Decimal(a + b - c)


def _gsm_boxes(rng: random.Random) -> tuple[str, list[str], Decimal]:
    boxes, per, extra = rng.randint(12, 60), rng.randint(24, 96), rng.randint(100, 900)
    q = (f"A warehouse ships {boxes} boxes with {per} bolts in each box, plus {extra} loose "
         "bolts. How many bolts does it ship in total?")
    return q, [f"The boxes hold {boxes} * {per} = {boxes * per} bolts.",
               f"With the loose ones: {boxes * per} + {extra} = {boxes * per + extra} bolts."], \
        Decimal(boxes * per + extra)


def _gsm_money(rng: random.Random) -> tuple[str, list[str], Decimal]:
    name = rng.choice(_NAMES)
    n, cents = rng.randint(3, 9), rng.choice([25, 50, 75, 40, 15])
    price = (Decimal(rng.randint(2, 12)) + Decimal(cents) / 100).quantize(Decimal("0.01"))
    cost = price * n
    paid = next(Decimal(b) for b in (20, 50, 100, 200) if b > cost)
    q = (f"{name} buys {n} notebooks at ${price} each and pays with a ${paid} bill. "
         "How many dollars of change does " + name + " get?")
    return q, [f"The notebooks cost {n} * {price} = {_fmt(cost)} dollars.",
               f"The change is {paid} - {_fmt(cost)} = {_fmt(paid - cost)} dollars."], paid - cost


def _gsm_share(rng: random.Random) -> tuple[str, list[str], Decimal]:
    people, each = rng.randint(3, 12), rng.randint(4, 25)
    total = people * each
    q = (f"A class of {people} students shares {total} crayons equally. How many crayons "
         "does each student get?")
    return q, [f"Each student gets {total} / {people} = {each} crayons."], Decimal(each)


def _gsm_temperature(rng: random.Random) -> tuple[str, list[str], Decimal]:
    start, drop = rng.randint(2, 12), rng.randint(15, 30)
    q = (f"At noon the temperature was {start} degrees. By midnight it had fallen by {drop} "
         "degrees. What was the temperature at midnight, in degrees?")
    return q, [f"The temperature is {start} - {drop} = {start - drop} degrees."], \
        Decimal(start - drop)


def _gsm_salary(rng: random.Random) -> tuple[str, list[str], Decimal]:
    name = rng.choice(_NAMES)
    monthly, months, bonus = rng.randint(18, 60) * 100, 12, rng.randint(5, 40) * 100
    total = monthly * months + bonus
    q = (f"{name} earns ${monthly:,} per month and gets a ${bonus:,} bonus once a year. "
         "How many dollars does " + name + " earn in a year?")
    return q, [f"Twelve months pay {monthly} * {months} = {monthly * months} dollars.",
               f"With the bonus: {monthly * months} + {bonus} = {total} dollars."], \
        Decimal(total)


_GSM_TEMPLATES = [_gsm_gain_loss, _gsm_boxes, _gsm_money, _gsm_share, _gsm_temperature,
                  _gsm_salary]


def gsm8k_rows(seed: int, n_train: int, n_test: int) -> list[dict]:
    rng = random.Random(seed)
    rows, seen = [], set()
    for split, n in (("train", n_train), ("test", n_test)):
        count = 0
        while count < n:
            q, steps, value = _GSM_TEMPLATES[(len(rows)) % len(_GSM_TEMPLATES)](rng)
            if q in seen:
                continue
            seen.add(q)
            rows.append({"id": f"syn-gsm-{split}-{count:03d}", "split": split, "question": q,
                         "answer": "\n".join(steps) + f"\n#### {_fmt(value)}"})
            count += 1
    return rows


def _gpqa_product(rng: random.Random) -> tuple[str, str, list[str]]:
    a, b = rng.randint(12, 99), rng.randint(12, 99)
    p = a * b
    wrong = [p + 10, p - a, p + b]
    return f"What is the product {a} x {b}?", str(p), [str(w) for w in wrong]


def _gpqa_prime(rng: random.Random) -> tuple[str, str, list[str]]:
    primes = [p for p in range(101, 400) if all(p % d for d in range(2, int(p ** 0.5) + 1))]
    composites = [n for n in range(101, 400) if n % 2 and n not in primes]
    return ("Which of the following numbers is prime?", str(rng.choice(primes)),
            [str(c) for c in rng.sample(composites, 3)])


def _gpqa_seconds(rng: random.Random) -> tuple[str, str, list[str]]:
    minutes = rng.randint(3, 50)
    s = minutes * 60
    return (f"A reaction runs for {minutes} minutes. How many seconds is that?", str(s),
            [str(s + 60), str(minutes * 100), str(s - 30)])


def _gpqa_remainder(rng: random.Random) -> tuple[str, str, list[str]]:
    n, d = rng.randint(1000, 9999), rng.choice([7, 9, 11, 13])
    r = n % d
    wrong = [(r + k) % d for k in (1, 2, 3)]
    return f"What is the remainder when {n} is divided by {d}?", str(r), [str(w) for w in wrong]


_GPQA_TEMPLATES = [_gpqa_product, _gpqa_prime, _gpqa_seconds, _gpqa_remainder]


def gpqa_rows(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed + 1)   # independent of the GSM8K stream for the same seed
    rows, seen = [], set()
    while len(rows) < n:
        q, right, wrong = _GPQA_TEMPLATES[len(rows) % len(_GPQA_TEMPLATES)](rng)
        # The prime template repeats its stem; the options make the item unique.
        if (q, right) in seen or len({right, *wrong}) < 4:
            continue
        seen.add((q, right))
        rows.append({"Record ID": f"syn-gpqa-{len(rows):03d}", "Question": q,
                     "Correct Answer": right, "Incorrect Answer 1": wrong[0],
                     "Incorrect Answer 2": wrong[1], "Incorrect Answer 3": wrong[2]})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.accuracy.synthetic",
                                 description="Write synthetic GSM8K/GPQA-style JSONL sets.")
    ap.add_argument("--out", type=Path, required=True, help="folder for the two files")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gsm8k-train", type=int, default=8, help="solved problems for shots")
    ap.add_argument("--gsm8k-test", type=int, default=40)
    ap.add_argument("--gpqa", type=int, default=24)
    args = ap.parse_args(argv)
    write_jsonl(args.out / "gsm8k_synthetic.jsonl",
                gsm8k_rows(args.seed, args.gsm8k_train, args.gsm8k_test))
    write_jsonl(args.out / "gpqa_synthetic.jsonl", gpqa_rows(args.seed, args.gpqa))
    print(f"wrote {args.out}/gsm8k_synthetic.jsonl and {args.out}/gpqa_synthetic.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
