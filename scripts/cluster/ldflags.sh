# Sourced by scripts/cluster/build.sh and scripts/node/build.sh: k8s_ldflags VERSION prints what
# the upstream release build stamps into its binaries (hack/lib/version.sh), so that /version,
# `kubectl version` and `kubelet --version` say the release rather than v0.0.0-master.
k8s_ldflags() {
    local version="$1" minor pkg flags="-s -w"
    minor="${version#v1.}"; minor="${minor%%.*}"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    echo "$flags"
}
