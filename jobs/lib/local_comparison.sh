# Set-up shared by the jobs/local comparison scripts that time train runs on one machine (sourced,
# not run): rlf_local_setup RANKS NAME BUILD_DIR checks the binary and that every rank can have a
# core of its own (exit 2 otherwise), and sets `rlfusion` (the binary) and `work` (a fresh
# directory for the runs).
# shellcheck shell=bash

rlf_local_setup() {
  local ranks=$1 name=$2 build=$3
  rlfusion="$build/src/rlfusion"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  [ -x "$rlfusion" ] || { echo "no $rlfusion: build first (make build)" >&2; exit 2; }
  if [ "$(nproc)" -lt "$ranks" ]; then
    echo "$ranks ranks need $ranks cores to bind to distinct cores; this machine has $(nproc)" >&2
    exit 2
  fi
  work=$(mktemp -d "${TMPDIR:-/tmp}/rlfusion-$name.XXXXXX")
}
