#!/usr/bin/env bash
# The node's sandbox ("pause") image for `make test-node` (docs/cluster-tests.md): Debian's static
# catatonit in pause mode (`catatonit -P`, what podman's pause image runs), in an image built with
# buildah from scratch, because registry.k8s.io's pause image cannot be pulled here.
#
# Cached by catatonit's Debian version under ${XDG_CACHE_HOME:-$HOME/.cache}/draslice/images/;
# prints the docker-archive's path and then the image reference as its last two lines.
set -euo pipefail
ref="localhost/draslice/pause:catatonit"
need=()
command -v buildah >/dev/null || need+=(buildah)
[[ -x /usr/bin/catatonit ]] || need+=(catatonit)
if ((${#need[@]})); then
    echo "installing ${need[*]} from Debian" >&2
    apt-get install -y --no-install-recommends "${need[@]}" >&2 \
        || { apt-get update >&2 && apt-get install -y --no-install-recommends "${need[@]}" >&2; }
fi
version="$(dpkg-query -W -f '${Version}' catatonit)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/draslice/images"
out="$cache/pause-catatonit-$version.tar"
if [[ ! -s "$out" ]]; then
    mkdir -p "$cache"
    ctr="$(buildah from scratch)"
    trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
    buildah copy "$ctr" /usr/bin/catatonit /catatonit >/dev/null
    buildah config --entrypoint '["/catatonit", "-P"]' --user 65535:65535 "$ctr"
    buildah commit -q "$ctr" "$ref" >/dev/null
    buildah push -q "$ref" "docker-archive:$out.tmp:$ref" >&2
    mv "$out.tmp" "$out"
    echo "built $ref (catatonit $version)" >&2
fi
echo "$out"
echo "$ref"
