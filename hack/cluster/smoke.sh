#!/usr/bin/env bash
# Proves the node of `make cluster` runs kshard's image: a pod of kshard:dev
# runs `kshard --help` to Completed, then deploy/node (the base, an etcd as
# the config center, its certificates from hack/etcdcert, and SpiceDB, whose
# grants let namespace shop read domain-7) is applied and its three replicas
# become Ready, two values are put into the etcd with
# etcdctl, and one ConfigBinding gets them into its ConfigMap. Prints how long
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
"${k[@]}" create namespace kshard-system --dry-run=client -o yaml | "${k[@]}" apply -f - >/dev/null
if ! "${k[@]}" -n kshard-system get secret kshard-etcd-client >/dev/null 2>&1; then
	(cd "$repo" && go run ./hack/etcdcert -ip "$CONFIG_ETCD_IP") | "${k[@]}" apply --server-side -f - >/dev/null
fi
if ! "${k[@]}" -n kshard-system get secret kshard-spicedb-token >/dev/null 2>&1; then
	"${k[@]}" -n kshard-system create secret generic kshard-spicedb-token --from-literal=token="$(head -c 24 /dev/urandom | base64)" >/dev/null
fi
"${k[@]}" apply --server-side -k "$repo/deploy/node" >/dev/null
"${k[@]}" -n kshard-system rollout status statefulset/config-etcd --timeout=180s >/dev/null
"${k[@]}" -n kshard-system rollout status deployment/spicedb --timeout=180s >/dev/null
"${k[@]}" -n kshard-system rollout status statefulset/kshard --timeout=300s >/dev/null
step "deploy/node applied, its etcd, its SpiceDB and 3 kshard replicas Ready"

t=$SECONDS
# etcdctl as a user types it, with the client certificate the replicas use.
tls=$(mktemp -d)
trap 'rm -rf "$tls"' EXIT
for f in ca.crt tls.crt tls.key; do
	"${k[@]}" -n kshard-system get secret kshard-etcd-client -o "go-template={{index .data \"$f\"}}" | base64 -d >"$tls/$f"
done
etcdctl=("$BIN_K8S/etcdctl" --endpoints "https://$CONFIG_ETCD_IP:2379" --cacert "$tls/ca.crt" --cert "$tls/tls.crt" --key "$tls/tls.key")
"${etcdctl[@]}" put /kshard/config/domain-7/key-0 smoke-0 >/dev/null
"${etcdctl[@]}" put /kshard/config/domain-7/key-1 smoke-1 >/dev/null
step "etcdctl put domain-7's key-0 and key-1 into the etcd"

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
got=$("${k[@]}" -n shop get configmap checkout-config -o 'jsonpath={.data.key-0} {.data.key-1}')
[[ $got == "smoke-0 smoke-1" ]] || { echo "ConfigMap shop/checkout-config holds \"$got\", not the values put into the etcd" >&2; exit 1; }
step "ConfigBinding shop/checkout Ready with its ConfigMap"

"${k[@]}" -n kshard-system get pods -o wide
