#!/usr/bin/env bash
# Issue 16's peer benchmarks on the GPU host. A carry holds 64 MiB, so the wheels of
# benchmarks/remote/gpu_wheels.txt travel one folder per call (`peers`: Liger, TRL, Unsloth and
# theirs, 47 MiB; `bench-c`: bitsandbytes, 42 MiB) into one site folder that stays while the
# machine is warm (it idles out about 30 s after a call: make the calls back to back).
# Run from the repository root on the GPU host:
#
#   bash benchmarks/remote/peers_session.sh install .whl/peers      # call 1 (carry .whl/peers)
#   bash benchmarks/remote/peers_session.sh install .whl/bench-c    # call 2 (carry .whl/bench-c)
#   bash benchmarks/remote/peers_session.sh install .whl/peers-one  # or both in one carry,
#       trimmed by benchmarks/remote/trim_wheels.py (34 MiB): one call needs no warm machine
#   bash benchmarks/remote/peers_session.sh bench ARGS...     # python benchmarks/peer_trainers.py ARGS
#   bash benchmarks/remote/peers_session.sh python ARGS...    # e.g. benchmarks/advise_time.py ARGS
#   bash benchmarks/remote/peers_session.sh pytest ARGS...    # pytest ARGS, on a copy of tests/
#
# Each folder carries the draslice wheel of the working tree (fetch_gpu_wheels.sh puts it
# there); `install` replaces the one installed before, so a later call runs the code it carried.
set -euo pipefail
cd "$(dirname "$0")/../.."
site=/tmp/draslice-peers
what=${1:-}
shift || true
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
case $what in
    install)
        for folder in "$@"; do
            python3 -m pip install -q --no-index --no-deps --no-compile --upgrade \
                --target "$site" "$folder"/*.whl
        done
        python3 -m pip list --path "$site" 2>/dev/null | tail -n +3 | tr -s ' ' | paste -sd, -
        python3 -c "import torch, transformers, peft; print('host: torch', torch.__version__, \
'transformers', transformers.__version__, 'peft', peft.__version__)" ;;
    bench)
        exec python3 benchmarks/peer_trainers.py "$@" ;;
    python)
        exec python3 "$@" ;;
    pytest)
        # From a copy: in the checkout, the repository root (the package's folder tree) would
        # shadow the installed draslice.
        work=$(mktemp -d)
        cp -r tests benchmarks pyproject.toml "$work/"
        cd "$work" && exec python3 -m pytest -q -p no:cacheprovider -rs "$@" ;;
    *)
        echo "usage: bash benchmarks/remote/peers_session.sh install FOLDER... | bench ARGS | python ARGS | pytest ARGS" >&2
        exit 2 ;;
esac
