#!/usr/bin/env bash
# The node's supervisor. up.sh starts it with `ip netns exec $NETNS`, so it
# runs in the node's network namespace and in a mount namespace of its own:
# every mount made here, by containerd or by the kubelet dies with the last
# process of that namespace, and none is ever seen by the host.
#
# It starts containerd, imports the images, starts etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kube-proxy and the kubelet, then
# waits. On SIGTERM (down.sh) it stops them in reverse order, containers
# included, and exits.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

echo $$ >"$run/node.pid"
log() { printf '%s node: %s\n' "$(date +%T)" "$*"; }
# fail tells up.sh why the node did not come up, and stops what had started.
fail() {
	log "FAILED: $*"
	echo "$*" >"$run/failed"
	shutdown
}
# Any other early exit (set -e) still answers up.sh, which waits for one.
trap 'rc=$?; [[ -e $run/ready || -e $run/failed ]] || echo "node.sh stopped before the node was up (status $rc; log: $logs/node.log)" >"$run/failed"' EXIT

# ------------------------------------------------------------------- mounts

# ip netns exec mounted a /sys for this network namespace, which hides the
# host's cgroup hierarchies: mount the same ones again (the same hierarchies,
# not new ones, so the kubelet's cgroups are the host kernel's).
mount -t tmpfs -o mode=755 cgroup-root /sys/fs/cgroup
while read -r fstype mountpoint opts; do
	mkdir -p "$mountpoint"
	if [[ $fstype == cgroup2 ]]; then
		mount -t cgroup2 cgroup2 "$mountpoint"
	else
		o=${opts#rw,}
		[[ $o == name=* ]] && o="none,$o"
		mount -t cgroup -o "$o" cgroup "$mountpoint"
	fi
done <"$run/cgroup-mounts"

# containerd 1.6 and the kubelet use these host paths whatever they are
# configured with (shim sockets, pod network namespaces, the CNI cache, pod
# logs): here they are the node's own folders.
for p in "${HARDCODED_PATHS[@]}"; do
	mkdir -p "$state/host$p"
	mount --bind "$state/host$p" "$p"
done

# The kubelet sets six kernel settings that are the host's, not the
# namespace's (vm.overcommit_memory=1, kernel.panic=10, ...) when they differ.
# The host is shared, so here each differing one reads as the kubelet wants
# it, through a read-only file mounted over it in this mount namespace only;
# the host's value is unchanged.
declare -A tunables=(
	[vm/overcommit_memory]=1 [vm/panic_on_oom]=0 [kernel/panic]=10 [kernel/panic_on_oops]=1
	[kernel/keys/root_maxkeys]=1000000 [kernel/keys/root_maxbytes]=25000000
)
mkdir -p "$state/sysctl"
for t in "${!tunables[@]}"; do
	if [[ $(cat "/proc/sys/$t") != "${tunables[$t]}" ]]; then
		f=$state/sysctl/${t//\//.}
		echo "${tunables[$t]}" >"$f"
		mount --bind -o ro "$f" "/proc/sys/$t"
		log "kernel setting $t reads ${tunables[$t]} for the kubelet (the host keeps its own value)"
	fi
done

# ------------------------------------------------------------------ cgroups

# /$CGROUP in every hierarchy is the kubelet's cgroupRoot. In the pids
# hierarchy, /$CGROUP/system holds this supervisor and so everything it
# starts (containerd's shims too); the kubelet puts the containers under
# /$CGROUP/kubepods. down.sh stops whatever is left under /$CGROUP.
while read -r _ mountpoint _; do
	mkdir -p "$mountpoint/$CGROUP"
	if [[ -e $mountpoint/cpuset.cpus ]]; then
		cat "$mountpoint/cpuset.cpus" >"$mountpoint/$CGROUP/cpuset.cpus"
		cat "$mountpoint/cpuset.mems" >"$mountpoint/$CGROUP/cpuset.mems"
	fi
done <"$run/cgroup-mounts"
pids_root=$(awk '$1 == "cgroup" && $3 ~ /(^|,)pids(,|$)/ { print $2 }' "$run/cgroup-mounts")
mkdir -p "$pids_root/$CGROUP/system"
echo $$ >"$pids_root/$CGROUP/system/cgroup.procs"

# ---------------------------------------------------------------- processes

declare -A pid=()
order=()
start() { # name command...
	local name=$1
	shift
	"$@" >>"$logs/$name.log" 2>&1 &
	pid[$name]=$!
	echo "${pid[$name]}" >"$run/$name.pid"
	[[ " ${order[*]} " == *" $name "* ]] || order+=("$name")
	log "started $name (pid ${pid[$name]})"
}

# stop sends SIGTERM and waits up to $2 seconds before SIGKILL.
stop() { # name seconds
	local name=$1 p=${pid[$1]:-}
	[[ -n $p ]] || return 0
	if kill -TERM "$p" 2>/dev/null; then
		for ((i = 0; i < $2 * 10; i++)); do
			kill -0 "$p" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$p" 2>/dev/null || true
	fi
	wait "$p" 2>/dev/null || true
	unset "pid[$name]"
	log "stopped $name"
}

# kill_cgroup signals every process under a pids cgroup, except this one.
kill_cgroup() { # folder signal
	local p procs
	[[ -d $1 ]] || return 0
	# Read all first: a pipeline's subshell would be in the cgroup too, and
	# would signal itself.
	mapfile -t procs < <(find "$1" -name cgroup.procs -exec cat {} + 2>/dev/null)
	for p in "${procs[@]}"; do
		[[ $p == "$$" ]] || kill "-$2" "$p" 2>/dev/null || true
	done
}

shutdown() {
	trap - TERM INT
	log "stopping"
	stop kubelet 30
	stop kube-proxy 10
	stop kube-scheduler 10
	stop kube-controller-manager 10
	# The containers outlive the kubelet; end them before their runtime.
	kill_cgroup "$pids_root/$CGROUP/kubepods" TERM
	sleep 2
	kill_cgroup "$pids_root/$CGROUP/kubepods" KILL
	stop containerd 10
	stop kube-apiserver 20
	stop etcd 10
	# What is left are containerd's shims, which outlive containerd by design.
	kill_cgroup "$pids_root/$CGROUP" TERM
	sleep 1
	kill_cgroup "$pids_root/$CGROUP" KILL
	log "stopped"
	[[ -e $run/failed ]] && exit 1
	exit 0
}
trap shutdown TERM INT

k=("$BIN_NODE/kubectl" --kubeconfig "$KUBECONFIG_OUT")

start containerd containerd --config "$etc/containerd.toml"
for ((i = 0; i < 60; i++)); do
	ctr --address "$run/containerd.sock" version >/dev/null 2>&1 && break
	kill -0 "${pid[containerd]}" 2>/dev/null || fail "containerd exited (log: $logs/containerd.log)"
	sleep 0.5
done
ctr --address "$run/containerd.sock" version >/dev/null 2>&1 || fail "containerd did not answer on $run/containerd.sock within 30s"
"$repo/hack/cluster/images.sh" >>"$logs/images.log" 2>&1 || fail "importing the images of $IMAGES failed (log: $logs/images.log)"
log "imported the images of $IMAGES"

start_etcd() {
	start etcd "$BIN_K8S/etcd" --name "$NODE_NAME" --data-dir "$state/etcd" \
		--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster "$NODE_NAME=http://127.0.0.1:2380" --listen-metrics-urls http://127.0.0.1:2381 \
		--log-level warn
}

start_kube_apiserver() {
	start kube-apiserver "$BIN_K8S/kube-apiserver" \
		--etcd-servers http://127.0.0.1:2379 \
		--advertise-address "$NODE_IP" --bind-address 0.0.0.0 --secure-port 6443 \
		--tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
		--client-ca-file "$pki/ca.crt" \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
		--service-cluster-ip-range "$SERVICE_CIDR" \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
		--allow-privileged=true \
		--kubelet-preferred-address-types InternalIP,Hostname \
		--kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
		--kubelet-client-key "$pki/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority "$pki/ca.crt" \
		--requestheader-client-ca-file "$pki/front-proxy-ca.crt" \
		--requestheader-allowed-names front-proxy-client \
		--requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
		--requestheader-extra-headers-prefix X-Remote-Extra- \
		--proxy-client-cert-file "$pki/front-proxy-client.crt" --proxy-client-key-file "$pki/front-proxy-client.key" \
		--enable-aggregator-routing=true \
		--audit-policy-file "$repo/internal/audit/policy.yaml" --audit-log-path "$logs/kube-apiserver-audit.log" \
		--audit-log-format json --audit-log-mode blocking --audit-log-maxsize 100000
}

# restart stops a component as an operator would (SIGTERM, then SIGKILL
# after $2 seconds) and starts it again with the same flags: the faults of
# make e2e (hack/cluster/fault.sh) send SIGUSR1 for the API server and
# SIGUSR2 for etcd. The node's state (etcd's data, the audit log) stays.
restart() { # name seconds
	log "restarting $1"
	stop "$1" "$2"
	"start_${1//-/_}"
}
trap 'restart kube-apiserver 20' USR1
trap 'restart etcd 10' USR2

start_etcd
start_kube_apiserver

for ((i = 0; i < 240; i++)); do
	"${k[@]}" get --raw /readyz >/dev/null 2>&1 && break
	kill -0 "${pid[kube-apiserver]}" 2>/dev/null || fail "kube-apiserver exited (log: $logs/kube-apiserver.log)"
	sleep 0.5
done
"${k[@]}" get --raw /readyz >/dev/null 2>&1 || fail "kube-apiserver not ready within 120s (log: $logs/kube-apiserver.log)"
log "kube-apiserver ready"

start kube-controller-manager "$BIN_NODE/kube-controller-manager" \
	--kubeconfig "$etc/controller-manager.kubeconfig" \
	--authentication-kubeconfig "$etc/controller-manager.kubeconfig" \
	--authorization-kubeconfig "$etc/controller-manager.kubeconfig" \
	--bind-address 127.0.0.1 --leader-elect=false \
	--cluster-name kshard-node --use-service-account-credentials \
	--root-ca-file "$pki/ca.crt" --service-account-private-key-file "$pki/sa.key" \
	--cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
	--requestheader-client-ca-file "$pki/front-proxy-ca.crt"

start kube-scheduler "$BIN_NODE/kube-scheduler" \
	--kubeconfig "$etc/scheduler.kubeconfig" \
	--authentication-kubeconfig "$etc/scheduler.kubeconfig" \
	--authorization-kubeconfig "$etc/scheduler.kubeconfig" \
	--bind-address 127.0.0.1 --leader-elect=false

start kube-proxy "$BIN_NODE/kube-proxy" --config "$etc/kube-proxy.yaml"

start kubelet "$BIN_NODE/kubelet" --config "$etc/kubelet.yaml" \
	--kubeconfig "$etc/kubelet.kubeconfig" --root-dir "$state/kubelet" \
	--hostname-override "$NODE_NAME" --node-ip "$NODE_IP"

touch "$run/ready"
log "all components started"

# Wait for SIGTERM. A component that exits is logged; the others go on.
while ((${#pid[@]} > 0)); do
	wait -n "${pid[@]}" 2>/dev/null || true
	for name in "${order[@]}"; do
		p=${pid[$name]:-}
		if [[ -n $p ]] && ! kill -0 "$p" 2>/dev/null; then
			wait "$p" 2>/dev/null && rc=0 || rc=$?
			log "$name exited with status $rc (log: $logs/$name.log)"
			unset "pid[$name]"
		fi
	done
done
log "every component exited"
sleep infinity &
wait $!
