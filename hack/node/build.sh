#!/usr/bin/env bash
# Builds the node and controller binaries of `make cluster` (kubelet,
# kube-controller-manager, kube-scheduler, kube-proxy and a kubectl of the
# same version) from the k8s.io/kubernetes version pinned in this folder's
# go.mod, into the folder given as $1 (default bin/node), plus the pause
# binary from the C source that the same module ships (build/pause).
#
# The Go binaries are built by ONE `go build` so that the packages they share
# (most of k8s.io/kubernetes) compile once. Idempotent: a binary that already
# reports the pinned version is kept, and only the others are built.
set -euo pipefail
# This folder's modules are not in the repository's go.work (their pins
# would raise the main module's): go runs each on its own.
export GOWORK=off

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$(mkdir -p "${1:-$here/../../bin/node}" && cd "${1:-$here/../../bin/node}" && pwd)

k8s_version=$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
# go list -m names the module's folder only once it is in the module cache,
# which on a fresh machine it is not before the first build.
(cd "$here" && go mod download k8s.io/kubernetes)
k8s_dir=$(cd "$here" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
[[ -f $k8s_dir/build/pause/linux/pause.c ]] || { echo "node: no build/pause/linux/pause.c in k8s.io/kubernetes ($k8s_dir)" >&2; exit 1; }
# The pause version upstream stamps into its image (build/pause/Makefile TAG).
pause_version=$(sed -n 's/^TAG ?= *//p' "$k8s_dir/build/pause/Makefile")

# progress turns `go build -v` (one line per package) into a line every 100
# packages, so a first build of minutes shows it is alive.
progress() {
	awk '{ n++; if (n % 100 == 0) { printf "  node binaries: %d packages compiled\n", n; fflush() } }'
}

# reports prints what a binary says its version is. Versions are read into
# variables, never piped into grep -q or head: those exit at the first line,
# and with pipefail the writer's SIGPIPE would fail the check.
reports() { # name
	case $1 in
	kubectl) "$out/kubectl" version --client 2>/dev/null | sed -n 's/^Client Version: //p' || true ;;
	*) "$out/$1" --version 2>/dev/null | sed -n 's/^Kubernetes //p' || true ;;
	esac
}

missing=()
for name in kubelet kube-controller-manager kube-scheduler kube-proxy kubectl; do
	if [[ -x $out/$name ]] && [[ $(reports "$name") == "$k8s_version" ]]; then
		echo "$name $k8s_version present in $out"
	else
		missing+=("$name")
	fi
done

if ((${#missing[@]} > 0)); then
	minor=${k8s_version#v1.}
	minor=${minor%%.*}
	v=k8s.io/component-base/version
	ldflags="-s -w -X $v.gitVersion=$k8s_version -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean -X $v.buildDate=1970-01-01T00:00:00Z"
	pkgs=()
	for name in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$name"); done
	tmp="$out/.tmp"
	rm -rf "$tmp" && mkdir -p "$tmp"
	echo "building ${missing[*]} into $out in one go build (first build: 2-3 minutes on 2 cores after make controlplane)"
	start=$SECONDS
	(cd "$here" && go build -v -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}") 2>&1 | progress
	# pipefail makes a failed build fail here; the renames keep a half-written
	# binary from ever looking complete.
	for name in "${missing[@]}"; do mv "$tmp/$name" "$out/$name"; done
	rmdir "$tmp"
	echo "built ${missing[*]} in $((SECONDS - start))s"
fi

# pause: the sandbox process every pod starts with. Upstream builds it with
# gcc -static from build/pause/linux/pause.c; so do we, with its CFLAGS.
if [[ -x $out/pause ]] && [[ $("$out/pause" -v 2>/dev/null || true) == "pause.c v$pause_version-$k8s_version" ]]; then
	echo "pause $pause_version present in $out"
else
	command -v gcc >/dev/null || { echo "gcc is needed to build the pause binary (apt-get install -y gcc)" >&2; exit 1; }
	gcc -Os -Wall -Werror -static "-DVERSION=v$pause_version-$k8s_version" \
		-o "$out/.pause.tmp" "$k8s_dir/build/pause/linux/pause.c"
	mv "$out/.pause.tmp" "$out/pause"
	echo "built pause $pause_version"
fi

for name in kubelet kube-controller-manager kube-scheduler kube-proxy kubectl; do
	echo "$name $(reports "$name")"
done
"$out/pause" -v
