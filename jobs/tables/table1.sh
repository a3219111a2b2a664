#!/usr/bin/env bash
# The public report's Table 1 (one supernode: disaggregated synchronous, RL Fusion, RL Fusion +
# StaleSync), twice:
#   MEASURED on the ranks this job has (a Slurm or PBS allocation, else RANKS ranks of this
#     machine, default its cores): `rlfusion bench modes --staleness 1`, the same RL job in each
#     mode, in one run, with its ratios;
#   PREDICTED at the published scale (CloudMatrix 384, Pangu-718B-shaped): `rlfusion plan
#     --table 1` (docs/DEPLOYMIND.md), beside the published figures.
# Options before `--` go to bench modes (default: the tiny model, 30 steps), after it to plan.
#   jobs/tables/table1.sh [bench modes options] [-- plan options]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=jobs/tables/launch.sh
. "$here/launch.sh"
tables_binary table1
bench=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do bench+=("$1"); shift; done
[ $# -gt 0 ] && shift
[ ${#bench[@]} -gt 0 ] || bench=(--model tiny --steps 30)
ranks=$(tables_ranks)
[ "$ranks" -ge 2 ] || { echo "table1: needs 2 ranks or more (an actor and a learner), got $ranks" >&2; exit 2; }
echo "# Table 1, MEASURED on $ranks ranks ($(hostname), load average $(cut -d' ' -f1 /proc/loadavg))"
# shellcheck disable=SC2046
$(tables_launcher "$ranks") "$RLFUSION" bench modes --staleness 1 "${bench[@]}"
echo "#"
echo "# Table 1, PREDICTED at the published scale"
"$RLFUSION" plan --table 1 "$@"
