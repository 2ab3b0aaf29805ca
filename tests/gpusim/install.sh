#!/bin/sh
# Apache License 2.0 (see LICENSE)
# Install the GPU simulator into a (container image) root file system.
#
#   install.sh PROFILE [ROOT]
#
# PROFILE: a profile name from tests/gpusim/profiles/ (h200-1gpu, seed-8x-rtxpro6000,
#          hgx-8x-h200, demo-2numa) or a path to a profile JSON file.
# ROOT:    target root directory (default /, or $DESTDIR), e.g. a debootstrap tree.
#
# Installs /usr/bin/nvidia-smi, /usr/bin/gpusim-hold, /usr/bin/gpusim-host, /usr/bin/nv-fabricmanager,
# /usr/bin/gpusim-modprobe,
# /var/lib/gpusim/{kern.log,nvswitch/} (see gpusim-host), every shipped profile under
# /etc/gpusim/profiles/ and the chosen one as /etc/gpusim/profile.json, and creates
# /run/gpusim/stray.d (also declared in /usr/lib/tmpfiles.d/gpusim.conf, since /run is a
# tmpfs when systemd boots).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
profile=${1:?usage: install.sh PROFILE [ROOT]}
root=${2:-${DESTDIR:-/}}
case $profile in
  */*|*.json) src=$profile ;;
  *) src=$here/profiles/$profile.json ;;
esac
if [ ! -f "$src" ]; then
  echo "install.sh: no such profile: $profile (have: $(for f in "$here"/profiles/*.json; do basename "$f" .json; done | tr '\n' ' '))" >&2
  exit 2
fi
python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); assert p.get("gpus") or p.get("extends"), "no gpus"' "$src"
install -d "$root/usr/bin" "$root/etc/gpusim/profiles" "$root/run/gpusim/stray.d" \
  "$root/usr/lib/tmpfiles.d"
# The sources say "#!/usr/bin/env python" (what ansible-test sanity allows); Debian 12 has no
# "python", so the installed copies name /usr/bin/python3.
for tool in nvidia-smi gpusim-hold gpusim-host; do
  { echo '#!/usr/bin/python3'; tail -n +2 "$here/$tool"; } > "$root/usr/bin/$tool.tmp"
  chmod 0755 "$root/usr/bin/$tool.tmp"
  mv "$root/usr/bin/$tool.tmp" "$root/usr/bin/$tool"
done
for p in "$here"/profiles/*.json; do
  install -m 0644 "$p" "$root/etc/gpusim/profiles/$(basename "$p")"
done
install -m 0644 "$src" "$root/etc/gpusim/profile.json"
# nv-fabricmanager stand-in (a sh wrapper of gpusim-host), and the host files of the health
# preflight: /var/lib/gpusim/kern.log (the profile's kernel_log lines) and /var/lib/gpusim/nvswitch/.
install -m 0755 "$here/nv-fabricmanager" "$root/usr/bin/nv-fabricmanager"
# the NVIDIA modules of the simulated driver (maintenance: modprobe -r before an upgrade, then load; gpusim-host)
install -m 0755 "$here/gpusim-modprobe" "$root/usr/bin/gpusim-modprobe"
GPUSIM_PROFILE=$src python3 "$here/gpusim-host" files "$root/var/lib/gpusim"
printf 'd /run/gpusim/stray.d 0755 root root -\n' > "$root/usr/lib/tmpfiles.d/gpusim.conf"
echo "gpusim: installed into $root with profile $(basename "$src" .json)"
