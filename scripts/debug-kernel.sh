#!/usr/bin/env bash
# Puts the debug vmlinux of the default guest image's kernel where the crash
# backtrace test finds it, and prints its path. Idempotent.
#
# The kernel release and package version come from the image's manifest. If
# Debian's linux-image-<release>-dbg package is installed, its
# /usr/lib/debug/boot/vmlinux-<release> is used as is. Otherwise the package
# (~860 MB) is downloaded with `apt-get download` and only the vmlinux
# (~500 MB) is extracted, to $REBOUND_HOME/debug/vmlinux-<release>; the .deb
# is removed afterwards (installing the whole package takes 5.6 GB).
set -euo pipefail
HOME_DIR="${REBOUND_HOME:-$HOME/.local/share/rebound}"
MANIFEST="$HOME_DIR/images/default/manifest.json"
[ -f "$MANIFEST" ] || { echo "debug-kernel: $MANIFEST is missing: run \`make image\`" >&2; exit 1; }

read -r RELEASE VERSION < <(python3 - "$MANIFEST" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
rel = m["kernel_release"]
ver = next(p["version"] for p in m["packages"] if p["name"] == "linux-image-" + rel)
print(rel, ver)
EOF
)
PKG="linux-image-$RELEASE-dbg"
INSIDE="usr/lib/debug/boot/vmlinux-$RELEASE"

if [ -f "/$INSIDE" ]; then
  echo "/$INSIDE"
  exit 0
fi
OUT="$HOME_DIR/debug/vmlinux-$RELEASE"
if [ -f "$OUT" ]; then
  echo "$OUT"
  exit 0
fi

SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
if ! apt-cache show "$PKG=$VERSION" >/dev/null 2>&1; then
  echo "debug-kernel: package lists lack $PKG $VERSION: running apt-get update" >&2
  $SUDO apt-get update -qq
fi
apt-cache show "$PKG=$VERSION" >/dev/null 2>&1 || {
  echo "debug-kernel: Debian's archive no longer has $PKG $VERSION (the image's kernel); rebuild the image (\`rebound image build default\`) or get that version from snapshot.debian.org" >&2
  exit 1
}

mkdir -p -m 0700 "$HOME_DIR/debug"
WORK="$(mktemp -d "$HOME_DIR/debug/fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
echo "debug-kernel: downloading $PKG $VERSION (~860 MB)" >&2
# As root, apt would drop to its sandbox user, which cannot enter this 0700 directory.
SANDBOX=(); [ "$(id -u)" = 0 ] && SANDBOX=(-o APT::Sandbox::User=root)
(cd "$WORK" && apt-get download -qq "${SANDBOX[@]}" "$PKG=$VERSION")
DEB=("$WORK"/*.deb)
echo "debug-kernel: extracting $INSIDE" >&2
dpkg-deb --fsys-tarfile "${DEB[0]}" | tar -x -C "$WORK" "./$INSIDE"
mv "$WORK/$INSIDE" "$OUT"
echo "$OUT"
