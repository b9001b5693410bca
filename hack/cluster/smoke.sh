#!/usr/bin/env bash
# Proves the node of `make cluster` runs kshard's image: a pod of kshard:dev
# runs `kshard --help` to Completed, then deploy/node (the base and the
# config center) is applied and its three replicas become Ready, and one
# ConfigBinding gets its ConfigMap from the config center. Prints how long
# each step took. Leaves what it applied in place (`make cluster-down`
# removes everything).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

export KUBECONFIG=$KUBECONFIG_OUT
k=("$BIN_NODE/kubectl")
step() { printf '%-60s %ss\n' "$1" "$((SECONDS - t))"; }

t=$SECONDS
"${k[@]}" -n default delete pod kshard-help --ignore-not-found >/dev/null
"${k[@]}" -n default run kshard-help --image kshard:dev --image-pull-policy Never --restart Never -- --help >/dev/null
"${k[@]}" -n default wait pod/kshard-help --for=jsonpath='{.status.phase}'=Succeeded --timeout=120s >/dev/null
out=$("${k[@]}" -n default logs kshard-help)
[[ $out == *"A sharded, multi-replica Kubernetes controller"* ]] || { echo "unexpected output of kshard --help: $out" >&2; exit 1; }
step "pod of kshard:dev ran kshard --help to Completed" 

t=$SECONDS
"${k[@]}" apply --server-side -k "$repo/deploy/node" >/dev/null
"${k[@]}" -n kshard-system rollout status deployment/configcenter --timeout=180s >/dev/null
"${k[@]}" -n kshard-system rollout status statefulset/kshard --timeout=300s >/dev/null
step "deploy/node applied, config center and 3 kshard replicas Ready"

t=$SECONDS
"${k[@]}" create namespace shop --dry-run=client -o yaml | "${k[@]}" apply -f - >/dev/null
"${k[@]}" label namespace shop kshard.dev/targets=enabled --overwrite >/dev/null
"${k[@]}" apply -f - >/dev/null <<'CB'
apiVersion: config.kshard.dev/v1alpha1
kind: ConfigBinding
metadata: {name: checkout, namespace: shop}
spec:
  domain: domain-7
  keys: [key-0, key-1]
  target: {configMapName: checkout-config}
CB
"${k[@]}" -n shop wait configbinding/checkout --for=condition=Ready --timeout=120s >/dev/null
"${k[@]}" -n shop get configmap checkout-config >/dev/null
step "ConfigBinding shop/checkout Ready with its ConfigMap"

"${k[@]}" -n kshard-system get pods -o wide
