#!/usr/bin/env bash
# `make test-node`: build (or take from the caches) the control plane, the node (kubelet,
# containerd, the DRA test driver), the sandbox image and the trainer image from
# trainer/Dockerfile; install runc and the CNI plugins from Debian; run tests/node on them; then
# check that nothing stayed behind, and end with the lines a script can grep
# (docs/cluster-tests.md):
#   kubelet v1.37.2 / containerd v2.4.x / dra driver <name>: N devices published /
#   pod smoke: Succeeded (claim <driver>/<pool>/<device>) / pod finetune: Succeeded /
#   pipeline pods on a real node: PASS
set -uo pipefail
cd "$(dirname "$0")/../.."
venv="${VENV:-.venv}"
if [[ $(id -u) != 0 ]]; then
    echo "make test-node runs a kubelet and containerd, which need root" >&2
    exit 2
fi
need=()
for pkg in runc containernetworking-plugins buildah mmdebstrap catatonit iproute2; do
    dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
if ((${#need[@]})); then
    echo "installing ${need[*]} from Debian" >&2
    { apt-get install -y --no-install-recommends "${need[@]}" \
        || { apt-get update && apt-get install -y --no-install-recommends "${need[@]}"; }; } >&2 \
        || exit 3
fi
start=$SECONDS
bash scripts/cluster/build.sh >/dev/null || exit $?
bash scripts/node/build.sh >/dev/null || exit $?
bash scripts/node/pause.sh >/dev/null || exit $?
bash scripts/node/image.sh >/dev/null || exit $?
echo "node parts ready in $((SECONDS - start)) s" >&2
summary="$(mktemp)"
trap 'rm -f "$summary"' EXIT
DRASLICE_NODE_SUMMARY="$summary" "$venv/bin/python" -m pytest -m node tests/node "$@"
status=$?
# Nothing of the node may outlive its tests: no process, no folder, no bridge.
left="$(pgrep -a -f 'draslice-node-' || true)"
dirs="$(ls -d "${TMPDIR:-/tmp}"/draslice-node-* 2>/dev/null || true)"
bridge="$(ip -o link show draslice0 2>/dev/null || true)"
if [[ -n "$left$dirs$bridge" ]]; then
    echo "left behind by the node tests:" >&2
    printf '%s\n' "$left" "$dirs" "$bridge" | sed '/^$/d' >&2
    status=1
    sed -i 's/: PASS$/: FAIL/' "$summary"
fi
cat "$summary"
exit $status
