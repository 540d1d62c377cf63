#!/usr/bin/env bash
# Builds the node that `make test-node` runs (docs/cluster-tests.md), all from the Go module proxy:
# - kubelet from k8s.io/kubernetes, through the control plane's wrapper module (scripts/cluster/k8s,
#   whose go.mod pins the release and every staging module);
# - dradriver: Kubernetes' own DRA test driver (k8s.io/kubernetes/test/e2e/dra/test-driver) as a
#   kubelet plugin that publishes MIG-shaped devices (scripts/cluster/k8s/dradriver);
# - containerd, its runc shim and ctr from github.com/containerd/containerd/v2 (scripts/node/containerd).
# runc and the CNI plugins come from Debian (scripts/node/test.sh installs them).
#
# Cached outside the repository, keyed by both modules' releases, go.sum files and the driver's
# source, so a fresh clone on the same machine (CI) builds once per machine:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/draslice/node/<k8s version>-<containerd version>-<hash>/
# Prints that folder on stdout as its last line; progress goes to stderr.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
k8s_mod="$here/../cluster/k8s"
ctd_mod="$here/containerd"
k8s_version="$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$k8s_mod/go.mod")"
ctd_version="$(awk '$1 == "require" && $2 == "github.com/containerd/containerd/v2" {print $3; exit}' "$ctd_mod/go.mod")"
key="$(cat "$k8s_mod/go.sum" "$ctd_mod/go.sum" "$k8s_mod"/dradriver/*.go "$0" | sha256sum | cut -c1-12)"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/draslice/node"
dest="$cache_root/$k8s_version-$ctd_version-$key"
bins=(kubelet dradriver containerd containerd-shim-runc-v2 ctr)

have_all() {
    local b
    for b in "${bins[@]}"; do [[ -x "$dest/$b" ]] || return 1; done
}

if have_all; then
    echo "node: kubelet $k8s_version, containerd $ctd_version: cached in $dest" >&2
    echo "$dest"
    exit 0
fi

# shellcheck source=../cluster/ldflags.sh
source "$here/../cluster/ldflags.sh"
ldflags="$(k8s_ldflags "$k8s_version")"

mkdir -p "$cache_root"
tmp="$(mktemp -d "$cache_root/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
echo "building kubelet $k8s_version, the DRA test driver and containerd $ctd_version into $dest" >&2
export CGO_ENABLED=0
cd "$k8s_mod"
nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$tmp/kubelet" k8s.io/kubernetes/cmd/kubelet
echo "  built kubelet ($((SECONDS - start)) s so far)" >&2
nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$tmp/dradriver" ./dradriver
echo "  built dradriver ($((SECONDS - start)) s so far)" >&2
cd "$ctd_mod"
ctd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$ctd_version"
ctd_ldflags+=" -X github.com/containerd/containerd/v2/version.Revision=module-proxy"
for b in containerd containerd-shim-runc-v2 ctr; do
    nice -n 10 go build -trimpath -tags no_btrfs -ldflags "$ctd_ldflags" -o "$tmp/$b" \
        "github.com/containerd/containerd/v2/cmd/$b"
    echo "  built $b ($((SECONDS - start)) s so far)" >&2
done
printf 'kubernetes %s\ncontainerd %s\ngo %s\n' "$k8s_version" "$ctd_version" "$(go env GOVERSION)" \
    > "$tmp/VERSIONS"
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "built the node in $((SECONDS - start)) s" >&2
echo "$dest"
