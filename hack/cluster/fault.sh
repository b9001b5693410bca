#!/usr/bin/env bash
# Injects a fault of the infrastructure into the running cluster of `make
# cluster`, for make e2e (e2e/faults_test.go) or by hand:
#
#   fault.sh restart kube-apiserver   SIGTERM the API server, start it again
#   fault.sh restart etcd             the same for etcd
#   fault.sh veth down CONTAINER      cut a pod's network: its veth's node
#   fault.sh veth up CONTAINER        end down, so that nothing it sends or
#                                     is sent reaches it (packets are lost,
#                                     its connections stay open); up again
#
# CONTAINER is a container ID of the pod (containerd://… as the pod's status
# says, or bare). A restart returns at once; node.sh does it (its log says
# when), and the caller waits for the API server to answer again.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

die() { echo "fault: $*" >&2; exit 1; }
[[ -s $run/node.pid ]] && kill -0 "$(cat "$run/node.pid")" 2>/dev/null || die "no node runs ($run/node.pid): run \`make cluster\`"

# node_veth prints the name, in the node's network namespace, of the veth
# whose other end is eth0 of the container's network namespace.
node_veth() { # container
	local id=${1#containerd://} pid link peer
	pid=$(ctr --address "$run/containerd.sock" -n k8s.io tasks ls | awk -v id="$id" '$1 == id { print $2 }')
	[[ -n $pid ]] || die "no running task of container $id"
	# "3: eth0@if12: <…>": the peer's interface index is 12.
	link=$(nsenter -t "$pid" -n ip -o link show eth0) || die "container $id (pid $pid) has no eth0"
	peer=${link#*@if}
	peer=${peer%%:*}
	ip netns exec "$NETNS" ip -o link show | awk -F': ' -v i="$peer" '$1 == i { sub(/@.*/, "", $2); print $2 }'
}

case ${1:-}/${2:-} in
restart/kube-apiserver) kill -USR1 "$(cat "$run/node.pid")" ;;
restart/etcd) kill -USR2 "$(cat "$run/node.pid")" ;;
veth/down | veth/up)
	[[ -n ${3:-} ]] || die "veth $2: which container?"
	dev=$(node_veth "$3")
	[[ -n $dev ]] || die "no veth of container $3 in network namespace $NETNS"
	ip netns exec "$NETNS" ip link set dev "$dev" "$2"
	echo "$dev $2"
	;;
*) die "usage: fault.sh restart kube-apiserver|etcd | veth down|up CONTAINER" ;;
esac
