#!/usr/bin/env bash
# Builds the local control plane (etcd and kube-apiserver) from the upstream
# module versions pinned in this folder's go.mod files, into the folder given
# as $1 (default bin/k8s): the layout envtest reads through KUBEBUILDER_ASSETS.
# etcdctl, from etcd's pinned module, comes with it: the config center of the
# sandbox is an etcd, and etcdctl is how a user changes its values.
#
# Idempotent: a binary that already reports the pinned version is kept.
set -euo pipefail
# This folder's modules are not in the repository's go.work (their pins
# would raise the main module's): go runs each on its own.
export GOWORK=off

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$(mkdir -p "${1:-$here/../../bin/k8s}" && cd "${1:-$here/../../bin/k8s}" && pwd)

k8s_version=$(cd "$here/kube-apiserver" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd_version=$(cd "$here/etcd" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)

# progress turns `go build -v` (one line per package) into a line every 100
# packages, so a ten-minute first build shows it is alive.
progress() {
	awk -v what="$1" '{ n++; if (n % 100 == 0) { printf "  %s: %d packages compiled\n", what, n; fflush() } }'
}

build() { # name module-dir package ldflags
	local name=$1 dir=$2 pkg=$3 ldflags=$4 tmp="$out/.$1.tmp"
	echo "building $name into $out (first build: several minutes on 2 cores)"
	local start=$SECONDS
	(cd "$dir" && go build -v -trimpath -ldflags "$ldflags" -o "$tmp" "$pkg") 2>&1 | progress "$name"
	# pipefail makes a failed build fail here; the rename keeps a half-written
	# binary from ever looking complete.
	mv "$tmp" "$out/$name"
	echo "built $name in $((SECONDS - start))s"
}

# Versions are read into variables, never piped into grep -q or head: those
# exit at the first line, and with pipefail the writer's SIGPIPE would fail
# the check (and rebuild) or the whole script, depending on timing.
etcd_reports() { "$out/etcd" --version 2>/dev/null || true; }
if [[ -x $out/etcd ]] && [[ $'\n'$(etcd_reports)$'\n' == *$'\n'"etcd Version: ${etcd_version#v}"$'\n'* ]]; then
	echo "etcd ${etcd_version} present in $out"
else
	build etcd "$here/etcd" . "-s -w"
fi

etcdctl_reports() { "$out/etcdctl" version 2>/dev/null || true; }
if [[ -x $out/etcdctl ]] && [[ $'\n'$(etcdctl_reports)$'\n' == *$'\n'"etcdctl version: ${etcd_version#v}"$'\n'* ]]; then
	echo "etcdctl ${etcd_version} present in $out"
else
	build etcdctl "$here/etcd" go.etcd.io/etcd/etcdctl/v3 "-s -w"
fi

if [[ -x $out/kube-apiserver ]] && [[ $("$out/kube-apiserver" --version 2>/dev/null) == "Kubernetes $k8s_version" ]]; then
	echo "kube-apiserver ${k8s_version} present in $out"
else
	minor=${k8s_version#v1.}
	minor=${minor%%.*}
	v=k8s.io/component-base/version
	build kube-apiserver "$here/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver \
		"-s -w -X $v.gitVersion=$k8s_version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
fi

"$out/kube-apiserver" --version
etcd_version_line=$(etcd_reports)
echo "${etcd_version_line%%$'\n'*}"
