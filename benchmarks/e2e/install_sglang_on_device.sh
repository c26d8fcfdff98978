# Source this from the repo root on the GPU machine (no network, the image's python3 3.12, torch 2.11):
#   source benchmarks/e2e/install_sglang_on_device.sh || exit 1
# Installs sglang 0.5.17 with sglang-kernel 0.4.5 into /tmp/site from wheels carried in .whl-sglang/
# (git-ignored; `run` with carry: [".whl-sglang"]), after checking each file against the checksums in
# benchmarks/e2e/sglang-0.5.17.sha256. Run benchmarks/e2e/make_sglang_wheels.py on a machine with
# network to fill .whl-sglang/.
# The carried files exceed one call's 64 MiB, so they travel in folders .whl-sglang/p1, p2, ... over
# consecutive calls while the machine stays warm (carry: [".whl-sglang/pN"]; what a call carried stays
# until the machine is given back). FA3 (sgl_kernel/flash_ops.abi3.so) travels xz-compressed in parts
# (flash_ops.abi3.so.xz.partNN); only the FA3 base needs it. Each call may source this script: it installs
# what has arrived and names what is still missing.
_sglang_install() {
    local repo dir sums missing=0 f
    repo=$(pwd)
    dir="$repo/.whl-sglang"
    sums="$repo/benchmarks/e2e/sglang-0.5.17.sha256"
    [ -d "$dir" ] || { echo "install_sglang: no $dir: pass carry: [\".whl-sglang\"]" >&2; return 1; }
    while read -r sum name; do
        [ -z "$name" ] && continue
        if [ ! -f "$dir/$name" ]; then
            echo "install_sglang: not here yet: $name"; missing=1; continue
        fi
        echo "$sum  $dir/$name" | sha256sum -c --quiet - || { echo "install_sglang: checksum mismatch: $name" >&2; return 1; }
    done < <(grep -v '^#' "$sums")
    f=$(ls "$dir"/p*/*.whl 2>/dev/null)
    if [ "$missing" = 0 ] && [ -f /tmp/site/.sglang-installed ]; then
        :  # an earlier call on this machine installed the whole set
    elif [ -n "$f" ]; then
        # shellcheck disable=SC2086  # one path a line, no spaces in wheel names
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site $f || return 1
    fi
    # FA3 once every part is here and checked (xz checks the whole stream's CRC as it decompresses)
    if [ "$missing" = 0 ] && [ ! -f /tmp/site/sgl_kernel/flash_ops.abi3.so ]; then
        python3 - "$dir" /tmp/site/sgl_kernel/flash_ops.abi3.so <<'PY' || { rm -f /tmp/site/sgl_kernel/flash_ops.abi3.so; return 1; }
import io, lzma, pathlib, shutil, sys
parts = sorted(pathlib.Path(sys.argv[1]).glob("p*/flash_ops.abi3.so.xz.part*"), key=lambda p: p.name)
stream = io.BytesIO(b"".join(p.read_bytes() for p in parts))
with lzma.open(stream) as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 2**24)
PY
    fi
    export PYTHONPATH="/tmp/site:$repo"
    [ "$missing" = 0 ] || { echo "install_sglang: parts still to carry (see above)"; return 0; }
    touch /tmp/site/.sglang-installed
    python3 -c "import sgl_kernel, sglang; print('install_sglang: sglang', sglang.__version__, 'sgl_kernel', sgl_kernel.__version__)" \
        || return 1
    python3 -c "from sgl_kernel.flash_attn import flash_attn_with_kvcache" 2>/dev/null \
        && echo "install_sglang: FA3 (sgl_kernel.flash_ops) imports" || echo "install_sglang: FA3 not importable"
    python3 -m sglang.launch_server --help > /dev/null || { echo "install_sglang: launch_server --help failed" >&2; return 1; }
    echo "install_sglang: ok; PYTHONPATH=$PYTHONPATH"
}
_sglang_install
