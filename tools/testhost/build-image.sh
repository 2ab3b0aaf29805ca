#!/usr/bin/env bash
# Build (or reuse) the base image of simulated GPU test hosts: Debian 12 with systemd as PID 1.
# No registry is reachable, so the root filesystem comes from debootstrap and is imported.
# The image tag is a hash of this script: an unchanged script never rebuilds. A saved tarball in
# .cache/images/ lets a wiped podman store reload the image in seconds instead of rebuilding it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# python-is-python3: the GPU simulator (tests/gpusim) starts with "#!/usr/bin/env python"
# haproxy and nftables: the front door and its loopback guard (roles/vllm_frontdoor); prometheus-node-exporter: node_exporter (roles/vllm_service,
# plan input vllm_service_node_exporter_port); installed here so the containers need no package mirror
packages=systemd,systemd-sysv,dbus,iproute2,procps,python3,python3-venv,python3-apt,python-is-python3,numactl,ca-certificates,sudo,libnuma1,curl,haproxy,nftables,prometheus-node-exporter
tag=$( (cat "$0"; echo "$packages") | sha256sum | cut -c1-12)
image=localhost/inferops-testhost:$tag
cache=$root/.cache/images
tarball=$cache/inferops-testhost-$tag.tar

if podman image exists "$image"; then
  echo "test host image $image: present"
elif [ -f "$tarball" ]; then
  echo "test host image $image: loading $tarball"
  podman load -q -i "$tarball" >/dev/null
else
  echo "test host image $image: building with debootstrap from $mirror"
  mkdir -p "$cache/debs"
  rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase --include="$packages" --cache-dir="$cache/debs" \
    bookworm "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 \
    || { tail -20 "$cache/debootstrap.log"; exit 1; }
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
  : >"$rootfs/etc/machine-id"
  # no getty on a container console; keep the journal small
  rm -f "$rootfs"/etc/systemd/system/getty.target.wants/* 2>/dev/null || true
  # node_exporter starts where the service role enables it (its plan has one), not on every test host
  rm -f "$rootfs"/etc/systemd/system/multi-user.target.wants/prometheus-node-exporter.service
  printf '[Journal]\nStorage=volatile\nRuntimeMaxUse=32M\n' >"$rootfs/etc/systemd/journald.conf"
  tar -C "$rootfs" -c . | podman import -q \
    --change 'CMD ["/sbin/init"]' --change 'ENV container=podman' \
    --change 'STOPSIGNAL SIGRTMIN+3' - "$image" >/dev/null
  podman save -q -o "$tarball.tmp" "$image" && mv "$tarball.tmp" "$tarball"
  # an older build's tarball is dead weight once the script changed
  find "$cache" -maxdepth 1 -name 'inferops-testhost-*.tar' ! -name "${tarball##*/}" -delete
fi
podman tag "$image" localhost/inferops-testhost:latest
echo "$image"
