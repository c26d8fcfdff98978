#!/usr/bin/env bash
# Nsight Compute evidence for the Hopper main kernels (BENCHMARKS.md "What bounds it"): one eager launch a shape,
# the first main-kernel launch of vattn.attention on the Hopper backend (its build, plan and partials):
# DRAM throughput, tensor pipe, warps active, registers, grid.
#   bash benchmarks/kernel/nsight.sh OUT_DIR [SHAPE ...]   (on an H200, from the repository root; ncu from the
#   CUDA toolkit; the shapes below by default, or those named of them)
# Writes OUT_DIR/ncu-SHAPE.csv and OUT_DIR/ncu-SHAPE.err per shape.
set -u
out=${1:?usage: nsight.sh OUT_DIR [SHAPE ...]}
shift
only=" $* "
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "nsight.sh: no ncu on PATH or under /usr/local/cuda*/bin" >&2; exit 1; }
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum.per_second
metrics=$metrics,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
metrics=$metrics,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,launch__grid_size
profile() {  # SHAPE: the bench's correctness check is the first launch
    [ "$only" = "  " ] || [[ "$only" == *" $1 "* ]] || return 0
    VATTN_HOPPER=1 timeout 100 "$ncu" --clock-control none --kernel-name regex:vattn_main_sm90 --launch-count 1 --csv \
        --metrics "$metrics" python3 -m benchmarks.kernel.bench --shapes "$1" --replays 1 --planners balanced \
        --out "/tmp/nsight-$1.json" > "$out/ncu-$1.csv" 2> "$out/ncu-$1.err"
    echo "nsight: $1 rc $?"
}
for s in 16x35k 16x35k-q1 16x35k-gqa8 bs20-agentic-2.32M 32x8k-hd128-gqa8 32x8k-hd128-gqa4 16x35k-bf16; do
    profile "$s"
done
