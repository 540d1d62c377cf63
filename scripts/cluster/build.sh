#!/usr/bin/env bash
# Builds the control plane that `make test-cluster` runs (docs/cluster-tests.md): kube-apiserver,
# kube-controller-manager, kube-scheduler and kubectl from k8s.io/kubernetes, and etcd from
# go.etcd.io/etcd/server/v3, all from the Go module proxy through the wrapper module in
# scripts/cluster/k8s/ (its go.mod pins the release and replaces every staging module).
#
# The binaries are cached outside the repository, keyed by release and by the wrapper's go.sum,
# so a fresh clone on the same machine (CI) builds once per machine:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/draslice/k8s/<k8s version>-<go.sum hash>/
# Prints that folder on stdout as its last line; progress goes to stderr.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mod="$here/k8s"
k8s_version="$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' "$mod/go.mod")"
etcd_version="$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2; exit}' "$mod/go.mod")"
sum_hash="$(sha256sum "$mod/go.sum" | cut -c1-12)"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/draslice/k8s"
dest="$cache_root/$k8s_version-$sum_hash"
bins=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd)

have_all() {
    local b
    for b in "${bins[@]}"; do [[ -x "$dest/$b" ]] || return 1; done
}

if have_all; then
    echo "control plane $k8s_version (etcd $etcd_version): cached in $dest" >&2
    echo "$dest"
    exit 0
fi

# shellcheck source=ldflags.sh
source "$here/ldflags.sh"
ldflags="$(k8s_ldflags "$k8s_version")"

mkdir -p "$cache_root"
tmp="$(mktemp -d "$cache_root/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
echo "building control plane $k8s_version and etcd $etcd_version into $dest (cold: tens of minutes on 2 cores)" >&2
cd "$mod"
export CGO_ENABLED=0
for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$tmp/$b" "k8s.io/kubernetes/cmd/$b"
    echo "  built $b ($((SECONDS - start)) s so far)" >&2
done
nice -n 10 go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
echo "  built etcd ($((SECONDS - start)) s in all)" >&2
printf 'kubernetes %s\netcd %s\ngo %s\n' "$k8s_version" "$etcd_version" "$(go env GOVERSION)" > "$tmp/VERSIONS"
rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
echo "$dest"
