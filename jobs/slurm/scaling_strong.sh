#!/usr/bin/env bash
# Strong scaling under Slurm: jobs/slurm/scaling_strong.sh "1 2 4 8" [train options] (see scaling.sh).
exec "$(dirname "$0")/scaling.sh" strong "$@"
