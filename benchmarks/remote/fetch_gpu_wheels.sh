#!/usr/bin/env bash
# Download the wheels of benchmarks/remote/gpu_wheels.txt for the GPU host (CPython 3.12, manylinux
# x86_64) into .whl/<group>/, build the draslice wheel into .whl/bench-a/, and check that
# every group fits one carry.
#
#   bash benchmarks/remote/fetch_gpu_wheels.sh [DEST]      (DEST defaults to .whl)
#   PIP="python3 -m pip" to choose the pip; CARRY_MIB (default 54) is the per-group limit:
#   64 MiB per carry, less room for the working tree that travels with it.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.whl}
PIP=${PIP:-python3 -m pip}
CARRY_MIB=${CARRY_MIB:-54}
LIST=benchmarks/remote/gpu_wheels.txt

platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform any)

groups=$(grep -v '^\s*#' "$LIST" | awk 'NF {print $1}' | sort -u)
for group in $groups; do
    reqs=$(grep -v '^\s*#' "$LIST" | awk -v g="$group" '$1 == g {print $2}')
    mkdir -p "$DEST/$group"
    # shellcheck disable=SC2086
    $PIP download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --abi cp312 --abi abi3 --abi none "${platforms[@]}" \
        -d "$DEST/$group" $reqs
done
$PIP wheel --quiet --no-deps --no-build-isolation -w "$DEST/bench-a" .
# kfp-server-api is published as an sdist only: build its (pure Python) wheel here.
if grep -q '^cli ' "$LIST"; then
    $PIP wheel --quiet --no-deps -w "$DEST/cli" kfp-server-api==2.17.3
fi
# Every folder travels alone (benchmarks/remote/gpu_session.sh): each gets the draslice wheel.
for group in $groups; do
    [ "$group" = bench-a ] || cp "$DEST"/bench-a/draslice-*.whl "$DEST/$group/"
done

status=0
for group in $groups; do
    bytes=$(du -cb "$DEST/$group"/*.whl | tail -1 | cut -f1)
    mib=$(( (bytes + 1048575) / 1048576 ))
    verdict=ok
    if (( mib > CARRY_MIB )); then verdict="TOO BIG for one carry (> ${CARRY_MIB} MiB)"; status=1; fi
    count=$(find "$DEST/$group" -maxdepth 1 -name "*.whl" | wc -l)
    echo "$DEST/$group: $count wheels, ${mib} MiB: $verdict"
done
exit $status
