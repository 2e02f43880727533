#!/usr/bin/env bash
# Makes the base image the Dockerfile's BUN_IMAGE argument points at when no registry is reachable:
# Debian (debootstrap --variant=minbase) plus the Bun binary from the npm package @oven/bun-linux-<arch>,
# laid out as oven/bun lays it out (/usr/local/bin/bun, bunx, user bun 1000:1000). Prints the image name.
# The root filesystem is cached as a tarball keyed by suite and Bun version, so later runs only import it.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if bh inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then echo "$BASE_IMAGE"; exit 0; fi

arch="$(uname -m)"
case "$arch" in
  x86_64) npm_arch=x64 ;;
  aarch64) npm_arch=aarch64 ;;
  *) echo "image: no Bun build for $arch" >&2; exit 2 ;;
esac
# The npm package `bun` picks the baseline build on x64 CPUs without AVX2; so does this.
if [[ $npm_arch == x64 ]] && ! grep -qw avx2 /proc/cpuinfo; then npm_arch=x64-baseline; fi
tarball="$CACHE_DIR/rootfs-${DEBIAN_SUITE}-minbase-bun${BUN_VERSION}-${npm_arch}.tar"

if [[ ! -s $tarball ]]; then
  mkdir -p "$CACHE_DIR"
  work="$(mktemp -d "$CACHE_DIR/base.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  log "debootstrap --variant=minbase $DEBIAN_SUITE ($DEBIAN_MIRROR)" >&2
  debootstrap --variant=minbase "$DEBIAN_SUITE" "$work/rootfs" "$DEBIAN_MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  log "bun $BUN_VERSION from npm (@oven/bun-linux-$npm_arch)" >&2
  (cd "$work" && npm pack --silent "@oven/bun-linux-$npm_arch@$BUN_VERSION" >/dev/null && tar -xzf oven-bun-linux-*.tgz)
  install -m 0755 "$work/package/bin/bun" "$work/rootfs/usr/local/bin/bun"
  ln -s bun "$work/rootfs/usr/local/bin/bunx"
  chroot "$work/rootfs" /usr/local/bin/bun --version >/dev/null
  chroot "$work/rootfs" groupadd --gid 1000 bun
  chroot "$work/rootfs" useradd --uid 1000 --gid 1000 --create-home --shell /bin/sh bun
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/log/"*
  tar --numeric-owner -C "$work/rootfs" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
fi

ctr="$(bh from scratch)"
bh add --quiet "$ctr" "$tarball" / >/dev/null
bh config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd /usr/local/bin/bun \
  --label "org.opencontainers.image.description=Debian $DEBIAN_SUITE minbase + Bun $BUN_VERSION ($npm_arch)" "$ctr"
bh commit --quiet --rm "$ctr" "$BASE_IMAGE" >/dev/null
echo "$BASE_IMAGE"
