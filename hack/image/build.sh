#!/usr/bin/env bash
# Writes the images `make cluster` imports, as docker archives, without a
# container engine: kshard:dev (the static kshard, kshard-metrics-adapter,
# configcenter and examples/teamdigest binaries, user 65532, like the Dockerfile's distroless image),
# etcd:dev (deploy/config-etcd's config center), spicedb:dev (deploy/spicedb's
# authorization system), prometheus:dev, keda:dev (with KEDA's manifests rendered into bin/keda for
# e2e/keda) and the pause image (bin/node/pause, built from the Kubernetes module's C
# source by hack/node/build.sh). $1 is the bin folder (default bin/).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin=$(mkdir -p "${1:-$repo/bin}" && cd "${1:-$repo/bin}" && pwd)

[[ -x $bin/node/pause ]] || { echo "image: $bin/node/pause is missing: run \`make node-binaries\`" >&2; exit 1; }

# The Dockerfile's build line: static, no cgo, stripped.
(cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$bin/image/" ./cmd/kshard ./cmd/kshard-metrics-adapter ./cmd/configcenter ./examples/teamdigest)
(cd "$here" && GOWORK=off go build -o "$bin/image/image" .)

"$bin/image/image" -tag kshard:dev -o "$bin/images/kshard.tar" -user 65532:65532 -entrypoint /kshard \
	-add "/kshard=$bin/image/kshard" -add "/kshard-metrics-adapter=$bin/image/kshard-metrics-adapter" \
	-add "/configcenter=$bin/image/configcenter" -add "/teamdigest=$bin/image/teamdigest"
# etcd:dev, for deploy/config-etcd: etcd from the control plane's pinned
# module (hack/controlplane/etcd), static, at the path of etcd's release
# image (/usr/local/bin/etcd).
(cd "$repo/hack/controlplane/etcd" && GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$bin/image/etcd" .)
"$bin/image/image" -tag etcd:dev -o "$bin/images/etcd.tar" -user 65532:65532 -entrypoint /usr/local/bin/etcd \
	-add "/usr/local/bin/etcd=$bin/image/etcd"
# spicedb:dev, for deploy/spicedb: SpiceDB from the pinned module
# (hack/spicedb, the Makefile's build of bin/spicedb), at the path of
# SpiceDB's release image (/usr/local/bin/spicedb).
(cd "$repo/hack/spicedb" && GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$bin/image/spicedb" github.com/authzed/spicedb/cmd/spicedb)
"$bin/image/image" -tag spicedb:dev -o "$bin/images/spicedb.tar" -user 65532:65532 -entrypoint /usr/local/bin/spicedb \
	-add "/usr/local/bin/spicedb=$bin/image/spicedb"
# prometheus:dev, for deploy/node-prometheus: Prometheus from the pinned
# module (hack/prometheus), static, no web UI assets (the API is what the
# end-to-end suite reads), and of the service discoveries only Kubernetes's
# (the Makefile's PROMETHEUS_TAGS: a third of the compile).
(cd "$repo/hack/prometheus" && GOWORK=off CGO_ENABLED=0 go build -tags remove_all_sd,enable_kubernetes_sd -trimpath -ldflags="-s -w" \
	-o "$bin/image/prometheus" github.com/prometheus/prometheus/cmd/prometheus)
"$bin/image/image" -tag prometheus:dev -o "$bin/images/prometheus.tar" -user 65532:65532 -entrypoint /bin/prometheus \
	-add "/bin/prometheus=$bin/image/prometheus"
# keda:dev, for e2e/keda: KEDA's operator (/keda) and external-metrics server
# (/keda-adapter) from the pinned module (hack/keda), static, as KEDA's own
# Dockerfiles build them; and the module's config/minimal (CRDs, RBAC, the
# two Deployments, the APIService: no admission webhooks) rendered into
# bin/keda, which e2e/keda patches for the node.
(cd "$repo/hack/keda" && GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$bin/image/keda/" \
	github.com/kedacore/keda/v2/cmd/operator github.com/kedacore/keda/v2/cmd/adapter)
"$bin/image/image" -tag keda:dev -o "$bin/images/keda.tar" -user 65532:65532 -entrypoint /keda \
	-add "/keda=$bin/image/keda/operator" -add "/keda-adapter=$bin/image/keda/adapter"
keda=$(cd "$repo/hack/keda" && GOWORK=off go list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)
mkdir -p "$bin/keda"
"$bin/node/kubectl" kustomize "$keda/config/minimal" >"$bin/keda/keda.yaml"
printf '%s\n' "# KEDA's config/minimal at the version hack/keda pins, written by hack/image/build.sh." \
	"apiVersion: kustomize.config.k8s.io/v1beta1" "kind: Kustomization" "resources:" "- keda.yaml" >"$bin/keda/kustomization.yaml"
# registry.k8s.io/pause is the name containerd's sandbox_image gives; it is
# imported, never pulled. 65535 is upstream's pause user.
"$bin/image/image" -tag registry.k8s.io/pause:3.10.2 -o "$bin/images/pause.tar" -user 65535:65535 -entrypoint /pause \
	-add "/pause=$bin/node/pause"
