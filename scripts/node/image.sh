#!/usr/bin/env bash
# Builds the trainer image from trainer/Dockerfile, unchanged, with buildah and no registry
# (docs/kfp-commands.md#building-the-image-with-buildah). The Dockerfile's base images cannot be
# pulled here, so local stand-ins are built first and passed as its BASE_IMAGE and GO_IMAGE:
#   base-python  Debian bookworm (mmdebstrap) + a Python 3.11 venv + torch at the Makefile's pin
#   base-go      the same rootfs + this machine's Go release (`go env GOVERSION`), taken from the
#                module proxy's golang.org/toolchain module, else from this machine's GOROOT
# Every image is cached under ${XDG_CACHE_HOME:-$HOME/.cache}/draslice/images/, keyed by a hash of
# what goes into it (the recipe and versions; for the trainer the Dockerfile, the files it copies
# and the bases' keys), so a rerun with nothing changed takes well under a second. buildah's
# storage (overlay driver, with its layer cache) is images/buildah/. Downloads are kept too:
# torch's wheels in ~/.cache/draslice/wheels (pip's HTTP cache keeps nothing where responses carry
# no cache headers), Go's modules and builds in this machine's own Go caches.
#
# Run as root. Prints the OCI archive (zstd layers, for `ctr -n k8s.io images import`) and the
# image reference as its last two lines on stdout; progress goes to stderr.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/draslice"
images="$cache/images"
python="${PYTHON:-$repo/.venv/bin/python}"
# The machine's trust store, mounted over the images' own while they build: what makes TLS to
# the package registries verify on machines whose egress re-signs it (not kept in any image).
host_ca="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}"
log() { echo "$*" >&2; }
digest() { sha256sum | cut -c1-16; }

if ! command -v buildah >/dev/null || ! command -v mmdebstrap >/dev/null \
        || ! command -v runc >/dev/null; then
    log "installing buildah, mmdebstrap and runc (Debian)"
    apt-get update >&2
    apt-get install -y --no-install-recommends buildah mmdebstrap runc >&2
fi
bh=(buildah --root "$images/buildah" --runroot /run/draslice-buildah --storage-driver overlay)
mkdir -p "$images" "$cache/wheels"
tmp="$(mktemp -d "$images/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# --- the keys: cheap to compute, so a warm run stops at the first check below ---
suite=bookworm
packages=python3,python3-venv,ca-certificates,passwd
mirrors=("deb http://deb.debian.org/debian $suite main"
         "deb http://deb.debian.org/debian $suite-updates main"
         "deb http://deb.debian.org/debian-security $suite-security main")
rootfs_key="$(printf '%s\n' minbase "$suite" "$packages" "${mirrors[@]}" | digest)"
torch="$(awk -F' *[?]= *' '$1 == "TORCH" {print $2; exit}' "$repo/Makefile")"
py_key="$( { cat "$here/base-python.Containerfile"; echo "$rootfs_key $torch"; } | digest)"
go_version="$(go env GOVERSION)"
go_args=(--build-arg "GOPROXY=$(go env GOPROXY)" --build-arg "GOSUMDB=$(go env GOSUMDB)")
go_key="$( { cat "$here/base-go.Containerfile"; echo "$rootfs_key $go_version ${go_args[*]}"; } \
          | digest)"
ref="$("$python" -c 'from draslice.components.image import trainer_image; print(trainer_image())')"
# The trainer's inputs: the Dockerfile and every file its COPY lines take from the repository.
cd "$repo"
read -r -a sources <<< "$(awk '$1 == "COPY" && $2 !~ /^--from/ {for (i = 2; i < NF; i++)
                                printf "%s ", $i}' trainer/Dockerfile)"
compression=zstd
# What the COPY lines take: .dockerignore leaves out Python's byte code, which a checkout grows
# as it runs (so a clean clone and a used one have the same key).
files() { find "${sources[@]}" -type f -not -path '*/__pycache__/*' -not -name '*.py[co]' "$@"; }
trainer_key="$( { cat trainer/Dockerfile; echo "$py_key $go_key $ref $compression"
                  files -print0 | sort -z | xargs -0 stat -c '%a %n'
                  files -print0 | sort -z | xargs -0 sha256sum; } | digest)"
