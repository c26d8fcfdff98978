"""Which records count: a completed request whose TPOT is no measurement (inf, 0) counts nowhere, in every
table alike, and the report says how many were left out and why (analysis.load.usable_tpot)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from analysis.load import outcome_counts, records_frame
from analysis.report import write_report
from analysis_records import record

QUICKSTART = Path(__file__).parent / "data" / "quickstart_run"


def test_an_inf_or_zero_tpot_is_no_tpot_by_hand():
    lines = [record("c0", 0, 0, tpot=4.0), record("c1", 0, 1, tpot=float("inf"), latency=60.0),
             record("c2", 0, 2, tpot=0.0), record("c3", 0, 3, tpot=None, osl=1)]
    df = records_frame(lines)
    assert df["ok"].tolist() == [True, False, False, False]
    assert outcome_counts(df) == {"total": 4, "completed": 1, "cancelled": 0, "failed": 0, "no_tpot": 3}


def test_every_table_counts_the_same_requests_when_one_tpot_is_inf(tmp_path):
    """The quickstart run with one of on's profiling requests given an inf TPOT (as JSON `Infinity`): the
    matched table said 100 pairs and n=100 for latency and TTFT, 99 for decode time, the verdict n=99, and
    Load counted 111 completed with no TPOT 0."""
    run = shutil.copytree(QUICKSTART, tmp_path / "run")
    export = run / "arms" / "on" / "aiperf" / "profile_export.jsonl"
    recs = [json.loads(line) for line in export.read_text().splitlines()]
    hit = next(r for r in recs if r["metadata"]["benchmark_phase"] == "profiling" and "inter_token_latency"
               in r.get("metrics", {}) and not r.get("error"))
    hit["metrics"]["inter_token_latency"]["value"] = float("inf")
    export.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert export.read_text().count("Infinity") == 1
    md = write_report(run, n_boot=50).read_text()

    verdict_n = int(re.search(r"\(n=(\d+) matched requests", md.splitlines()[2]).group(1))
    pairs = int(re.search(r"(\d+) pairs completed by both", md).group(1))
    matched_n = {int(m) for m in re.findall(r"^\| (?:Decode time per token|Request latency|TTFT) \(ms\) \| (\d+) \|",
                                              md, re.M)}
    assert matched_n == {pairs} == {verdict_n}, (matched_n, pairs, verdict_n)
    on = next(line for line in md.splitlines() if line.startswith("| on | "))
    total, completed, _, _, no_tpot = (int(x) for x in on.split(" | ")[1:6])
    assert no_tpot == 1 and completed == total - 1
    assert ("- arm run `on`: 1 completed request(s) with a TPOT that is not a positive finite number (inf) left "
            "out of every table, plot and the verdict, as requests with no TPOT are (Load counts them under no "
            "TPOT)") in md
