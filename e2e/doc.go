// Package e2e proves kshard as users run it: on the real single node of
// `make cluster` (docs/cluster.md), with kube-controller-manager's
// StatefulSet and HPA controllers, the scheduler and the kubelet, and
// kshard's replicas as pods of its own image, installed from deploy/ as
// shipped plus the overlay in e2e/overlay.
//
// `make e2e` runs it against that cluster. Without KSHARD_E2E_KUBECONFIG
// every test skips, so `make test` compiles it and runs none of it.
package e2e
