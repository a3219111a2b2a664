#!/usr/bin/env bash
# Weak scaling under Slurm: jobs/slurm/scaling_weak.sh "1 2 4 8" [train options] (see scaling.sh).
exec "$(dirname "$0")/scaling.sh" weak "$@"
