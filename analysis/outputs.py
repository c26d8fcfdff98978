"""Are two arms' outputs the same? Pure DataFrame -> DataFrame, for any pair of output records.

Under greedy decoding an exact kernel gives the same output as the baseline, token for token; a kernel
whose numerics differ moves an argmax somewhere and the outputs part from there on. So the two figures
that matter are the fraction of identical outputs and, for the rest, the first position where they differ
(early: the answer changed; late: a tail drifted). Positions are in units of `split` (whitespace words by
default, which are tokens for the emulator; pass a tokenizer's encode for real engines, or compare
token-id lists directly).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

Split = Callable[[object], Sequence]


def _words(x) -> Sequence:
    return x.split() if isinstance(x, str) else list(x)


def first_difference(a: Sequence, b: Sequence) -> int | None:
    """Index of the first differing unit; len of the shorter one if it is a prefix; None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def output_identity(a: "pd.DataFrame", b: "pd.DataFrame", key: Sequence[str] = ("id", "repeat"),
                    col: str = "output", split: Split = _words) -> "pd.DataFrame":
    """Inner join of two arms' output records on `key` -> key... | len_a | len_b | identical | first_diff.

    Rows with a missing output in either arm (failed requests) are dropped: they say nothing of the
    kernel. `first_diff` is NaN where the outputs are identical."""
    import pandas as pd

    key = list(key)
    m = a[key + [col]].merge(b[key + [col]], on=key, suffixes=("_a", "_b"))
    m = m[m[f"{col}_a"].notna() & m[f"{col}_b"].notna()]
    ua = [split(x) for x in m[f"{col}_a"]]
    ub = [split(x) for x in m[f"{col}_b"]]
    first = [first_difference(x, y) for x, y in zip(ua, ub)]
    return pd.DataFrame({**{k: m[k].to_numpy() for k in key}, "len_a": [len(x) for x in ua],
                         "len_b": [len(y) for y in ub], "identical": [f is None for f in first],
                         "first_diff": [np.nan if f is None else float(f) for f in first]})


def logprob_drift(a: "pd.DataFrame", b: "pd.DataFrame", key: Sequence[str] = ("id", "repeat")) -> "pd.DataFrame":
    """Two arms' chosen-token logprobs over each answer's shared prefix (the tokens before the first that
    differs, where both arms chose the same token from the same context): key... | shared | moved | max_abs.

    Identical outputs say only that no argmax moved; these say whether the numbers under them did. An exact
    kernel in a deterministic engine gives moved 0. Pairs without logprobs in either arm are dropped."""
    import pandas as pd

    key, cols = list(key), ["tokens", "token_logprobs"]
    if not set(cols) <= set(a.columns) & set(b.columns):
        return pd.DataFrame(columns=[*key, "shared", "moved", "max_abs"])
    m = a[key + cols].merge(b[key + cols], on=key, suffixes=("_a", "_b"))
    rows = []
    for r in m.itertuples(index=False):
        ta, tb, la, lb = r.tokens_a, r.tokens_b, r.token_logprobs_a, r.token_logprobs_b
        if not all(isinstance(x, list) for x in (ta, tb, la, lb)):
            continue
        first = first_difference(ta, tb)
        shared = min(len(ta), len(tb), len(la), len(lb)) if first is None else first
        delta = np.abs(np.asarray(la[:shared], float) - np.asarray(lb[:shared], float))
        rows.append({**{k: getattr(r, k) for k in key}, "shared": shared, "moved": int((delta > 0).sum()),
                     "max_abs": float(delta.max()) if shared else np.nan})
    return pd.DataFrame(rows, columns=[*key, "shared", "moved", "max_abs"])


def drift_summary(drift: "pd.DataFrame") -> dict:
    """{n, shared, moved, fraction_moved, max_abs, median_max_abs} of a logprob_drift frame."""
    shared, moved = int(drift["shared"].sum()), int(drift["moved"].sum())
    per_pair = drift["max_abs"].dropna()
    return {"n": len(drift), "shared": shared, "moved": moved,
            "fraction_moved": moved / shared if shared else float("nan"),
            "max_abs": float(per_pair.max()) if len(per_pair) else float("nan"),
            "median_max_abs": float(per_pair.median()) if len(per_pair) else float("nan")}


def identity_summary(pairs: "pd.DataFrame") -> dict:
    """{n, identical, fraction_identical, median_first_diff, min_first_diff} of an output_identity frame."""
    n = len(pairs)
    same = int(pairs["identical"].sum()) if n else 0
    diffs = pairs["first_diff"].dropna()
    return {"n": n, "identical": same, "fraction_identical": same / n if n else float("nan"),
            "median_first_diff": float(diffs.median()) if len(diffs) else float("nan"),
            "min_first_diff": float(diffs.min()) if len(diffs) else float("nan")}
