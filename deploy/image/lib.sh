# Shared by the image scripts (sourced, not run): versions, the cache directory, and buildah with its
# own storage (vfs driver, chroot isolation: no daemon, no overlay mounts, works inside a VM or a
# container). A storage of its own leaves the machine's default containers storage (and whatever
# driver it was made with) alone: build.sh puts it on a tmpfs when memory allows (vfs copies every
# layer whole, and on a busy disk deleting those copies costs minutes), else under the cache directory.
# The Bun the root package.json pins ("packageManager": "bun@X.Y.Z").
BUN_VERSION="${BUN_VERSION:-$(sed -n 's/.*"packageManager": *"bun@\([0-9][0-9.]*\)".*/\1/p' "$(dirname "${BASH_SOURCE[0]}")/../../package.json")}"
DEBIAN_SUITE="${DEBIAN_SUITE:-bookworm}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
IMAGE="${IMAGE:-kv-epp:dev}"
BASE_IMAGE="localhost/kv-epp-base:${DEBIAN_SUITE}-bun${BUN_VERSION}"
CACHE_DIR="${KV_EPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kv-epp}/image"
STORE="${KV_EPP_IMAGE_STORE:-$CACHE_DIR/storage}"
RUNROOT="${KV_EPP_IMAGE_RUNROOT:-${XDG_RUNTIME_DIR:-/run}/kv-epp-image}"
export BUILDAH_ISOLATION=chroot

bh() { buildah --root "$STORE" --runroot "$RUNROOT" --storage-driver vfs "$@"; }
log() { echo "image: $*"; }
