#!/usr/bin/env bash
# Imports the image archives of bin/images (kshard:dev, etcd:dev, spicedb:dev, prometheus:dev,
# keda:dev and pause, written by `make node-images`) into the node's
# containerd, in the k8s.io namespace the kubelet uses. node.sh runs it at start; `make cluster-images` runs it again
# on a running cluster after a rebuild (then restart the pods to use it).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

[[ -S $run/containerd.sock ]] || { echo "images: the cluster's containerd is not running ($run/containerd.sock): run \`make cluster\`" >&2; exit 1; }
for image in "$IMAGES"/*.tar; do
	ctr --address "$run/containerd.sock" -n k8s.io images import "$image" >/dev/null
	echo "imported $image"
done
