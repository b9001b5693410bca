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
#   fault.sh hold on CONTAINER        drop what the pod sends to the API
#   fault.sh hold off CONTAINER       server (the kubernetes Service), in
#                                     the pod's network namespace: its
#                                     requests wait for TCP to send them
#                                     again, and arrive late once it is off;
#                                     what the server sends still arrives
#                                     (a one-way delay: this kernel has no
#                                     netem)
#
# CONTAINER is a container ID of the pod (containerd://… as the pod's status
# says, or bare). node.sh does a restart (SIGUSR1, SIGUSR2): this script
# returns once the component runs as a new process, and the caller waits
# for the API server to answer again.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

die() { echo "fault: $*" >&2; exit 1; }
[[ -s $run/node.pid ]] && kill -0 "$(cat "$run/node.pid")" 2>/dev/null || die "no node runs ($run/node.pid): run \`make cluster\`"

# container_pid prints the pid of the container's task.
container_pid() { # container
	local id=${1#containerd://} pid
	pid=$(ctr --address "$run/containerd.sock" -n k8s.io tasks ls | awk -v id="$id" '$1 == id { print $2 }')
	[[ -n $pid ]] || die "no running task of container $id"
	echo "$pid"
}

# node_veth prints the name, in the node's network namespace, of the veth
# whose other end is eth0 of the container's network namespace.
node_veth() { # container
	local id=${1#containerd://} pid link peer
	pid=$(container_pid "$1")
	# "3: eth0@if12: <…>": the peer's interface index is 12.
	link=$(nsenter -t "$pid" -n ip -o link show eth0) || die "container $id (pid $pid) has no eth0"
	peer=${link#*@if}
	peer=${peer%%:*}
	ip netns exec "$NETNS" ip -o link show | awk -F': ' -v i="$peer" '$1 == i { sub(/@.*/, "", $2); print $2 }'
}

# restart has node.sh restart a component and waits until its pid file
# names a new process.
restart() { # name signal
	local old new
	old=$(cat "$run/$1.pid")
	kill "-$2" "$(cat "$run/node.pid")"
	for ((i = 0; i < 120; i++)); do
		new=$(cat "$run/$1.pid")
		[[ $new != "$old" ]] && kill -0 "$new" 2>/dev/null && { echo "$1 restarted: pid $old, now $new"; return; }
		sleep 0.5
	done
	die "$1 (pid $old) was not restarted within 60s (log: $logs/node.log)"
}

case ${1:-}/${2:-} in
restart/kube-apiserver) restart kube-apiserver USR1 ;;
restart/etcd) restart etcd USR2 ;;
veth/down | veth/up)
	[[ -n ${3:-} ]] || die "veth $2: which container?"
	dev=$(node_veth "$3")
	[[ -n $dev ]] || die "no veth of container $3 in network namespace $NETNS"
	ip netns exec "$NETNS" ip link set dev "$dev" "$2"
	echo "$dev $2"
	;;
hold/on | hold/off)
	[[ -n ${3:-} ]] || die "hold $2: which container?"
	pid=$(container_pid "$3")
	rule=(OUTPUT -p tcp -d "$KUBERNETES_SERVICE_IP" --dport 443 -j DROP)
	if [[ $2 == on ]]; then
		nsenter -t "$pid" -n iptables -I "${rule[@]}"
	else
		nsenter -t "$pid" -n iptables -D "${rule[@]}"
	fi
	echo "what container ${3#containerd://} sends to $KUBERNETES_SERVICE_IP:443 is held: $2"
	;;
*) die "usage: fault.sh restart kube-apiserver|etcd | veth down|up CONTAINER | hold on|off CONTAINER" ;;
esac
