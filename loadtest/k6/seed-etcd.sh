#!/usr/bin/env bash
# Puts the domains and keys the k6 scripts bind into the etcd of
# deploy/config-etcd (deploy/kind's config center), as a user would with
# etcdctl: domain-0…domain-$((DOMAINS-1)), each with key-0…key-$((KEYS_PER_DOMAIN-1)),
# under /kshard/config, through a port-forward to its Service and with the
# client certificate of the replicas' Secret. etcdctl comes with `make
# controlplane` (bin/k8s/etcdctl) or etcd's releases.
set -euo pipefail

DOMAINS=${DOMAINS:-50}
KEYS_PER_DOMAIN=${KEYS_PER_DOMAIN:-20}
NAMESPACE=${KSHARD_NAMESPACE:-kshard-system}
ETCDCTL=${ETCDCTL:-$(command -v etcdctl || echo bin/k8s/etcdctl)}
PORT=${PORT:-23790}

tls=$(mktemp -d)
kubectl -n "$NAMESPACE" port-forward svc/config-etcd "$PORT:2379" >/dev/null &
forward=$!
trap 'kill $forward 2>/dev/null; rm -rf "$tls"' EXIT
for f in ca.crt tls.crt tls.key; do
	kubectl -n "$NAMESPACE" get secret kshard-etcd-client -o "go-template={{index .data \"$f\"}}" | base64 -d >"$tls/$f"
done
etcdctl=("$ETCDCTL" --endpoints "https://localhost:$PORT" --cacert "$tls/ca.crt" --cert "$tls/tls.crt" --key "$tls/tls.key")
for _ in $(seq 50); do "${etcdctl[@]}" endpoint health >/dev/null 2>&1 && break; sleep 0.2; done
for ((d = 0; d < DOMAINS; d++)); do
	for ((k = 0; k < KEYS_PER_DOMAIN; k++)); do
		"${etcdctl[@]}" put "/kshard/config/domain-$d/key-$k" "value of domain-$d/key-$k" >/dev/null
	done
done
echo "put $((DOMAINS * KEYS_PER_DOMAIN)) keys ($DOMAINS domains × $KEYS_PER_DOMAIN keys) into the etcd of $NAMESPACE"
