#!/usr/bin/env bash
# The planner's validation (issue 10): calibrates this machine (`bench calibrate`, 2 ranks, and 1
# rank for the one-rank cases; again
# through link emulation for each case that emulates links), runs
# every case of jobs/local/planner_validation_cases.csv with `rlfusion train`, collects the
# measured step time (the trace's RL steps after the first: the steady state), the link counters' bytes, the device-memory peaks and
# the token totals into $OUT/measured.csv, and prints `rlfusion plan --validate`'s table of
# predicted vs measured. Run from the repository root after `make build`; ~7 minutes on 2 idle
# cores with 5 repeats. Times are only meaningful with every rank on its own idle core.
#
# Repeats: this shared VM's speed moves between runs (the same case measured 25-31% apart in two
# idle runs, calibrated rates 1.6x apart), so the job runs REPEATS rounds, each a calibration (2
# ranks and 1) followed by one run of every case: a slow or fast stretch of the machine then
# touches the rates and the runs alike instead of only the calibration or only a few cases. Each
# round's runs are predicted on that round's calibration (the same stretch of the machine), and the
# round whose step-time error is the median of the case's rounds stands for the case
# (jobs/local/validation_rounds.py; its other columns, deterministic, are the same in every round).
# $OUT/cluster.ini and $OUT/cluster-1rank.ini are the rounds' calibrations merged, every number the
# median of its measurements: one file for the machine.
# CALIBRATE=each (the default since 2026-12-06) calibrates again right before every run of every
# case (on the case's rank count, 15 s), into $OUT/cluster-at-NAME.ini.R, and predicts the run on
# it: the machine drifts within a round too (`tiny`'s generation 3.9 -> 4.8 ms between the rounds
# of one validation, the calibrated decode rates 25% apart), and a round's cases ran up to two
# minutes after its calibration. About 25 minutes with 5 repeats. CALIBRATE=round: one
# calibration a round, as before (about 10 minutes).
#   RLFUSION=build/src/rlfusion  CASES=jobs/local/planner_validation_cases.csv  OUT=runs/validate_planner  REPEATS=5  CALIBRATE=each
# OVERSUBSCRIBE=1 runs cases with more ranks than cores (`mpiexec --oversubscribe` instead of
# `--bind-to core`): their step times are then not predictions to compare, but their bytes and
# memory are, which do not depend on the cores. Nothing is calibrated then (rates timed on shared
# cores mean nothing): every case is predicted on CLUSTER (default
# inputs/clusters/cloudmatrix-384.ini). jobs/local/planner_layout_cases.csv holds such layouts
# (PP x EP, several pipelines, EP over more ranks than its group, TP groups with DP, EP and PP,
# disaggregated with several learners, actors and TP groups; 3 to 8 ranks):
#   OVERSUBSCRIBE=1 REPEATS=1 CALIBRATE=round CASES=jobs/local/planner_layout_cases.csv OUT=runs/validate_layouts
set -euo pipefail
RLFUSION=${RLFUSION:-build/src/rlfusion}
CASES=${CASES:-jobs/local/planner_validation_cases.csv}
OUT=${OUT:-runs/validate_planner}
PYTHON=${PYTHON:-python3}
# 5 rounds: the EP cases' errors move 10-35 points between the rounds of one validation (2026-12-05:
# fused-ep2-tiny -0.1, -35.3, +16.5, -15.4, -17.3%), so the median of 3 still lands on an outlier
# now and then.
REPEATS=${REPEATS:-5}
CALIBRATE=${CALIBRATE:-each}
case "$CALIBRATE" in each|round) ;; *) echo "CALIBRATE must be each or round, got '$CALIBRATE'" >&2; exit 2 ;; esac
OVERSUBSCRIBE=${OVERSUBSCRIBE:-0}
CLUSTER=${CLUSTER:-inputs/clusters/cloudmatrix-384.ini}
case "$OVERSUBSCRIBE" in
  0) BIND=(--bind-to core) ;;
  1) BIND=(--oversubscribe) ;;
  *) echo "OVERSUBSCRIBE must be 0 or 1, got '$OVERSUBSCRIBE'" >&2; exit 2 ;;
esac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT"
[ "$REPEATS" -ge 1 ] 2>/dev/null || { echo "REPEATS must be an integer >= 1, got '$REPEATS'" >&2; exit 2; }

# calibrate_once RANKS FILE R: round R's calibration on RANKS ranks into FILE.R (with
# OVERSUBSCRIBE=1 a copy of CLUSTER).
calibrate_once() {
  local ranks=$1 file=$2 r=$3
  if [ "$OVERSUBSCRIBE" = 1 ]; then
    cp "$CLUSTER" "$file.$r"
    return
  fi
  mpiexec -n "$ranks" "${BIND[@]}" "$RLFUSION" bench calibrate --output "$file.$r" \
    < /dev/null > "$file.$r.calibrate" 2>&1 || { cat "$file.$r.calibrate"; exit 1; }
}

