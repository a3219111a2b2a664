#!/usr/bin/env bash
# Packs the full rlfusion binary of a build made here (with CUDA) for a GPU machine that has the
# CUDA driver but none of our libraries and no package registry: the binary, every shared library
# it and Open MPI's components load (glibc and libstdc++ excepted: the GPU machine's own are
# newer), Open MPI's launcher, daemon, components and help files. Written to .gpu-app/ at the
# repository root (git-ignored, ~40 MiB): carry it there and run jobs/gpu/app-check.sh.
#
# Usage: jobs/gpu/bundle-app.sh [BUILD_DIR]   (default build; the build must have found nvcc)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
bundle="$root/.gpu-app"
binary="$build/src/rlfusion"
[ -x "$binary" ] || { echo "bundle-app: no $binary (build it first)" >&2; exit 1; }
"$binary" --version | grep -q "CUDA" || { echo "bundle-app: $binary was built without CUDA" >&2; exit 1; }

# Debian's Open MPI: components, help files and the MCA defaults at the paths the library was
# configured with (app-check.sh puts them back at the same paths on the GPU machine).
ompi_components=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
ompi_help=/usr/share/openmpi
ompi_etc=/etc/openmpi
pmix_components=/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
for path in "$ompi_components" "$ompi_help" "$ompi_etc" "$pmix_components" /usr/bin/orterun \
  /usr/bin/orted; do
  [ -e "$path" ] || { echo "bundle-app: $path missing (apt-get install openmpi-bin)" >&2; exit 1; }
done

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/openmpi/components" "$bundle/openmpi/help" \
  "$bundle/openmpi/etc" "$bundle/pmix/components"
cp "$binary" /usr/bin/orterun /usr/bin/orted "$bundle/bin/"
cp -r "$ompi_components/." "$bundle/openmpi/components/"
cp -r "$ompi_help/." "$bundle/openmpi/help/"
cp -r "$ompi_etc/." "$bundle/openmpi/etc/"
cp -r "$pmix_components/." "$bundle/pmix/components/"

# Every library the binaries and components need, but the C and C++ runtimes.
skip='/(ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libgcc_s|libstdc\+\+)\.so'
{
  for f in "$bundle"/bin/* "$bundle"/openmpi/components/*.so "$bundle"/pmix/components/*.so; do
    ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $3}'
  done
} | sort -u | grep -vE "$skip" | while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
echo "bundle-app: $(ls "$bundle/lib" | wc -l) libraries, $(du -sh "$bundle" | cut -f1) in $bundle"
