#!/usr/bin/env bash
# Runs one command from an image's root filesystem the way the manifests' securityContext asks a
# container runtime to, with util-linux only (no daemon, no OCI runtime): its own mount namespace, the
# root filesystem bind-mounted read-only, a tmpfs for each emptyDir, /proc and /dev, files mounted
# read-only (as a ConfigMap would be), no new privileges, then chroot, chdir and the user's uid/gid
# (no capabilities left). The network is the host's: the processes bind loopback addresses.
#
#   container.sh ROOTFS [--user UID:GID] [--read-only] [--tmpfs DIR]... [--file SRC:DST]...
#                [--workdir DIR] [--env K=V]... -- COMMAND [ARG]...
#
# Only the given --env reach the process (no host environment). Needs root.
set -euo pipefail

rootfs="$1"; shift
user="0:0"; readonly_root=0; workdir="/"; tmpfs=(); files=(); envs=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --user) user="$2"; shift 2 ;;
    --read-only) readonly_root=1; shift ;;
    --tmpfs) tmpfs+=("$2"); shift 2 ;;
    --file) files+=("$2"); shift 2 ;;
    --workdir) workdir="$2"; shift 2 ;;
    --env) envs+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "container.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $# -gt 0 ]] || { echo "container.sh: no command" >&2; exit 2; }
[[ -d $rootfs/proc && -d $rootfs/dev ]] || { echo "container.sh: $rootfs is not a root filesystem" >&2; exit 2; }

setup() {
  # The root filesystem bound onto itself: inside this private namespace it can be remounted
  # read-only and mounted over without the host seeing any of it.
  mount --bind "$rootfs" "$rootfs"
  if [[ $readonly_root == 1 ]]; then mount -o remount,bind,ro "$rootfs"; fi
  mount -t proc -o nosuid,nodev,noexec proc "$rootfs/proc"
  mount --rbind /dev "$rootfs/dev"
  local t f src dst
  for t in "${tmpfs[@]}"; do mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs "$rootfs$t"; done
  for f in "${files[@]}"; do
    src="${f%%:*}"; dst="$rootfs${f#*:}"
    # The mount point is made where the filesystem is writable (an emptyDir), as a runtime would.
    [[ -e $dst ]] || { mkdir -p "$(dirname "$dst")" && touch "$dst"; }
    mount --bind "$src" "$dst"
    mount -o remount,bind,ro "$dst"
  done
}

uid="${user%%:*}"; gid="${user#*:}"
export -f setup
export rootfs readonly_root
# The arrays cross into the namespace's shell as NUL-free, newline-separated strings.
TMPFS_LIST="$(printf '%s\n' "${tmpfs[@]+"${tmpfs[@]}"}")" FILES_LIST="$(printf '%s\n' "${files[@]+"${files[@]}"}")" \
exec unshare --mount --propagation private -- bash -c '
  set -euo pipefail
  mapfile -t tmpfs < <(printf "%s" "$TMPFS_LIST" | sed "/^$/d")
  mapfile -t files < <(printf "%s" "$FILES_LIST" | sed "/^$/d")
  setup
  uid="$1" gid="$2" workdir="$3" n="$4"; shift 4
  envs=("${@:1:$n}"); shift "$n"
  # unshare (without namespaces) does chroot, chdir, setgroups/setgid/setuid, then execs the command
  # (looked up on the image PATH given in --env): the uid change drops every capability.
  exec env -i "${envs[@]}" setpriv --no-new-privs unshare --root="$rootfs" --wd="$workdir" --setgid="$gid" --setuid="$uid" -- "$@"
' container "$uid" "$gid" "$workdir" "${#envs[@]}" "${envs[@]+"${envs[@]}"}" "$@"