# merge_calibrations FILE: the REPEATS rounds' FILE.1 .. FILE.REPEATS merged into FILE, every
# number the median of its measurements (element by element for the rate grids).
merge_calibrations() {
  "$PYTHON" - "$1" "$REPEATS" <<'PY'
import statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
files = [open(f"{out}.{r}").read().splitlines() for r in range(1, repeats + 1)]
merged = []
for i, line in enumerate(files[0]):
    key, sep, value = line.partition(" = ")
    if not sep or line.startswith("#"):
        merged.append(line)
        continue
    try:
        columns = [[float(x) for x in f[i].partition(" = ")[2].split()] for f in files]
    except ValueError:
        merged.append(line)
        continue
    merged.append(key + " = " + " ".join(f"{statistics.median(c):.6g}" for c in zip(*columns)))
merged.insert(1, f"# The median of {repeats} calibrations ({out}.1 .. {out}.{repeats}), number by number.")
open(out, "w").write("\n".join(merged) + "\n")
PY
}

MEASURED="$OUT/measured.csv"
# The link bytes by traffic kind (mpi_comm/traffic_kind.h; a run's summary.json "traffic_bytes",
# intra- plus inter-node), one column each, which `plan --validate` checks kind by kind.
KINDS=(other weight_sync gradient_reduce rollout_queue expert_dispatch expert_migration
       pipeline_activations pipeline_generation layout_switch tensor_parallel final_gather)
KIND_COLUMNS=$(printf 'bytes_%s,' "${KINDS[@]}"); KIND_COLUMNS=${KIND_COLUMNS%,}
echo "case,cluster,task,model,mode,ranks,ranks_per_node,actors,expert_parallel,actor_expert_parallel,staleness,offload,inter_bandwidth,inter_latency,prompts,group_size,micro_batch,reference,queue_shards,steps,trained_tokens,response_tokens,step_s,intra_bytes,inter_bytes,generation_peak,training_peak,generate_s,train_s,router_max_over_mean,redundant_experts,rebalance,expert_moves_per_step,pipeline_parallel,actor_pipeline_parallel,active_experts,migrations,pipeline_decode_steps,tensor_parallel,actor_tensor_parallel,trace,pipeline_lanes,pool_generation_rows,$KIND_COLUMNS" > "$MEASURED"
mapfile -t CASE_LINES < <(grep -v '^#' "$CASES" | tail -n +2)

# cluster_of NAME RANKS BW LAT: the cluster file a case is predicted with. One-rank cases run
# alone on the machine, so their rates come from the one-rank calibration (no second rank
# sharing the memory bandwidth); a case that emulates links gets the two-rank rates with its
# emulated link (composed after the rounds).
# With CALIBRATE=each every case has its own calibrations, $OUT/cluster-at-NAME.ini.R (an
# emulated-link case's composed with its link as before).
cluster_of() {
  if [ "$3" != 0 ] || [ "$4" != 0 ]; then echo "$OUT/cluster-$1.ini"
  elif [ "$CALIBRATE" = each ]; then echo "$OUT/cluster-at-$1.ini"
  elif [ "$2" = 1 ]; then echo "$OUT/cluster-1rank.ini"
  else echo "$OUT/cluster.ini"; fi
}
# rates_of NAME RANKS: the file whose rates (round R's: FILE.R) predict the case.
rates_of() {
  if [ "$CALIBRATE" = each ]; then echo "$OUT/cluster-at-$1.ini"
  elif [ "$2" = 1 ]; then echo "$OUT/cluster-1rank.ini"
  else echo "$OUT/cluster.ini"; fi
}

