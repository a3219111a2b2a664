#!/usr/bin/env bash
# Gets what the kernels-only build needs besides CUDA, a C++ compiler, CMake and Python, for a GPU
# machine that has no package registry: Eigen's headers and GoogleTest's sources, from the Debian
# packages libeigen3-dev and googletest (apt-get download; the installed copies under
# /usr/include/eigen3 and /usr/src/googletest when there is no network). Extracted into
# .gpu-deps/ at the repository root (git-ignored, ~12 MiB): carry it to the GPU machine with the
# working tree, then run jobs/gpu/check.sh there.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
deps="$root/.gpu-deps"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

rm -rf "$deps"
mkdir -p "$deps"
if (cd "$work" && apt-get download libeigen3-dev googletest >/dev/null 2>&1); then
  for deb in "$work"/*.deb; do
    dpkg-deb -x "$deb" "$deps"
    echo "fetch-deps: $(basename "$deb")"
  done
else
  echo "fetch-deps: apt-get download failed; copying the installed packages' files"
  [ -d /usr/include/eigen3 ] && [ -d /usr/src/googletest ] || {
    echo "fetch-deps: need /usr/include/eigen3 and /usr/src/googletest (apt-get install" \
         "libeigen3-dev googletest)" >&2
    exit 1
  }
  mkdir -p "$deps/usr/include" "$deps/usr/src"
  cp -r /usr/include/eigen3 "$deps/usr/include/"
  cp -r /usr/src/googletest "$deps/usr/src/"
fi
# Only the headers and the sources are needed.
rm -rf "$deps/usr/share/doc" "$deps/usr/share/man"
test -f "$deps/usr/include/eigen3/Eigen/Core"
test -f "$deps/usr/src/googletest/CMakeLists.txt"
echo "fetch-deps: $(du -sh "$deps" | cut -f1) in $deps"
