#!/usr/bin/env bash
# Starts a single-node Kubernetes (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kube-proxy, kubelet, containerd)
# inside network namespace $NETNS, which it creates. The host reaches the API
# server through one veth pair ($HOST_IP ↔ $NODE_IP); every listener is inside
# the namespace. The kubeconfig for the user is $KUBECONFIG_OUT.
#
# It needs root, cgroup v1 or hybrid hierarchies, network namespaces, veth,
# bridge and br_netfilter, and installs containerd, runc, the CNI plugins,
# conntrack and iptables with apt when they are missing. `make cluster-down`
# (down.sh) undoes all of it.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

say() { printf '%s\n' "$*"; }
die() { printf 'cluster: %s\n' "$*" >&2; exit 1; }

start=$SECONDS

# ---------------------------------------------------------------- preflight

[[ $(id -u) == 0 ]] || die "needs root: it creates a network namespace, mounts and cgroups (run it as root or with sudo)"

if [[ -s $run/node.pid ]] && kill -0 "$(cat "$run/node.pid")" 2>/dev/null; then
	say "the cluster is already up (node.sh pid $(cat "$run/node.pid")); KUBECONFIG=$KUBECONFIG_OUT"
	exit 0
fi
# A namespace with processes in it is a node that runs (another checkout's,
# since this one's node.pid is gone): leave it alone. An empty one is left
# over (a crashed run, a machine restored from a snapshot taken while a node
# ran): clear it and whatever else of the old node remains, and go on.
if netns_exists; then
	if others=$(ip netns pids "$NETNS" 2>/dev/null) && [[ -n $others ]]; then
		die "network namespace $NETNS is in use by processes $(tr '\n' ' ' <<<"$others")(a node of another checkout?): stop it with its \`make cluster-down\`"
	fi
	say "network namespace $NETNS is left over from an earlier node and nothing runs in it: clearing it first"
	"$repo/hack/cluster/down.sh"
fi

