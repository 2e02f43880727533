#!/usr/bin/env bash
# CI's image step: builds deploy/Dockerfile with buildah (chroot isolation, vfs storage, no daemon) on
# a base made locally (base.sh: no registry needed), checks that the image carries no build secret,
# then runs it as deploy/base does (smoke.ts) and prints the image size and the build time.
# Without buildah or debootstrap (and no root to install them) it says so and exits 0.
#
# Environment: IMAGE (default kv-epp:dev), BUN_IMAGE (a base to use instead of base.sh's),
# KV_EPP_CACHE (cache directory, default ~/.cache/kv-epp), NODE_EXTRA_CA_CERTS (extra CA bundle for
# `bun install` in the build, e.g. a TLS-intercepting proxy's: passed as a build secret, never baked in),
# IMAGE_ARCHIVE (also write the image there as a docker-archive, for `kind load image-archive`),
# KV_EPP_IMAGE_STORE (buildah storage directory; default: a tmpfs private to this run when 4 GiB of
# memory are available, so nothing outlives it, else $KV_EPP_CACHE/image/storage).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
. "$HERE/lib.sh"

skip() { echo "image: skipped: $1"; exit 0; }
missing=()
command -v buildah >/dev/null || missing+=(buildah)
[[ -n ${BUN_IMAGE:-} ]] || command -v debootstrap >/dev/null || missing+=(debootstrap)
if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    log "installing ${missing[*]} with apt-get"
    (apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null) \
      || skip "could not install ${missing[*]} with apt-get"
  else
    skip "${missing[*]} not installed (Debian: apt-get install buildah debootstrap; installed by .ci/run as root)"
  fi
fi
[[ $(id -u) == 0 ]] || skip "needs root (buildah's chroot isolation and the mount namespaces of container.sh)"

# The storage on a tmpfs mounted in a mount namespace of this run's own: freed when the run ends,
# however it ends. The base's root filesystem stays cached on disk (base.sh), so only its import repeats.
avail_kib="$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)"
if [[ -z ${KV_EPP_IMAGE_STORE:-} && ${avail_kib:-0} -ge $((4 * 1024 * 1024)) ]]; then
  tmpfs_dir="$RUNROOT/tmpfs"
  mkdir -p "$tmpfs_dir"
  export KV_EPP_IMAGE_STORE="$tmpfs_dir/storage" KV_EPP_IMAGE_RUNROOT="$tmpfs_dir/run"
  exec unshare --mount --propagation private -- bash -c \
    'mount -t tmpfs -o size=6g,mode=0700 kv-epp-image "$1" && shift && exec "$@"' - "$tmpfs_dir" "${BASH_SOURCE[0]}" "$@"
fi
log "buildah storage: $STORE"

t_start=$SECONDS
base="${BUN_IMAGE:-$("$HERE/base.sh")}"
t_base=$((SECONDS - t_start))

# The extra CA bundle reaches `bun install` as the build secret `extra_ca` (empty when there is none).
secret_dir="$(mktemp -d)"
ctr=""
cleanup() {
  [[ -z $ctr ]] || { bh umount "$ctr" >/dev/null 2>&1 || true; bh rm "$ctr" >/dev/null 2>&1 || true; }
  rm -rf "$secret_dir"
}
trap cleanup EXIT
ca="$secret_dir/extra_ca"
if [[ -n ${NODE_EXTRA_CA_CERTS:-} && -r $NODE_EXTRA_CA_CERTS ]]; then cp "$NODE_EXTRA_CA_CERTS" "$ca"; else : >"$ca"; fi

log "building $IMAGE on $base"
t_build0=$SECONDS
if ! bh build --isolation chroot --layers=false \
  -f "$ROOT/deploy/Dockerfile" --ignorefile "$ROOT/deploy/Dockerfile.dockerignore" \
  --build-arg "BUN_IMAGE=$base" --secret "id=extra_ca,src=$ca" -t "$IMAGE" "$ROOT" >"$secret_dir/build.log" 2>&1; then
  grep -v -E '^(Copying|Writing|Storing|Getting)' "$secret_dir/build.log" | tail -40 >&2
  echo "image: FAILED: buildah build" >&2
  exit 1
fi
t_build=$((SECONDS - t_build0))

size="$(bh images --format '{{.Size}}' "$IMAGE" | head -1)"
base_size="$(bh images --format '{{.Size}}' "$base" | head -1)"

t0=$SECONDS
ctr="$(bh from --pull-never "$IMAGE")"
mnt="$(bh mount "$ctr")"

# No trace of the build secret: not at its mount point, and no line of the bundle in any file the
# base image does not already have as it is.
[[ ! -s $mnt/run/secrets/extra_ca ]] || { echo "image: FAILED: the build secret is in the image" >&2; exit 1; }
if [[ -s $ca ]]; then
  patterns="$secret_dir/patterns"
  grep -E '^[A-Za-z0-9+/]{64}$' "$ca" | sort -u >"$patterns" || true
  if [[ -s $patterns ]]; then
    mapfile -d '' -t matched < <(grep -rlZ -F -f "$patterns" "$mnt" 2>/dev/null || true)
    leaked=()
    if [[ ${#matched[@]} -gt 0 ]]; then
      # Files that hold a certificate of the bundle may come with the base (a ca-certificates package):
      # those are fine as long as the base has them as they are.
      bctr="$(bh from --pull-never "$base")"
      bmnt="$(bh mount "$bctr")"
      for f in "${matched[@]}"; do rel="${f#"$mnt"}"; cmp -s "$f" "$bmnt$rel" || leaked+=("$rel"); done
      bh umount "$bctr" >/dev/null; bh rm "$bctr" >/dev/null
    fi
    [[ ${#leaked[@]} -eq 0 ]] || { echo "image: FAILED: the extra CA bundle is in the image: ${leaked[*]}" >&2; exit 1; }
    log "no certificate of the extra CA bundle in the image (checked $(wc -l <"$patterns") lines)"
  fi
fi

log "mounted and checked in $((SECONDS - t0))s"
bh inspect --type image "$IMAGE" >"$secret_dir/image.json"
t0=$SECONDS
bun "$HERE/smoke.ts" --rootfs "$mnt" --image-config "$secret_dir/image.json"

log "smoke in $((SECONDS - t0))s"; t0=$SECONDS
if [[ -n ${IMAGE_ARCHIVE:-} ]]; then
  rm -f "$IMAGE_ARCHIVE"
  bh push --quiet "$IMAGE" "docker-archive:$IMAGE_ARCHIVE:$IMAGE"
  log "wrote $IMAGE_ARCHIVE ($(du -h "$IMAGE_ARCHIVE" | cut -f1))"
fi
# The image this build replaced (untagged now): vfs keeps every layer as a full copy, so it goes.
bh rmi --prune >/dev/null 2>&1 || true
cleanup; ctr=""
log "cleaned up in $((SECONDS - t0))s"

log "$IMAGE: $size (base $base_size); build $((t_build / 60))m$((t_build % 60))s, base ${t_base}s, whole step $(((SECONDS - t_start) / 60))m$(((SECONDS - t_start) % 60))s"
