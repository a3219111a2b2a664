#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages rlfusion needs, only those missing. On a cluster without
# root, load modules or use Spack instead (see docs/INSTALL.md); RLFUSION_NO_DEPS=1 skips this.
# Arguments name extra packages a make target needs besides the build's own (plots, fuzzing).
set -euo pipefail

packages=(g++ make cmake ninja-build pkg-config libopenmpi-dev openmpi-bin libeigen3-dev
          libtbb-dev libboost-program-options-dev libhdf5-openmpi-dev hdf5-tools libgtest-dev
          googletest "$@")

if [ "${RLFUSION_NO_DEPS:-0}" = "1" ]; then
  exit 0
fi
if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  cat <<'MSG'
rlfusion: this is not a Debian/Ubuntu machine, so dependencies are not installed automatically.
Provide: a C++20 compiler, CMake >= 3.22, Ninja, an MPI library, parallel HDF5, Eigen 3.3+,
oneTBB, Boost.Program_options, GoogleTest; e.g. `module load cmake openmpi hdf5/parallel eigen tbb
boost` or `spack install hdf5+mpi eigen intel-oneapi-tbb boost+program_options googletest`
(docs/INSTALL.md). Then run make with RLFUSION_NO_DEPS=1.
MSG
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "rlfusion: installing ${missing[*]}"
sudo_cmd=""
if [ "$(id -u)" != "0" ]; then
  command -v sudo >/dev/null 2>&1 || { echo "rlfusion: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo_cmd="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo_cmd apt-get update -qq
$sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "rlfusion: dependencies installed"
