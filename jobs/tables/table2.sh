#!/usr/bin/env bash
# The public report's Table 2 as the planner PREDICTS it (docs/DEPLOYMIND.md): no run, one rank,
# a few seconds. Extra arguments go to `rlfusion plan` (--cluster, --job, --model, --json).
set -euo pipefail
RLFUSION=${RLFUSION:-build/src/rlfusion}
exec "$RLFUSION" plan --table 2 "$@"
