#!/usr/bin/env bash
# Says whether this machine can run the node of `make cluster`: root, the
# cgroup v1 controllers the kubelet uses with containerd 1.6, the overlay
# file system, br_netfilter, and that network namespaces and cgroups can be
# made here (a container without those privileges cannot). Exits 1 and lists
# what is missing; changes nothing. up.sh runs it first; .ci/run runs it to
# decide whether to run `make e2e`.
set -euo pipefail

missing=()
if [[ $(id -u) != 0 ]]; then
	missing+=("root: the node needs a network namespace, mounts and cgroups")
fi
declare -A cgroup_v1=()
while read -r _ _ _ _ mountpoint _ rest; do
	fstype=${rest#*- }
	fstype=${fstype%% *}
	[[ $fstype == cgroup ]] || continue
	opts=${rest##* }
	for o in ${opts//,/ }; do cgroup_v1[$o]=$mountpoint; done
done </proc/self/mountinfo
for c in cpu cpuacct cpuset memory pids devices freezer; do
	[[ -n ${cgroup_v1[$c]:-} ]] || missing+=("cgroup v1 controller '$c' (kubelet with containerd 1.6 runs pods with the cgroupfs driver on cgroup v1 hierarchies; a pure cgroup v2 host needs containerd 2.x and another configuration)")
done
grep -qw overlay /proc/filesystems || missing+=("overlay file system (containerd's overlayfs snapshotter)")
[[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]] || missing+=("br_netfilter (/proc/sys/net/bridge): Services need bridged pod traffic to pass iptables")
[[ -e /proc/self/ns/net ]] || missing+=("network namespaces")
if [[ $(id -u) == 0 ]]; then
	if ! unshare --net true 2>/dev/null; then
		missing+=("the right to create network namespaces (unshare --net failed)")
	fi
	if [[ -n ${cgroup_v1[pids]:-} ]]; then
		probe=${cgroup_v1[pids]}/kshard-preflight-$$
		if mkdir "$probe" 2>/dev/null; then
			rmdir "$probe"
		else
			missing+=("the right to create cgroups (mkdir in ${cgroup_v1[pids]} failed)")
		fi
	fi
fi
if ((${#missing[@]} > 0)); then
	printf 'cluster: this machine lacks what a node needs:\n' >&2
	printf '  - %s\n' "${missing[@]}" >&2
	exit 1
fi

