# Issue 18's one-run peer table on the offline GPU host, one step a `run` call: the same command every call,
#   bash benchmarks/kernel/peers/table_on_device.sh
# each call carrying the next wheel folder (.whl-sglang/p6, p1..p5, then .whl-peers/p1..p4), within the warm
# machine's idle release of the last call, since what a call carried stays only while the machine is warm. The first
# call also carries runs/vc (the Hopper cubins: `python -m benchmarks.kernel.bench --shapes peer-table --prebuild
# runs/vc` on the CPU box), which the script keeps in /tmp/vc; with the tree (14 MB) only p6 leaves room for it
# under a call's 64 MiB.
# A call installs what has arrived. The first call to find everything in builds FlashInfer's and XQA's JIT
# modules; the next times vattn and every peer on the peer-table shapes in one invocation, twice (runs A and B,
# BENCHMARKS.md's peer-table command), into $OUT, and prints run A's table.
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH VATTN_CACHE=/tmp/vc FLASHINFER_WORKSPACE_BASE=/tmp/fi-cache
export PYTHONPATH=$PWD
[ -d /tmp/vc ] || { [ -d runs/vc ] && cp -r runs/vc /tmp/vc; } || { echo "peer table: carry runs/vc" >&2; exit 1; }
mkdir -p /tmp/fi-cache
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
# each script names what it still lacks; one that has never had a folder carried is left for a later call
[ -d .whl-sglang ] && { source benchmarks/e2e/install_sglang_on_device.sh || exit 1; }
[ -d .whl-peers ] && { source benchmarks/kernel/peers/install_on_device.sh || exit 1; }
if [ ! -f /tmp/site/.sglang-installed ] || [ ! -f /tmp/site-fa4/.peers-installed ]; then
    echo "peer table: wheels still to carry (.whl-sglang/p1..p6, .whl-peers/p1..p4)"
    exit 0
fi
if [ ! -f /tmp/fi-cache/.prewarmed ]; then
    python3 -c "from benchmarks.kernel.peers import prewarm; from benchmarks.kernel.shapes import select; \
prewarm(select('peer-table'), ['flashinfer', 'flashinfer_bf16', 'xqa'], timeout_s=${PREWARM_S:-450})" \
        && touch /tmp/fi-cache/.prewarmed
    echo "peer table: JIT modules built; the next call times the table"
    exit 0
fi
for run in A B; do
    echo "peer table: run $run"
    VATTN_HOPPER=1 python3 -m benchmarks.kernel.bench --replays 20 --planners balanced \
        --peers flashinfer,flashinfer_bf16,xqa,fa3,fa4,sglang_triton --shapes peer-table \
        --out "$OUT/peers-$run.json" > "$OUT/peers-$run.log" 2>&1 || { tail -20 "$OUT/peers-$run.log"; exit 1; }
done
python3 -m benchmarks.kernel.bench --peer-table "$OUT/peers-A.json"