need_pkgs=()
command -v containerd >/dev/null || need_pkgs+=(containerd)
command -v runc >/dev/null || need_pkgs+=(runc)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || need_pkgs+=(containernetworking-plugins)
command -v conntrack >/dev/null || need_pkgs+=(conntrack)
command -v iptables >/dev/null || need_pkgs+=(iptables)
command -v openssl >/dev/null || need_pkgs+=(openssl)
command -v ip >/dev/null || need_pkgs+=(iproute2)
if ((${#need_pkgs[@]} > 0)); then
	say "installing ${need_pkgs[*]} with apt"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq || die "apt-get update failed: install ${need_pkgs[*]} by hand"
	apt-get install -y -qq "${need_pkgs[@]}" >/dev/null || die "apt-get install ${need_pkgs[*]} failed"
	# Debian's containerd package starts a containerd service where there is
	# an init system; this cluster runs its own, in its own folders.
fi

for f in "$BIN_K8S/etcd" "$BIN_K8S/kube-apiserver"; do
	[[ -x $f ]] || die "$f is missing: run \`make controlplane\`"
done
for f in kubelet kube-controller-manager kube-scheduler kube-proxy kubectl; do
	[[ -x $BIN_NODE/$f ]] || die "$BIN_NODE/$f is missing: run \`make node-binaries\`"
done
for f in kshard.tar etcd.tar spicedb.tar pause.tar; do
	[[ -s $IMAGES/$f ]] || die "$IMAGES/$f is missing: run \`make node-images\`"
done

"$(dirname "${BASH_SOURCE[0]}")/preflight.sh" || exit 1

mkdir -p "$pki" "$etc/cni" "$run" "$state" "$logs"
# The previous run's logs stay until the next one (down.sh keeps them).
rm -f "$logs"/*.log

# ------------------------------------------------------------- certificates

# One CA signs every serving and client certificate; the front-proxy CA signs
# the API server's client certificate for aggregated APIs (the custom metrics
# adapter). Kept across restarts; down.sh removes them with the rest.
cert() { # name subject sans(or "") usage signer
	local name=$1 subj=$2 sans=$3 usage=$4 signer=${5:-ca}
	[[ -s $pki/$name.crt ]] && return
	openssl genrsa -out "$pki/$name.key" 2048 2>/dev/null
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=$usage"
		[[ -z $sans ]] || echo "subjectAltName=$sans"
	} >"$pki/$name.ext"
	openssl req -new -key "$pki/$name.key" -subj "$subj" 2>/dev/null |
		openssl x509 -req -CA "$pki/$signer.crt" -CAkey "$pki/$signer.key" -CAcreateserial \
			-days 365 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
	rm "$pki/$name.ext"
}
ca() { # name cn
	[[ -s $pki/$1.crt ]] && return
	openssl genrsa -out "$pki/$1.key" 2048 2>/dev/null
	openssl req -x509 -new -key "$pki/$1.key" -subj "/CN=$2" -days 3650 \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
		-out "$pki/$1.crt" 2>/dev/null
}
ca ca kshard-node-ca
ca front-proxy-ca kshard-node-front-proxy-ca
cert apiserver "/CN=kube-apiserver" \
	"IP:$NODE_IP,IP:$KUBERNETES_SERVICE_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" serverAuth
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "" clientAuth
cert front-proxy-client "/CN=front-proxy-client" "" clientAuth front-proxy-ca
cert admin "/O=system:masters/CN=kubernetes-admin" "" clientAuth
cert controller-manager "/CN=system:kube-controller-manager" "" clientAuth
cert scheduler "/CN=system:kube-scheduler" "" clientAuth
cert kube-proxy "/CN=system:kube-proxy" "" clientAuth
cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "" clientAuth
cert kubelet-serving "/CN=$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME" serverAuth
if [[ ! -s $pki/sa.key ]]; then
	openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
	openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
fi

# ------------------------------------------------------------- kubeconfigs

kubeconfig() { # file user cert
	local file=$1 user=$2 cert=$3 k=("$BIN_NODE/kubectl" --kubeconfig "$1")
	rm -f "$file"
	"${k[@]}" config set-cluster kshard-node --server "https://$NODE_IP:6443" \
		--certificate-authority "$pki/ca.crt" --embed-certs >/dev/null
	"${k[@]}" config set-credentials "$user" --client-certificate "$pki/$cert.crt" \
		--client-key "$pki/$cert.key" --embed-certs >/dev/null
	"${k[@]}" config set-context kshard-node --cluster kshard-node --user "$user" >/dev/null
	"${k[@]}" config use-context kshard-node >/dev/null
	chmod 600 "$file"
}
kubeconfig "$KUBECONFIG_OUT" kubernetes-admin admin
kubeconfig "$etc/controller-manager.kubeconfig" system:kube-controller-manager controller-manager
kubeconfig "$etc/scheduler.kubeconfig" system:kube-scheduler scheduler
kubeconfig "$etc/kube-proxy.kubeconfig" system:kube-proxy kube-proxy
kubeconfig "$etc/kubelet.kubeconfig" "system:node:$NODE_NAME" kubelet

# ------------------------------------------------------------ configuration

cat >"$etc/containerd.toml" <<EOF
# containerd 1.6 for the kshard node: its own root, state and socket, so it
# never meets a containerd of the host's.
version = 2
root = "$state/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$run/containerd.sock"

[ttrpc]
  address = "$run/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "$state/containerd-opt"

[plugins."io.containerd.grpc.v1.cri"]
  # Never pulled: imported from $IMAGES/pause.tar.
  sandbox_image = "$PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  # Without CAP_SYS_RESOURCE (this machine's root lacks it) no process may
  # lower its oom_score_adj: the kubelet asks -998 for the pause container
  # and runc fails. This keeps every container's at containerd's own or above.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # cgroupfs: kubelet's cgroupDriver. Kubernetes 1.38 drops this
        # fallback for containerd 1.x; it will need containerd 2.x.
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$etc/cni"
EOF

cat >"$etc/cni/10-kshard.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "kshard-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$state/cni-ipam",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

cat >"$etc/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# The host has cgroup v1; kubelet 1.37 refuses it unless told, and containerd
# 1.6 cannot report its cgroup driver, so the kubelet falls back to this one.
failCgroupV1: false
cgroupDriver: cgroupfs
# Every pod cgroup lives under /$CGROUP, in every hierarchy.
cgroupRoot: /$CGROUP
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
containerRuntimeEndpoint: unix://$run/containerd.sock
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
tlsCertFile: $pki/kubelet-serving.crt
tlsPrivateKeyFile: $pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization:
  mode: Webhook
# No DNS add-on: pods get no name servers (nothing outside the namespace is
# reachable anyway) and find Services through their environment variables.
clusterDomain: cluster.local
resolvConf: ""
podLogsDir: /var/log/pods
staticPodPath: ""
rotateCertificates: false
serializeImagePulls: false
# Disk is shared with other work; evict only when it is really short.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 5%
  imagefs.available: 5%
imageGCHighThresholdPercent: 95
imageGCLowThresholdPercent: 90
EOF

cat >"$etc/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $etc/kube-proxy.kubeconfig
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Zero leaves the conntrack table size and timeouts as they are: they are
# the host's, not this namespace's.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF

# The cgroup hierarchies node.sh mounts again in the node's mount namespace
# (ip netns exec mounts a fresh /sys, which hides the host's /sys/fs/cgroup).
while read -r _ _ _ _ mountpoint _ rest; do
	fstype=${rest#*- }
	fstype=${fstype%% *}
	[[ $fstype == cgroup || $fstype == cgroup2 ]] || continue
	[[ $mountpoint == /sys/fs/cgroup/* ]] || continue
	printf '%s %s %s\n' "$fstype" "$mountpoint" "${rest##* }"
done </proc/self/mountinfo >"$run/cgroup-mounts"

# The host folders node.sh mounts over must exist; the ones made here are
# listed so that down.sh removes them again.
: >"$run/created-paths"
for p in "${HARDCODED_PATHS[@]}"; do
	if [[ ! -e $p ]]; then
		mkdir -p "$p"
		echo "$p" >>"$run/created-paths"
	fi
done

# ------------------------------------------------------------------ network

# The first `ip netns add` on a machine makes /run/netns a mount point of its
# own, and iproute2 leaves it; down.sh undoes it if this run made it.
rm -f "$run/created-mounts"
mountpoint -q /run/netns || echo /run/netns >"$run/created-mounts"
ip netns add "$NETNS"
# What can only be tried: a bridge (the CNI network) and iptables' nat table
# (kube-proxy), in the new namespace, which goes again if either fails.
kernel_fail() { ip netns del "$NETNS"; die "this kernel cannot $1 in a network namespace: $2"; }
ip -n "$NETNS" link add kshard-probe type bridge 2>/dev/null || kernel_fail "create a bridge" "the CNI bridge plugin needs it (CONFIG_BRIDGE)"
ip -n "$NETNS" link del kshard-probe
ip netns exec "$NETNS" iptables -t nat -S >/dev/null 2>&1 || kernel_fail "use iptables' nat table" "kube-proxy needs it (nf_tables or the legacy iptables modules, with NAT)"
ip link add "$VETH_HOST" type veth peer name "$VETH_NODE" netns "$NETNS" || kernel_fail "create a veth pair" "the host reaches the node through one (CONFIG_VETH)"
ip addr add "$HOST_IP/30" dev "$VETH_HOST"
ip link set "$VETH_HOST" up
ip -n "$NETNS" link set lo up
ip -n "$NETNS" addr add "$NODE_IP/30" dev "$VETH_NODE"
ip -n "$NETNS" link set "$VETH_NODE" up
# Only in the namespace: pod traffic to Services crosses the bridge to the
# namespace's own addresses. The namespace has no default route, so nothing
# leaves it except answers to the host on the veth.
ip netns exec "$NETNS" sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
# The host reaches pod and Service addresses through the node, as a machine
# on the node's network would (tests and the load tester on the host). These
# routes go with the veth.
ip route add "$POD_CIDR" via "$NODE_IP" dev "$VETH_HOST"
ip route add "$SERVICE_CIDR" via "$NODE_IP" dev "$VETH_HOST"

# -------------------------------------------------------------------- start

say "starting the node in network namespace $NETNS (logs in $logs)"
rm -f "$run/node.pid" "$run/ready" "$run/failed"
setsid ip netns exec "$NETNS" "$repo/hack/cluster/node.sh" </dev/null >"$logs/node.log" 2>&1 &

# node.sh writes run/ready once the API server answers and the images are
# imported, or run/failed with the reason.
for ((i = 0; i < 300; i++)); do
	[[ -e $run/ready ]] && break
	if [[ -e $run/failed ]]; then
		# node.sh stops what it had started; give it the time to.
		for ((j = 0; j < 60; j++)); do
			if ! [[ -s $run/node.pid ]] || ! kill -0 "$(cat "$run/node.pid")" 2>/dev/null; then break; fi
			sleep 1
		done
		cat "$run/failed" >&2
		die "the node did not start (logs in $logs); run \`make cluster-down\` to clean up"
	fi
	sleep 1
done
[[ -e $run/ready ]] || die "the node did not start within 300s (logs in $logs); run \`make cluster-down\` to clean up"

k=("$BIN_NODE/kubectl" --kubeconfig "$KUBECONFIG_OUT")
for ((i = 0; i < 120; i++)); do
	"${k[@]}" get node "$NODE_NAME" >/dev/null 2>&1 && break
	sleep 1
done
"${k[@]}" wait --for=condition=Ready "node/$NODE_NAME" --timeout=180s >/dev/null ||
	die "node $NODE_NAME did not become Ready (logs in $logs)"
# The default ServiceAccount appears shortly after the namespace controller
# starts; pods created before that are refused.
for ((i = 0; i < 60; i++)); do
	"${k[@]}" -n default get serviceaccount default >/dev/null 2>&1 && break
	sleep 1
done

"${k[@]}" get nodes -o wide
say "cluster up in $((SECONDS - start))s. Use it with:"
say "  export KUBECONFIG=$KUBECONFIG_OUT"
say "  $BIN_NODE/kubectl get pods -A"
