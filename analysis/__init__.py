"""A/B analysis of a run directory: pandas frames in, tables out; only `report` writes files.

    load.py        aiperf profile_export.jsonl -> record frame; profiling phase, outcomes, match key
    rundir.py      a run directory: manifest + one ArmRun per arm-run folder; user-facing errors
    metrics.py     per-arm metrics and matched-request deltas (DataFrame -> DataFrame)
    stats.py       session-clustered bootstrap, sign test, A/A noise floor (numpy, vectorised)
    compare.py     one comparison: side a vs side b, repeats pooled, A/A floor
    formatting.py  how numbers, deltas with CIs and noise floors read in every table
    plots.py       TPOT CDF, matched delta histogram, TPOT over time (matplotlib Agg)
    placement.py   concurrent placement with a swap: kernel effect apart from the GPU-set effect
    cycles.py      optional "kernel in the loop" section from the emulator cycle log
    accuracy.py    accuracy table from accuracy/<task>.jsonl (paired tests: pipeline.accuracy.compare)
    provenance.py  the manifest's provenance block
    report.py      write_report / cli_report: `pipeline report`
"""
