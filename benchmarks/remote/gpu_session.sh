#!/usr/bin/env bash
# The GPU host's share of issue 6: the benchmarks and the GPU tests, one call per carried wheel
# folder (a carry holds 64 MiB; fetch_gpu_wheels.sh fills .whl/ and puts the draslice wheel in
# every folder). Run from the repository root on the GPU host; each part fits one 600 s call.
#
#   bash benchmarks/remote/gpu_session.sh fit    # carry .whl/bench-c: fit_1.5b, fit_7b (4-bit QLoRA)
#   bash benchmarks/remote/gpu_session.sh seed   # carry .whl/bench-a: env, matmul, seed comparison (TRL too)
#   bash benchmarks/remote/gpu_session.sh gpt2   # carry .whl/bench-a: env, matmul, GPT-2-124M comparison
#   bash benchmarks/remote/gpu_session.sh tests  # carry .whl/cli: pytest -m gpu, then draslice run on the GPU
#
# Results go to $OUT/<part> (OUT defaults to ./gpu-out); BUDGET_S overrides the driver's budget.
set -euo pipefail
part=${1:-}
cd "$(dirname "$0")/../.."
root=$PWD
out=${OUT:-$root/gpu-out}/$part
budget=${BUDGET_S:-520}
export PYTHONUNBUFFERED=1
case $part in
    fit) wheels=.whl/bench-c; steps=(--only fit_1.5b --only fit_7b) ;;
    seed) wheels=.whl/bench-a; steps=(--only env --only matmul --only compare_seed) ;;
    gpt2) wheels=.whl/bench-a; steps=(--only env --only matmul --only compare_gpt2_124m) ;;
    tests) wheels=.whl/cli ;;
    *) echo "usage: bash benchmarks/remote/gpu_session.sh fit|seed|gpt2|tests" >&2; exit 2 ;;
esac
if ! compgen -G "$root/$wheels/draslice-*.whl" > /dev/null; then
    echo "error: no draslice wheel in $wheels: run bash benchmarks/remote/fetch_gpu_wheels.sh first" >&2
    exit 2
fi
mkdir -p "$out"
# A fresh folder each call: on a machine kept warm between calls, pip --target would keep the
# draslice of the previous call (it does not replace a package already there).
site=/tmp/draslice-$part
rm -rf "$site"
if [ "$part" = tests ]; then   # draslice with its kfp/preflight dependencies the host lacks
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$root/$wheels"/*.whl
    # bitsandbytes (the QLoRA GPU test) when a `fit` call on the same warm machine left it
    # there: it does not fit in this carry; without it that one test is skipped, saying so.
    bnb=$(compgen -G "$root/.whl/bench-c/bitsandbytes-*.whl" || true)
    if [ -n "$bnb" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$bnb"
    fi
else                           # only draslice; gpu_all layers the rest (trl, bitsandbytes)
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$root/$wheels"/draslice-*.whl
fi
export PYTHONPATH=$site PATH=$site/bin:$PATH

if [ "$part" != tests ]; then
    exec python3 benchmarks/remote/gpu_all.py --out "$out" --budget-s "$budget" \
        --wheels "$root/$wheels" "${steps[@]}"
fi
# The tests run from a copy: in the checkout, its draslice/ folder (the CLI half of the
# package mapping) would shadow the installed package. tests/fixtures holds the fixtures; the
# benchmark tests import benchmarks/. Only the folders that hold GPU tests are collected:
# the others import test-only packages (jsonpatch, jmespath, kubernetes-validate) the host
# lacks.
work=$(mktemp -d)
cp -r tests benchmarks pyproject.toml "$work/"
(cd "$work" && timeout 420 python3 -m pytest -q -p no:cacheprovider -rs -m gpu \
    tests/trainer tests/benchmarks) 2>&1 | tee "$out/gpu_tests.log" || true
(cd "$work" && timeout 150 draslice run) 2>&1 | tee "$out/draslice_run.log" | tail -25
