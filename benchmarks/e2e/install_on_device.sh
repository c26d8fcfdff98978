# Source this from the repo root on the GPU machine (no network, the image's python3 3.12):
#   source benchmarks/e2e/install_on_device.sh || exit 1
# Installs the carried wheels (`run` with carry: [".whl"]) into /tmp/site, exports PYTHONPATH so that the
# subprocesses the pipeline starts (`sys.executable -m aiperf`, `-m pipeline.emulator`) see them too, and
# puts a `pipeline` command on PATH (the repo runs from its checkout: no pip install -e).
# .whl/*.whl: always installed; .whl/ifneeded/*.whl: only those the image's versions do not satisfy
# (benchmarks/e2e/check_wheels.py select decides, reading the image before /tmp/site is on the path).
_e2e_install() {
    local repo whls
    repo=$(pwd)
    [ -d .whl ] || { echo "install_on_device: no .whl here ($repo): pass carry: [\".whl\"]" >&2; return 1; }
    whls=$(env -u PYTHONPATH python3 benchmarks/e2e/check_wheels.py select .whl) || return 1
    # shellcheck disable=SC2086  # one path a line, no spaces in wheel names
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        $whls || return 1
    export PYTHONPATH="/tmp/site:$repo"
    export MPLBACKEND=Agg
    mkdir -p /tmp/site-bin
    printf '#!/bin/sh\nexec python3 -m pipeline.cli "$@"\n' > /tmp/site-bin/pipeline
    chmod +x /tmp/site-bin/pipeline
    export PATH="/tmp/site-bin:$PATH"
    python3 -m aiperf --help > /dev/null || { echo "install_on_device: python3 -m aiperf --help failed" >&2; return 1; }
    echo "install_on_device: $(echo "$whls" | wc -l) wheels in /tmp/site; PYTHONPATH=$PYTHONPATH"
}
_e2e_install
