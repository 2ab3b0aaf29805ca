#!/usr/bin/env bash
# usage: check-artifact.sh INSTALLED_PATH INVENTORY
# Checks the collection as installed from the built tarball (ansible-galaxy collection install -p
# INSTALLED_PATH), from a directory outside the checkout, with only that path to find collections:
# every plugin and role has documentation ansible-doc renders, every playbook passes --syntax-check
# against INVENTORY, and every file a role reads outside itself (role_path ~ '/../..') was shipped.
set -euo pipefail
installed=$(cd "$1" && pwd)
inventory=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
coll=$installed/ansible_collections/inferops/vllm
export ANSIBLE_COLLECTIONS_PATH=$installed ANSIBLE_COLLECTIONS_SCAN_SYS_PATH=false ANSIBLE_NOCOLOR=1
work=$(mktemp -d) && trap 'rm -rf "$work"' EXIT
cd "$work"

found=$(ansible-galaxy collection list inferops.vllm --format json)
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("installed:", *[f"{p}: {v}" for p, c in d.items() for v in c.values()])' "$found"
case $found in *"$installed"*) ;; *) echo "inferops.vllm not found under $installed"; exit 1;; esac

n=0
for type in module filter test lookup role; do
  names=$(ansible-doc -t "$type" -l inferops.vllm --json | python3 -c 'import json,sys; print(" ".join(sorted(json.load(sys.stdin))))')
  [ -n "$names" ] || continue
  # shellcheck disable=SC2086  # one call per type renders all of them
  ansible-doc -t "$type" $names >"$work/doc.txt" 2>"$work/err" || { echo "ansible-doc -t $type failed:"; cat "$work/err"; exit 1; }
  # any warning fails, except ansible-core's note about its own internal collection (ansible-doc -t role)
  if grep -v "/ansible/_internal/ansible_collections/" "$work/err" | grep -q .; then
    echo "ansible-doc -t $type warned:"; cat "$work/err"; exit 1
  fi
  if [ "$type" != role ]; then
    # shellcheck disable=SC2086
    ansible-doc --json -t "$type" $names | python3 -c 'import json,sys
bad = [n for n, d in json.load(sys.stdin).items() if not (d.get("examples") or "").strip()]
sys.exit("no EXAMPLES: " + " ".join(bad) if bad else 0)'
  fi
  n=$((n + $(wc -w <<<"$names")))
done
echo "ansible-doc: $n plugins and roles documented (plugins with examples)"

for pb in "$coll"/playbooks/*.yml; do
  name=inferops.vllm.$(basename "$pb" .yml)
  ansible-playbook --syntax-check -i "$inventory" "$name" >/dev/null 2>"$work/err" || { cat "$work/err"; exit 1; }
  echo "syntax ok: $name"
done

missing=0
while IFS=: read -r file ref; do
  role_dir=$(echo "$file" | sed -E 's|(roles/[^/]+)/.*|\1|')
  target=$(realpath -m "$role_dir/$ref")
  if [ -e "$target" ]; then echo "shipped: ${target#"$coll"/} (read by ${file#"$coll"/})"
  else echo "MISSING from the tarball: ${target#"$coll"/} (read by ${file#"$coll"/})"; missing=1; fi
done < <(grep -rnoE "role_path ~ '[^']+'" "$coll/roles" | sed -E "s|^([^:]+):[0-9]+:role_path ~ '([^']+)'|\1:\2|")
exit $missing
