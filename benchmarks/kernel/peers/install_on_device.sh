# Source this from the repo root on the GPU machine (no network, the image's python3 3.12, torch 2.11):
#   source benchmarks/kernel/peers/install_on_device.sh || exit 1
# Installs the peer kernels carried in .whl-peers/p1, p2, ... (python3 -m benchmarks.kernel.peers.make_wheels
# fills them; one folder a `run` call, and what a call carried stays while the machine is warm): FlashInfer 0.7.2
# into /tmp/site-fi, FA4 into /tmp/site-fa4, once every file has arrived and matches
# benchmarks/kernel/peers/wheels.sha256. Then puts both before the tree on PYTHONPATH (FlashInfer 0.7.2 first:
# it shadows the 0.6.15 that sglang brings, benchmarks/e2e/install_sglang_on_device.sh's /tmp/site).
_peers_install() {
    local dir="$PWD/.whl-peers" sums="$PWD/benchmarks/kernel/peers/wheels.sha256" missing=0 joined=/tmp/peer-wheels
    [ -d "$dir" ] || { echo "install_peers: no $dir: pass carry: [\".whl-peers/pN\"]" >&2; return 1; }
    while read -r sum name; do
        [ -z "$name" ] && continue
        if [ ! -f "$dir/$name" ]; then echo "install_peers: not here yet: $name"; missing=1; continue; fi
        echo "$sum  $dir/$name" | sha256sum -c --quiet - || { echo "install_peers: checksum mismatch: $name" >&2; return 1; }
    done < <(grep -v '^#' "$sums")
    [ "$missing" = 0 ] || return 0  # the next call brings the rest
    [ -f /tmp/site-fa4/.peers-installed ] && return 0
    rm -rf "$joined" && mkdir -p "$joined"
    cp "$dir"/p*/*.whl "$joined"/
    local part base
    for part in "$dir"/p*/*.whl.part00; do  # a split wheel: its parts in order (each checked above)
        [ -e "$part" ] || continue
        base=$(basename "$part" .part00)
        # in part order, whichever folder each part came in
        printf '%s\n' "$dir"/p*/"$base".part* | awk -F/ '{print $NF "\t" $0}' | sort | cut -f2 \
            | xargs cat > "$joined/$base"
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-fi \
        "$joined"/flashinfer_python-*.whl "$joined"/apache_tvm_ffi-*.whl || return 1
    rm "$joined"/flashinfer_python-*.whl "$joined"/apache_tvm_ffi-*.whl
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-fa4 "$joined"/*.whl || return 1
    touch /tmp/site-fa4/.peers-installed
    echo "install_peers: FlashInfer in /tmp/site-fi, FA4 in /tmp/site-fa4"
}
_peers_install || return 1
if [ -f /tmp/site-fa4/.peers-installed ]; then
    # the CuTe DSL's packages sit under a .pth file, which PYTHONPATH entries do not read
    export PYTHONPATH="/tmp/site-fi:${PYTHONPATH:+$PYTHONPATH:}/tmp/site-fa4:/tmp/site-fa4/nvidia_cutlass_dsl/dsl_packages:$PWD"
fi
