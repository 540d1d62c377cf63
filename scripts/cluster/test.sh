#!/usr/bin/env bash
# `make test-cluster`: build (or take from the cache) the control plane, run tests/realcluster
# against it, and end with two lines: the API server's version and how many fixture x template
# pairs preflight and the scheduler agreed on (docs/cluster-tests.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
venv="${VENV:-.venv}"
bash scripts/cluster/build.sh >/dev/null || exit $?
summary="$(mktemp)"
trap 'rm -f "$summary"' EXIT
DRASLICE_CLUSTER_SUMMARY="$summary" "$venv/bin/python" -m pytest -m cluster tests/realcluster "$@"
status=$?
cat "$summary"
exit $status