# run_case LINE R: round R's run of one case, its row appended to $OUT/NAME.rows.
run_case() {
  local name ranks rpn mode stale ep aep offload bw lat model task prompts group micro steps redundant every pp app tp actors atp
  IFS=, read -r name ranks rpn mode stale ep aep offload bw lat model task prompts group micro steps redundant every pp app tp actors atp <<< "$1"
  # The optional last columns: EDPB's spare expert slots per EP rank, its decision interval; the
  # pipeline stages and generation's pipeline degree; the tensor-parallel degree (disaggregated:
  # the learners'); disaggregated, the actor ranks (the others learn); generation's TP degree (the
  # actors', or fused generation's; 0: the runtime's default).
  redundant=${redundant:-0} every=${every:-0} pp=${pp:-1} app=${app:-1} tp=${tp:-1}
  actors=${actors:-1} atp=${atp:-0}
  local r=$2 dir="$OUT/$name" cluster
  cluster=$(cluster_of "$name" "$ranks" "$bw" "$lat")
  local args=(train --model "$model" --task "$task" --sft-steps 0 --steps "$steps" --prompts "$prompts"
        --group-size "$group" --micro-batch "$micro" --eval-prompts 10 --eval-every 0
        --log-every "$steps" --overwrite)
  if [ "$r" = 1 ] && { [ "$bw" != 0 ] || [ "$lat" != 0 ]; }; then
    # The case's emulated link, measured by the calibration's ping-pong through the emulation.
    mpiexec -n 2 "${BIND[@]}" "$RLFUSION" bench calibrate --output "$OUT/links-$name.ini" \
      --inter-node-bandwidth "$bw" --inter-node-latency "$lat" < /dev/null > "$dir.calibrate" 2>&1
  fi
  if [ "$ranks" -gt 1 ]; then
    args+=(--mode "$mode" --staleness "$stale" --ranks-per-node "$rpn" --expert-parallel "$ep"
           --actor-expert-parallel "$aep")
    [ "$offload" = 1 ] && args+=(--offload)
    [ "$redundant" != 0 ] && args+=(--redundant-experts "$redundant")
    [ "$every" != 0 ] && args+=(--rebalance-every "$every")
    [ "$pp" != 1 ] && args+=(--pipeline-parallel "$pp" --actor-pipeline-parallel "$app")
    [ "$tp" != 1 ] && args+=(--tensor-parallel "$tp")
    [ "$atp" != 0 ] && args+=(--actor-tensor-parallel "$atp")
    [ "$bw" != 0 ] && args+=(--inter-node-bandwidth "$bw")
    [ "$lat" != 0 ] && args+=(--inter-node-latency "$lat")
    [ "$mode" = disaggregated ] && args+=(--actors "$actors")
    # With EP, the dispatchers' inputs (each dispatch's top-k expert ids, copied into the trace),
    # from which plan --validate derives the expert_dispatch bytes.
    if [ "$ep" != 1 ] || [ "$aep" != 1 ]; then args+=(--trace-routing); fi
  fi
  [ "$mode" = disaggregated ] && [ "$ranks" -gt 1 ] || actors=0
  [ "$r" = 1 ] && : > "$dir.rows"
  if [ "$CALIBRATE" = each ]; then
    echo "# round $r, case $name: calibrating on $ranks rank(s) into $OUT/cluster-at-$name.ini.$r"
    calibrate_once "$ranks" "$OUT/cluster-at-$name.ini" "$r"
  fi
  echo "# round $r, case $name: mpiexec -n $ranks rlfusion ${args[*]} --run-dir $dir-run$r"
  local run="$dir-run$r"
  mpiexec -n "$ranks" "${BIND[@]}" "$RLFUSION" "${args[@]}" --run-dir "$run" < /dev/null \
    > "$run.stdout" 2>&1 || { echo "case $name failed:"; tail -5 "$run.stdout"; exit 1; }
  "$RLFUSION" report "$run" --json < /dev/null > "$run.report.json"
  "$PYTHON" - "$run" "$name,$cluster,$task,$model,$mode,$ranks,$rpn,$actors,$ep,$aep,$stale,$offload,$bw,$lat,$prompts,$group,$micro,0,2,$steps" "$redundant" "$every" "$pp" "$app" "$tp" "$atp" "${KINDS[@]}" >> "$dir.rows" <<'PY'
import json, os, re, sys
run, prefix, redundant, every, pp, app, tp, atp = sys.argv[1:9]
kinds = sys.argv[9:]
summary = json.load(open(run + "/summary.json"))
report = json.load(open(run + ".report.json"))
log = open(run + "/log.txt").read()
def counter(kind):
    m = re.search(kind + r"-node bytes \(all ranks\)\s+(\d+)", log)
    return int(m.group(1)) if m else 0
generated = sum(p["tokens"] for p in report["phases"] if p["phase"] == "generate")
peaks = summary.get("device_memory_peaks", {})
# Step time: the steady state the planner predicts, the mean wall time of the trace's RL steps
# after the first; the first step also pays every buffer's first touch (fused-offload-small: 1.45 s
# against 0.41-0.49 s for the next seven).
walls = [s["wall_s"] for s in report["steps"]]
steps = len(walls)
step_s = sum(walls[1:]) / (steps - 1) if steps > 1 else walls[0]
# By phase: the busiest rank's generate and train time per step, over the same steps. Generation
# is its phases' wall, the long-tail bubble nested at their ends included, as the planner predicts
# it (a phase decodes until its longest response); `generate_s` leaves the bubble out.
steady = report["steps"][1:] if steps > 1 else report["steps"]
generate_s = sum(s.get("generate_phase_s", s["generate_s"]) for s in steady) / len(steady)
train_s = sum(s["train_s"] for s in steady) / len(steady)
# The router's concentration (the busiest expert over the mean one, averaged over the layers): a
# property of the workload like the lengths above, recorded by every MoE `train` run (1 where a
# trace has no router statistics: runs from before 2026-12-04 recorded them with EP only).
router = report.get("router_max_over_mean", 0) or 1
# EDPB: spare slots or a decision interval rebalance; the share of (layer, expert) pairs its
# migrations after the first moved per step, from the trace (0 without migrations).
rebalance = 1 if redundant != "0" or every != "0" else 0
moves = report.get("expert_moves_per_step", 0)
# The routed experts a training call touched, a layer on average (0: not recorded, with EP the
# dispatchers route; the planner then takes a uniform router's).
touched = summary.get("active_experts_per_call", 0)
# Generation inside the pipelines: its groups' decode steps, which its messages follow (-1: not
# recorded, no such generation).
decode_steps = summary.get("pipeline_decode_steps", -1)
# StaleSync's lanes inside the pipelines: per stage their steps, decode rows, prefill sequences and
# prefill tokens, which their messages follow (empty: no such generation).
lanes = " ".join(str(n) for n in summary.get("pipeline_lanes", []))
# The run's trace, whose trained samples' ids and lengths fix the packed hand-offs' bytes.
trace = os.path.abspath(run + "/trace.h5")
traffic = summary.get("traffic_bytes", {})
by_kind = ",".join(str(sum(traffic.get(kind, [0, 0]))) for kind in kinds)
print(f'{prefix},{report["total"]["tokens"]},{generated},{step_s:.6f},{counter("intra")},'
      f'{counter("inter")},{peaks.get("generation", 0)},{peaks.get("training", 0)},'
      f'{generate_s:.6f},{train_s:.6f},{router:.6f},{redundant},{rebalance},{moves:.6g},{pp},{app},'
      f'{touched:.4f},{summary.get("migrations", 0)},{decode_steps},{tp},{atp},{trace},{lanes},'
      f'{summary.get("pool_generation_rows", -1)},{by_kind}')
PY
}

