#!/usr/bin/env bash
# Stops what `make cluster` (up.sh) started and removes what it made: the
# processes (everything in the pids cgroup /$CGROUP: the components,
# containerd's shims, the containers), the cgroups, the network namespace and
# its veth, the host folders it created as mount points, and its state under
# bin/cluster (the logs stay, in bin/cluster/log). The mounts lived in the
# node's own mount namespace and went with its last process.
#
# Safe to run when nothing is up, and again after a failed run.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

say() { printf '%s\n' "$*"; }
die() { printf 'cluster-down: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "needs root, like make cluster"
start=$SECONDS

# The supervisor stops the components in order, the containers included.
if [[ -s $run/node.pid ]] && kill -0 "$(cat "$run/node.pid")" 2>/dev/null; then
	p=$(cat "$run/node.pid")
	say "stopping the node (node.sh pid $p)"
	kill -TERM "$p"
	for ((i = 0; i < 900; i++)); do
		kill -0 "$p" 2>/dev/null || break
		sleep 0.1
	done
	kill -0 "$p" 2>/dev/null && say "node.sh did not stop within 90s; killing what is left"
fi

# Whatever is still in the node's pids cgroup was started by it: end it.
pids_cg=
while read -r _ _ _ _ mountpoint _ rest; do
	fstype=${rest#*- }
	fstype=${fstype%% *}
	[[ $fstype == cgroup && ,${rest##* }, == *,pids,* ]] && pids_cg=$mountpoint
done </proc/self/mountinfo
left() { [[ -d $pids_cg/$CGROUP ]] && find "$pids_cg/$CGROUP" -name cgroup.procs -exec cat {} + 2>/dev/null; }
if [[ -n $pids_cg ]]; then
	for ((i = 0; i < 50; i++)); do
		procs=$(left || true)
		[[ -n $procs ]] || break
		((i == 0)) && say "killing $(wc -w <<<"$procs") leftover processes of the node"
		# shellcheck disable=SC2086
		kill -KILL $procs 2>/dev/null || true
		sleep 0.1
	done
	[[ -z $(left || true) ]] || die "processes remain in $pids_cg/$CGROUP: $(left | tr '\n' ' ')"
fi

# The cgroups, deepest first, in every hierarchy.
while read -r _ _ _ _ mountpoint _ rest; do
	fstype=${rest#*- }
	fstype=${fstype%% *}
	[[ $fstype == cgroup || $fstype == cgroup2 ]] || continue
	[[ -d $mountpoint/$CGROUP ]] || continue
	find "$mountpoint/$CGROUP" -depth -type d -exec rmdir {} + 2>/dev/null || true
	[[ -d $mountpoint/$CGROUP ]] && say "warning: cannot remove cgroup $mountpoint/$CGROUP"
done </proc/self/mountinfo

if netns_exists; then
	others=$(ip netns pids "$NETNS" 2>/dev/null || true)
	[[ -z $others ]] || say "warning: processes not started by make cluster are still in $NETNS: $(tr '\n' ' ' <<<"$others")"
	ip netns del "$NETNS"
	say "removed network namespace $NETNS"
fi
# The veth goes with the namespace; this covers a half-made one.
ip link del "$VETH_HOST" 2>/dev/null || true

if [[ -s $run/created-mounts ]] && mountpoint -q /run/netns && [[ -z $(ls -A /run/netns) ]]; then
	umount /run/netns && say "unmounted /run/netns (made by this cluster's ip netns add)"
fi
if [[ -s $run/created-paths ]]; then
	while read -r p; do rmdir "$p" 2>/dev/null || say "warning: $p was made by make cluster but is not empty; kept"; done <"$run/created-paths"
fi

# Nothing may still hold a mount of the cluster's folders before they go.
holders=$(grep -l -F "$dir/" /proc/[0-9]*/mountinfo 2>/dev/null || true)
[[ -z $holders ]] || die "mounts under $dir are still held by processes $(tr '\n' ' ' <<<"$holders"); state kept"
rm -rf "$pki" "$etc" "$run" "$state" "$KUBECONFIG_OUT"

# What is left, checked rather than assumed.
problems=()
netns_exists && problems+=("network namespace $NETNS")
ip link show "$VETH_HOST" >/dev/null 2>&1 && problems+=("link $VETH_HOST")
ls -d /sys/fs/cgroup/*/"$CGROUP" >/dev/null 2>&1 && problems+=("cgroups /sys/fs/cgroup/*/$CGROUP")
[[ -n $(left || true) ]] && problems+=("processes in the node's cgroup")
grep -q -F "$dir/" /proc/[0-9]*/mountinfo 2>/dev/null && problems+=("mounts of $dir")
if ((${#problems[@]} > 0)); then
	die "left behind: ${problems[*]}"
fi
say "cluster down in $((SECONDS - start))s: no process, mount, cgroup or network namespace of it is left (logs kept in $logs)"
