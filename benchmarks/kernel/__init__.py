"""vattn's benchmark tooling, out of the kernel package. Layers, lowest first (each imports only below it):

    shapes.py      KERNEL.md's benchmark shapes, and the peer numbers it records
    harness.py     the shared measurement: Batch (cold-L2 replicas), CUDA-graph timing, the tolerance check,
                   the fields every record starts and ends with
    configs.py     main-kernel variants: parse, label, sweep, pick the best within tolerance
    report.py      the result tables (terminal, markdown)
    peers/         other libraries' kernels on the same batches (one module per family), checked, then timed
    bench.py       the CLI: `python -m benchmarks.kernel.bench`
    sass.py        static SASS counts of the main kernel on a CPU: `python -m benchmarks.kernel.sass`
    cost_check.py  the cost model against a kernel-in-the-loop run: `python -m benchmarks.kernel.cost_check`
"""
