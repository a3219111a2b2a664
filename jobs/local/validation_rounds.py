#!/usr/bin/env python3
"""Pairs each round of the planner's validation with its own calibration.

validate_planner.sh runs REPEATS rounds, each a calibration of the machine followed by one run of
every case. This shared VM's speed moves between minutes (the same case 25-35% apart within one
validation), so a run is predicted best by the calibration made in its own round: the same
stretch of the machine. For each round r this predicts every case's round-r run on the round's
cluster file (its cluster column + ".r": OUT/cluster.ini.r, OUT/cluster-1rank.ini.r, or a
case's emulated-link file composed for the round), prints each case's error in every round, and
writes OUT_CSV with, for every case, the round whose error is the median of its rounds' errors
(its run and its round's cluster file), which `plan --validate OUT_CSV` then tabulates. Each
case's spread (its largest round error less its smallest, in points) and their median show how
far the machine's own noise reaches against the targets (mean |error| <= 10%, worst <= 20%).

usage: validation_rounds.py RLFUSION OUT REPEATS HEADER_CSV OUT_CSV CASE...
  HEADER_CSV: a file whose first line is the measured CSV's header; OUT/CASE.rows holds one row
  per round (without header), in round order.
"""
import json
import subprocess
import sys


def main(argv):
    if len(argv) < 6:
        print(__doc__, file=sys.stderr)
        return 2
    rlfusion, out, repeats, header_csv, out_csv = argv[:5]
    cases = argv[5:]
    repeats = int(repeats)
    with open(header_csv) as f:
        header = f.readline().strip()
    cluster_column = header.split(",").index("cluster")
    rows = {}
    for case in cases:
        with open(f"{out}/{case}.rows") as f:
            rows[case] = [line.strip() for line in f if line.strip()]
        if len(rows[case]) != repeats:
            print(f"{out}/{case}.rows holds {len(rows[case])} rows, not {repeats}", file=sys.stderr)
            return 2

    def round_row(case, r):
        fields = rows[case][r - 1].split(",")
        fields[cluster_column] += f".{r}"
        return ",".join(fields)

    errors = {case: [] for case in cases}
    for r in range(1, repeats + 1):
        path = f"{out}/round-{r}.csv"
        with open(path, "w") as f:
            f.write(header + "\n")
            for case in cases:
                f.write(round_row(case, r) + "\n")
        result = subprocess.run([rlfusion, "plan", "--validate", path, "--json"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            sys.stderr.write(result.stdout + result.stderr)
            return result.returncode
        predicted = json.loads(result.stdout.strip().splitlines()[-1])
        for entry in predicted["cases"]:
            errors[entry["case"]].append(entry["error_pct"])

    print("# step-time error (%) of each round's run on its round's calibration, and the round "
          "that stands for the case (its error the median)")
    print("# case                       " + " ".join(f"{'round ' + str(r):>8}" for r in
                                                   range(1, repeats + 1)) + "   chosen   spread")
    spreads = {}
    with open(out_csv, "w") as f:
        f.write(header + "\n")
        for case in cases:
            by_error = sorted(range(repeats), key=lambda i: (errors[case][i], i))
            chosen = by_error[(repeats - 1) // 2] + 1
            spreads[case] = max(errors[case]) - min(errors[case])
            f.write(round_row(case, chosen) + "\n")
            print(f"  {case:27s}" + " ".join(f"{e:+8.1f}" for e in errors[case]) +
                  f"   {chosen:6d} {spreads[case]:8.1f}")
    ordered = sorted(spreads.values())
    widest = max(cases, key=lambda case: spreads[case])
    print(f"# rounds' spread (points: a case's largest round error less its smallest): median "
          f"{ordered[(len(ordered) - 1) // 2]:.1f}, widest {spreads[widest]:.1f} ({widest}); "
          f"{sum(1 for v in ordered if v > 20)} of {len(ordered)} cases spread more than the "
          f"worst-case target's 20")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
