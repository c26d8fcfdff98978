"""Paired comparison of two arms' accuracy records (pure functions, no files).

Both arms answer the same questions with the same prompts, so every test here pairs
question by question; an unpaired test (two proportions) would waste that and report
p-values far too large. Inputs are the records of `accuracy/<task>.jsonl` as a list of
dicts or a pandas DataFrame. Records that failed (no answer after retries) in either arm
are excluded from the pair and counted, never scored as wrong.

GSM8K (one answer per question): exact McNemar on the discordant pairs, and Tango's score
interval for the paired difference (`paired_difference_ci`, which says why that one).
GPQA (R repeats per question): the per-question mean correctness differs between arms by
d_i in {-1, ..., -1/R, 0, 1/R, ..., 1}; we test mean(d) = 0 with a paired sign-flip
permutation test. Why not Wilcoxon signed-rank: d_i is coarse (R+1 values per sign) with
many exact zeros and ties, where Wilcoxon needs zero/tie corrections and its normal
approximation, and it tests a rank location shift rather than the accuracy delta we
report. The sign-flip test uses the delta itself as statistic and is exact under the null
that the kernel changes nothing (each question's two arm means are then exchangeable);
enumerated exactly up to 16 non-zero d_i, otherwise a seeded Monte Carlo.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

_EXACT_MAX_NONZERO = 16   # 2^16 sign patterns x 16: ~8 MB


@dataclass(frozen=True)
class Discordant:
    id: str
    repeat: int | None      # None for per-question means (GPQA)
    off: float              # correctness (0/1) or mean correctness over repeats
    on: float
    off_extracted: Any = None
    on_extracted: Any = None
    gold: Any = None


@dataclass(frozen=True)
class McNemarResult:
    column: str
    n_pairs: int
    both_correct: int
    off_only: int           # b: off correct, on wrong
    on_only: int            # c: on correct, off wrong
    both_wrong: int
    accuracy_off: float | None
    accuracy_on: float | None
    delta: float | None     # on - off
    p_value: float          # exact two-sided
    n_excluded_failed: int
    n_unmatched: int
    discordant: tuple[Discordant, ...]
    ci_low: float | None = None     # 95% Tango score interval of `delta` (paired_difference_ci)
    ci_high: float | None = None


@dataclass(frozen=True)
class RepeatsResult:
    column: str
    n_questions: int
    mean_off: float | None
    mean_on: float | None
    delta: float | None     # mean over questions of (on - off)
    ci_low: float | None    # 95% paired bootstrap over questions
    ci_high: float | None
    p_value: float
    method: str
    n_nonzero: int
    n_excluded_failed: int
    n_unmatched: int
    discordant: tuple[Discordant, ...]   # questions whose means differ, largest |diff| first


@dataclass(frozen=True)
class DivergenceResult:
    n_pairs: int
    n_identical: int
    n_differ: int
    fraction_differ: float | None
    median_first_diff_char: float | None  # how far into the output the arms part ways
    diverged: tuple[tuple[str, int, int], ...]  # (id, repeat, first differing char)


def _rows(records: Any) -> list[dict]:
    if hasattr(records, "to_dict"):
        return records.to_dict("records")
    return list(records)


def _by_key(records: Any) -> dict[tuple[str, int], dict]:
    return {(str(r["id"]), int(r["repeat"])): r for r in _rows(records)}


def _paired(off: Any, on: Any) -> tuple[list[tuple[dict, dict]], int, int]:
    """(answered pairs in off's order, pairs excluded as failed, unmatched keys)."""
    a, b = _by_key(off), _by_key(on)
    pairs, failed = [], 0
    for key, ra in a.items():
        rb = b.get(key)
        if rb is None:
            continue
        if ra["failed"] or rb["failed"]:
            failed += 1
        else:
            pairs.append((ra, rb))
    return pairs, failed, len(a.keys() ^ b.keys())


def mcnemar_exact_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p: 2 * P(X <= min(b, c)), X ~ Binomial(b + c, 1/2), capped at 1."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def mcnemar(off: Any, on: Any, *, column: str = "correct") -> McNemarResult:
    """Exact McNemar on per-question correctness (one record per question and arm).
    column: 'correct' (GSM8K flexible) or 'correct_strict'."""
    pairs, failed, unmatched = _paired(off, on)
    repeated = {ra["id"] for ra, _ in pairs if int(ra["repeat"]) != 0}
    if repeated:
        raise ValueError(f"mcnemar: question {sorted(repeated)[0]!r} has repeats > 0; McNemar "
                         "needs one answer per question, use paired_repeats for repeated tasks")
    cells = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    discordant = []
    for ra, rb in pairs:
        x, y = bool(ra[column]), bool(rb[column])
        cells[(x, y)] += 1
        if x != y:
            ext = "extracted_strict" if column == "correct_strict" else "extracted"
            discordant.append(Discordant(str(ra["id"]), int(ra["repeat"]), float(x), float(y),
                                         ra.get(ext), rb.get(ext), ra.get("gold")))
    n = len(pairs)
    b, c = cells[(True, False)], cells[(False, True)]
    acc_off = (cells[(True, True)] + b) / n if n else None
    acc_on = (cells[(True, True)] + c) / n if n else None
    ci = paired_difference_ci(b, c, n) if n else (None, None)
    return McNemarResult(column, n, cells[(True, True)], b, c, cells[(False, False)], acc_off,
                         acc_on, (acc_on - acc_off) if n else None, mcnemar_exact_p(b, c),
                         failed, unmatched, tuple(discordant), *ci)


Z_95 = 1.959963984540054   # standard normal 0.975 quantile


def _tango_z(delta: float, off_only: int, on_only: int, n: int) -> float:
    """Tango's score statistic for H0: p_on - p_off = delta, with the discordant cell
    probability at its maximum likelihood value under H0 (the root of A x^2 + B x + C)."""
    a, b = 2 * n, -on_only - off_only + (2 * n - on_only + off_only) * delta
    c = -off_only * delta * (1 - delta)
    p_off_only = (math.sqrt(max(b * b - 4 * a * c, 0.0)) - b) / (2 * a)
    num = on_only - off_only - n * delta
    var = n * (2 * p_off_only + delta * (1 - delta))
    # var reaches 0 only at delta = +-1; the sign of num then says which side of delta the data lie
    return num / math.sqrt(var) if var > 0 else math.copysign(math.inf, num) if num else 0.0


def paired_difference_ci(off_only: int, on_only: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """95% interval of p_on - p_off from n paired answers, off_only / on_only of them discordant
    (Tango 1998, the asymptotic score interval; Fagerland, Lydersen & Laake 2014 recommend it
    for paired proportions). Why this one: with no discordant pair, the usual outcome for a
    kernel that changes no answer, a bootstrap over questions and the Wald interval both
    collapse to [0, 0], claiming more than n questions can show; Tango's gives
    +-z^2 / (n + z^2) then (+-21.5 pp at n = 14), and keeps close to 95% coverage at small n
    without leaving [-1, 1]. The statistic falls as delta rises, so each limit is found by
    bisection."""
    if n <= 0 or off_only < 0 or on_only < 0 or off_only + on_only > n:
        raise ValueError(f"paired_difference_ci: need 0 <= off_only + on_only <= n and n > 0, got "
                         f"off_only={off_only}, on_only={on_only}, n={n}")
    est = (on_only - off_only) / n

    def root(lo: float, hi: float, target: float) -> float:
        for _ in range(200):   # 2^-200 of [-1, 1]: below float resolution
            mid = (lo + hi) / 2
            if _tango_z(mid, off_only, on_only, n) > target:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    low = -1.0 if est == -1 else root(-1.0, est, z)
    high = 1.0 if est == 1 else root(est, 1.0, -z)
    return low, high


def no_difference_ci(n: int, z: float = Z_95) -> tuple[float, float]:
    """95% interval of the mean per-question difference when none of n questions differs between the arms.
    A question's difference (of its means over repeats) lies in [-1, 1], so the mean's size is at most the share of
    questions that differ at all; 0 of n observed bounds that share by Wilson's score limit z^2 / (n + z^2) (what
    Tango's interval gives for one answer a question). A bootstrap over questions would say [0, 0] whatever n."""
    bound = z * z / (n + z * z)
    return -bound, bound


def sign_flip_p(diffs: Sequence[float], *, n_resamples: int = 100_000,
                seed: int = 0) -> tuple[float, str]:
    """Two-sided paired sign-flip p-value for mean(diffs) = 0, and the method used."""
    import numpy as np

    d = np.asarray([x for x in diffs if x != 0], dtype=float)
    if d.size == 0:
        return 1.0, "exact sign-flip"
    observed = abs(d.sum()) - 1e-9   # tolerance: sums of k/R fractions are inexact
    if d.size <= _EXACT_MAX_NONZERO:
        # Every sign pattern, as bits of 0..2^n-1.
        bits = (np.arange(2 ** d.size)[:, None] >> np.arange(d.size)) & 1
        sums = np.abs(((1 - 2 * bits) * d).sum(axis=1))
        return float((sums >= observed).mean()), "exact sign-flip"
    rng = np.random.default_rng(seed)
    hits, done = 0, 0
    while done < n_resamples:
        k = min(10_000, n_resamples - done)
        signs = rng.choice([-1.0, 1.0], size=(k, d.size))
        hits += int((np.abs(signs @ d) >= observed).sum())
        done += k
    # +1: the observed labelling is one of the permutations; keeps p > 0.
    return (hits + 1) / (n_resamples + 1), f"monte-carlo sign-flip (n={n_resamples}, seed={seed})"


def _bootstrap_ci(d: list[float], seed: int, n: int = 10_000) -> tuple[float, float]:
    import numpy as np

    arr = np.asarray(d, dtype=float)
    idx = np.random.default_rng(seed).integers(0, arr.size, size=(n, arr.size))
    means = arr[idx].mean(axis=1)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def paired_repeats(off: Any, on: Any, *, column: str = "correct", n_resamples: int = 100_000,
                   seed: int = 0) -> RepeatsResult:
    """Paired test on per-question mean correctness over repeats (GPQA)."""
    pairs, failed, unmatched = _paired(off, on)
    per_q: dict[str, list[list[float]]] = {}
    for ra, rb in pairs:
        acc = per_q.setdefault(str(ra["id"]), [[], []])
        acc[0].append(float(bool(ra[column])))
        acc[1].append(float(bool(rb[column])))
    ids = list(per_q)
    m_off = [sum(per_q[q][0]) / len(per_q[q][0]) for q in ids]
    m_on = [sum(per_q[q][1]) / len(per_q[q][1]) for q in ids]
    diffs = [b - a for a, b in zip(m_off, m_on)]
    p, method = sign_flip_p(diffs, n_resamples=n_resamples, seed=seed)
    n = len(ids)
    ci = (None, None) if not n else _bootstrap_ci(diffs, seed) if any(diffs) else no_difference_ci(n)
    disc = sorted((Discordant(q, None, a, b) for q, a, b in zip(ids, m_off, m_on) if a != b),
                  key=lambda x: -abs(x.on - x.off))
    return RepeatsResult(column, n, sum(m_off) / n if n else None, sum(m_on) / n if n else None,
                         sum(diffs) / n if n else None, ci[0], ci[1], p, method,
                         sum(x != 0 for x in diffs), failed, unmatched, tuple(disc))


def _first_diff(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def output_divergence(off: Any, on: Any) -> DivergenceResult:
    """How many paired outputs differ at all. Under greedy decoding a bit-identical kernel
    gives zero; a numerically different one diverges somewhere, and the first differing
    character says whether that happens early (changes the reasoning) or late."""
    pairs, _, _ = _paired(off, on)
    diverged = tuple((str(ra["id"]), int(ra["repeat"]), _first_diff(ra["output"], rb["output"]))
                     for ra, rb in pairs if ra["output"] != rb["output"])
    offsets = sorted(x[2] for x in diverged)
    median = None
    if offsets:
        mid = len(offsets) // 2
        median = float(offsets[mid]) if len(offsets) % 2 else (offsets[mid - 1] + offsets[mid]) / 2
    n = len(pairs)
    return DivergenceResult(n, n - len(diverged), len(diverged),
                            len(diverged) / n if n else None, median, diverged)


@dataclass(frozen=True)
class TaskComparison:
    task: str
    test: McNemarResult | RepeatsResult   # McNemar with one answer per question, else sign-flip
    strict: McNemarResult | None          # gsm8k's `#### N` extraction, one answer per question
    divergence: DivergenceResult

    def paired_accuracy(self) -> dict[str, Any]:
        """Each arm's accuracy over the pairs the test used, their difference (on - off) and its 95% CI:
        the report's headline, so that it can never disagree with the test beside it. With repeats,
        accuracy is the mean over questions of each question's mean over its paired repeats, the
        quantity the sign-flip test and the question bootstrap work on. `strict_*` only for gsm8k."""
        t = self.test
        if isinstance(t, McNemarResult):
            out = {"n": t.n_pairs, "off": t.accuracy_off, "on": t.accuracy_on, "ci_method": "Tango score"}
        else:
            out = {"n": t.n_questions, "off": t.mean_off, "on": t.mean_on,
                   "ci_method": "question bootstrap" if t.n_nonzero else "no question differs: Wilson bound"}
        out |= {"delta": t.delta, "ci_low": t.ci_low, "ci_high": t.ci_high}
        if self.strict is not None:
            out |= {"strict_off": self.strict.accuracy_off, "strict_on": self.strict.accuracy_on}
        return out

    def cell(self, a_label: str = "off", b_label: str = "on", *, with_ci: bool = True) -> str:
        """One markdown table cell (no '|'): the test, its p-value, discordance, divergence. The labels name
        the first and second record sets as the report does (`--arms on off` puts `on` first). with_ci=False
        leaves out the repeats' CI, for a table whose delta column shows it."""
        t = self.test
        if isinstance(t, McNemarResult):
            head = (f"McNemar exact p={t.p_value:.3g} ({a_label}-only {t.off_only}, "
                    f"{b_label}-only {t.on_only}, n={t.n_pairs})")
        else:
            ci = (f", 95% CI [{t.ci_low * 100:+.1f}, {t.ci_high * 100:+.1f}] pp"
                  if t.ci_low is not None and with_ci else "")
            head = (f"paired sign-flip p={t.p_value:.3g}{ci}; {len(t.discordant)} of "
                    f"{t.n_questions} questions differ")
        if self.strict is not None:
            head += f"; strict p={self.strict.p_value:.3g}"
        d = self.divergence
        excluded = t.n_excluded_failed + t.n_unmatched
        tail = f"; {excluded} unpaired/failed excluded" if excluded else ""
        return f"{head}; outputs differ {d.n_differ}/{d.n_pairs}{tail}"

    def __str__(self) -> str:
        return self.cell()


def compare_records(task: str, off: Any, on: Any, *, seed: int = 0) -> TaskComparison:
    """The report's paired comparison of one task between two arms."""
    off, on = _rows(off), _rows(on)
    repeated = any(int(r["repeat"]) > 0 for r in (*off, *on))
    test = paired_repeats(off, on, seed=seed) if repeated else mcnemar(off, on)
    strict = (mcnemar(off, on, column="correct_strict")
              if task == "gsm8k" and not repeated else None)
    return TaskComparison(task, test, strict, output_divergence(off, on))


def compare_files(task: str, off_path: Any, on_path: Any, *, seed: int = 0) -> TaskComparison:
    """compare_records over two arms' accuracy/<task>.jsonl files."""
    from pipeline.accuracy.records import read_records

    return compare_records(task, read_records(off_path), read_records(on_path), seed=seed)