out="$images/trainer-$trainer_key.oci.tar"
if [[ -f "$out" ]]; then
    log "trainer image $ref: cached in $out"
    echo "$out"; echo "$ref"; exit 0
fi

start=$SECONDS
# RUN steps reach the registries on the host's network, with the host's trust store.
bud() {
    "${bh[@]}" bud --layers --network host --pull=never \
        --volume "$host_ca:/etc/ssl/certs/ca-certificates.crt:ro" "$@" >&2
}
have() { "${bh[@]}" inspect --type image "$1" >/dev/null 2>&1; }

rootfs="$images/rootfs-$suite-$rootfs_key.tar"
if [[ ! -f "$rootfs" ]]; then
    log "making the $suite rootfs ($packages) with mmdebstrap"
    mmdebstrap --variant=minbase --include="$packages" "$suite" "$tmp/rootfs.tar" "${mirrors[@]}" >&2
    mv "$tmp/rootfs.tar" "$rootfs"
fi
mkdir -p "$tmp/ctx"
ln "$rootfs" "$tmp/ctx/rootfs.tar"

py_ref="localhost/draslice/base-python:$py_key"
if ! have "$py_ref"; then
    log "building $py_ref ($torch from PyPI, its wheels kept in $cache/wheels)"
    # /mnt: a folder the rootfs has, so the mount leaves no new one in the image.
    bud --build-arg "TORCH=$torch" --volume "$cache/wheels:/mnt" \
        -f "$here/base-python.Containerfile" -t "$py_ref" "$tmp/ctx"
fi

go_ref="localhost/draslice/base-go:$go_key"
if ! have "$go_ref"; then
    module="golang.org/toolchain@v0.0.1-$go_version.linux-$(go env GOARCH)"
    if goroot="$(cd "$tmp" && go mod download -json "$module" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')" \
            && [[ -n "$goroot" ]]; then
        log "building $go_ref ($go_version from the module proxy: $module)"
    else
        goroot="$(go env GOROOT)"
        log "building $go_ref ($go_version from this machine's GOROOT $goroot: the proxy refused $module)"
    fi
    cp -a "$goroot" "$tmp/ctx/go"
    # Module zips carry no file modes: the go command marks the tools executable, as here.
    chmod -R u+w "$tmp/ctx/go"
    chmod +x "$tmp/ctx/go"/bin/* "$tmp/ctx/go"/pkg/tool/*/*
    bud "${go_args[@]}" -f "$here/base-go.Containerfile" -t "$go_ref" "$tmp/ctx"
fi

log "building $ref from trainer/Dockerfile"
trainer=(--build-arg "BASE_IMAGE=$py_ref" --build-arg "GO_IMAGE=$go_ref" -f trainer/Dockerfile .)
# The allocator stage first, on this machine's Go caches; the whole build then reuses its layers,
# so the caches' mount points stay out of the trainer image's stages.
bud --volume "$(go env GOMODCACHE):/go/pkg/mod" --volume "$(go env GOCACHE):/root/.cache/go-build" \
    --target allocator "${trainer[@]}"
bud -t "$ref" "${trainer[@]}"
"${bh[@]}" push --compression-format "$compression" "$ref" \
    "oci-archive:$tmp/trainer.oci.tar:$ref" >&2
# Each archive is the whole image (gigabytes): keep only the newest, and drop the storage's
# images no tag names any more (the previous trainer's), keeping the tagged bases.
rm -f "$images"/trainer-*.oci.tar
"${bh[@]}" rmi --prune >/dev/null 2>&1 || true
mv "$tmp/trainer.oci.tar" "$out"
log "built $ref in $((SECONDS - start)) s: $out ($(du -h "$out" | cut -f1))"
echo "$out"
echo "$ref"