for r in $(seq "$REPEATS"); do
  if [ "$CALIBRATE" = round ]; then
    echo "# round $r of $REPEATS: calibrating this machine ($OUT/cluster.ini.$r on 2 ranks, $OUT/cluster-1rank.ini.$r on 1), then every case once"
    calibrate_once 2 "$OUT/cluster.ini" "$r"
    calibrate_once 1 "$OUT/cluster-1rank.ini" "$r"
  else
    echo "# round $r of $REPEATS: every case once, each right after a calibration of its own"
  fi
  for line in "${CASE_LINES[@]}"; do run_case "$line" "$r"; done
done
if [ "$CALIBRATE" = round ]; then
  merge_calibrations "$OUT/cluster.ini"
  merge_calibrations "$OUT/cluster-1rank.ini"
else
  for line in "${CASE_LINES[@]}"; do merge_calibrations "$OUT/cluster-at-${line%%,*}.ini"; done
fi

CASE_NAMES=()
for line in "${CASE_LINES[@]}"; do
  IFS=, read -r name ranks _ _ _ _ _ _ bw lat _ <<< "$line"
  CASE_NAMES+=("$name")
  if [ "$bw" != 0 ] || [ "$lat" != 0 ]; then
    # The compute rates stay those of the two-rank calibration (the round's, or the case's own with
    # CALIBRATE=each); only the link is the emulated one. One file per round, and one from the
    # merged calibration.
    cluster=$(cluster_of "$name" "$ranks" "$bw" "$lat")
    rates=$(rates_of "$name" "$ranks")
    for r in $(seq "$REPEATS") ""; do
      suffix=${r:+.$r}
      { grep -v -E '^(intra|inter)_supernode_' "$rates$suffix"
        grep -E '^(intra|inter)_supernode_' "$OUT/links-$name.ini"; } > "$cluster$suffix"
    done
  fi
  echo "# $name step times (s), rounds 1..$REPEATS: $(cut -d, -f23 "$OUT/$name.rows" | tr '\n' ' ')"
done

# Each round's runs predicted on that round's calibration; the round with the median error stands
# for each case (jobs/local/validation_rounds.py).
"$PYTHON" "$(dirname "$0")/validation_rounds.py" "$RLFUSION" "$OUT" "$REPEATS" "$MEASURED" \
  "$OUT/measured-paired.csv" "${CASE_NAMES[@]}"
mv "$OUT/measured-paired.csv" "$MEASURED"
echo "# measured: $MEASURED (each case's chosen round, on that round's cluster file)"
if [ "$OVERSUBSCRIBE" = 1 ]; then
  echo "# OVERSUBSCRIBE=1: the ranks shared cores, so the step times below are not predictions to compare; the bytes and memory columns are"
fi
"$RLFUSION" plan --validate "$MEASURED"
