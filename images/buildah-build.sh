#!/usr/bin/env bash
# Build a voxpipe image on a machine without a container engine: buildah with chroot isolation.
#
#   images/buildah-build.sh [DEVICE] [TAG]      # DEVICE cpu (default); TAG voxpipe:<version>-<device>
#
# Base images cannot be pulled here, so the cpu image's BASE is a Debian bookworm root filesystem made by
# debootstrap (Python 3.11) and imported as localhost/voxpipe-base:bookworm, once. The build reaches the
# package registries through the host's CA bundle (mounted read-only), and takes torch from the local
# wheel folder ($PIP_FIND_LINKS) when it holds the pinned wheel. The published images/Dockerfile is
# unchanged by all this: only build arguments and mounts differ from a plain `docker build`.
set -euo pipefail
cd "$(dirname "$0")/.."
device=${1:-cpu}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
tag=${2:-voxpipe:$version-$device}
base=localhost/voxpipe-base:bookworm
certs=/etc/ssl/certs

if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
  rootfs=$(mktemp -d /var/tmp/voxpipe-rootfs.XXXXXX)
  echo "debootstrap: Debian bookworm (minbase, Python 3.11) -> $base"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
    bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
  ctr=$(buildah from scratch)
  cp -a "$rootfs/." "$(buildah mount "$ctr")/"
  buildah umount "$ctr" >/dev/null
  buildah config --env LANG=C.UTF-8 --cmd /bin/bash "$ctr"
  buildah commit --quiet --rm "$ctr" "$base" >/dev/null
  rm -rf "$rootfs"
fi

args=(--build-arg DEVICE="$device" --build-arg BASE="$base"
      --build-arg VOXPIPE_GIT_COMMIT="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
      --build-arg PIP_CERT="$certs/ca-certificates.crt" --volume "$certs:$certs:ro")
wheels=${PIP_FIND_LINKS:-/opt/wheels}
if compgen -G "$wheels/torch-$(sed -n 's/^torch==//p' images/constraints.txt)+cpu-*.whl" >/dev/null; then
  args+=(--build-arg TORCH_SOURCE="--no-index --find-links /wheels" --volume "$wheels:/wheels:ro")
fi
echo "buildah bud: $tag"
buildah bud --isolation chroot --layers "${args[@]}" -f images/Dockerfile -t "$tag" .
