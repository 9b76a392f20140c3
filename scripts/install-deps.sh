#!/usr/bin/env bash
# Installs what Rebound needs from Debian's packages, only what is missing.
# Rust itself must already be there (rustup's stable toolchain); crates come from crates.io.
set -euo pipefail
PKGS=(qemu-system-x86 qemu-utils busybox-static cpio kmod e2fsprogs makedumpfile crash
      xz-utils gcc make libc6-dev curl ca-certificates python3 graphviz iproute2
      gcc-12 libelf1    # gcc-12 + libelf1: the guest's eviction-notice module (kbuild's objtool)
      etcd-server etcd-client   # the cluster store across hosts, and etcdctl for its tests
      protobuf-compiler libprotobuf-dev)  # protoc and its well-known types (descriptor.proto):
                                          # the etcd client crate compiles etcd's protobufs
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
  for c in "$HOME/.cargo/bin/cargo"; do [ -x "$c" ] && exit 0; done
  echo "install-deps: no Rust toolchain found: install rustup's stable toolchain (cargo, rustc >= 1.88)" >&2
  exit 1
fi
