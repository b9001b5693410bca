# Sourced by up.sh, node.sh and down.sh: where `make cluster` keeps its state
# and which addresses it uses. Every address lives inside network namespace
# $NETNS, except HOST_IP, the host's end of the one veth that lets kubectl on
# the host reach the API server.
# shellcheck shell=bash disable=SC2034 # the sourcing scripts use these

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

NETNS=${KSHARD_NETNS:-kshard-node}
NODE_NAME=${KSHARD_NODE_NAME:-kshard-node}
# The veth pair: HOST_IP on the host's end, NODE_IP on the node's end. NODE_IP
# is the node's InternalIP and the API server's advertised address.
HOST_IP=${KSHARD_HOST_IP:-10.201.0.1}
NODE_IP=${KSHARD_NODE_IP:-10.201.0.2}
VETH_HOST=${KSHARD_VETH:-kshard-veth}
VETH_NODE=eth0
POD_CIDR=${KSHARD_POD_CIDR:-10.244.0.0/24}
SERVICE_CIDR=${KSHARD_SERVICE_CIDR:-10.96.0.0/16}
KUBERNETES_SERVICE_IP=${KSHARD_KUBERNETES_SERVICE_IP:-10.96.0.1}
# deploy/node's config center: the etcd Service's fixed cluster IP, which
# its server certificate names (hack/etcdcert -ip), as the node has no DNS.
CONFIG_ETCD_IP=10.96.0.20
# The cgroup (in every hierarchy) that holds the node: kubelet's cgroupRoot,
# and, in the pids hierarchy, every process `make cluster` starts, so that
# down.sh can stop exactly those and nothing else.
CGROUP=${KSHARD_CGROUP:-kshard-node}

BIN_K8S=${KSHARD_BIN_K8S:-$repo/bin/k8s}
BIN_NODE=${KSHARD_BIN_NODE:-$repo/bin/node}
IMAGES=${KSHARD_IMAGES:-$repo/bin/images}
PAUSE_IMAGE=registry.k8s.io/pause:3.10.2

# Everything the cluster writes is under $dir: certificates, configuration,
# state (etcd, containerd, kubelet), logs and the user's kubeconfig.
dir=${KSHARD_CLUSTER_DIR:-$repo/bin/cluster}
pki=$dir/pki
etc=$dir/etc
run=$dir/run
state=$dir/state
logs=$dir/log
KUBECONFIG_OUT=$dir/kubeconfig

# netns_exists tells whether `ip netns add $NETNS` made the namespace (its
# name is a file there), without piping `ip netns list` into an early-exiting
# grep, which pipefail turns into a false answer.
netns_exists() { [[ -e /run/netns/$NETNS ]]; }

# Host paths that containerd 1.6 and the kubelet use whatever their
# configuration says. node.sh bind-mounts a folder of $state over each, in
# the node's own mount namespace only, so nothing of the host's is touched.
# (/var/lib/kubelet: the device plugin socket ignores --root-dir.)
HARDCODED_PATHS=(/run/containerd /run/netns /var/lib/cni /var/lib/kubelet /var/log/pods /var/log/containers)
