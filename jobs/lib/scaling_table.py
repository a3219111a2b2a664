#!/usr/bin/python3
"""Scaling table (and plot) from the run directories of a scaling study.

    jobs/lib/scaling_table.py STUDY_DIR [--plot FILE.png] [--label TEXT] [--csv]

Every directory under STUDY_DIR that holds summary.json (a finished run) and scaling.txt
(written by the drivers: study, nodes, ranks) is one row: nodes, ranks, tokens/s (the
summary's RL tokens/s), tokens/s per device (one device per rank), speed-up over the row with
the fewest ranks, and efficiency = speed-up / (ranks / that row's ranks): the share of linear
scaling, for strong scaling (fixed problem) and weak scaling (problem grows with the ranks)
alike, since both count tokens per second. Standard library only; --plot needs matplotlib
(Debian: python3-matplotlib, with /usr/bin/python3) and is skipped with a note without it.
"""
import argparse
import json
import os
import sys
import textwrap


def read_pairs(path):
    values = {}
    with open(path) as f:
        for line in f:
            parts = line.split(None, 1)
            if len(parts) == 2:
                values[parts[0]] = parts[1].strip()
    return values


def collect(study_dir):
    rows = []
    for root, _dirs, files in os.walk(study_dir):
        if "summary.json" not in files or "scaling.txt" not in files:
            continue
        with open(os.path.join(root, "summary.json")) as f:
            summary = json.load(f)
        meta = read_pairs(os.path.join(root, "scaling.txt"))
        # One-rank runs (the single-rank path) have no "ranks" in their summary.
        ranks = int(summary.get("ranks", meta.get("ranks", 1)))
        rows.append({
            "study": meta.get("study", "?"),
            "mode": summary.get("mode", "?"),
            "nodes": int(meta.get("nodes", 1)),
            "ranks": ranks,
            "tokens_per_s": float(summary["rl_tokens_per_s"]),
            "run_dir": root,
        })
    rows.sort(key=lambda r: (r["ranks"], r["nodes"]))
    if rows:
        base = rows[0]
        for r in rows:
            r["tokens_per_s_per_device"] = r["tokens_per_s"] / r["ranks"]
            r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
            r["efficiency"] = r["speedup"] / (r["ranks"] / base["ranks"])
    return rows


def print_table(rows, label, csv):
    if csv:
        print("study,mode,nodes,ranks,tokens_per_s,tokens_per_s_per_device,speedup,efficiency,run_dir")
        for r in rows:
            print("%s,%s,%d,%d,%.1f,%.1f,%.3f,%.3f,%s" % (
                r["study"], r["mode"], r["nodes"], r["ranks"], r["tokens_per_s"],
                r["tokens_per_s_per_device"], r["speedup"], r["efficiency"], r["run_dir"]))
        return
    if label:
        print("# %s" % label)
    print("# %-7s %-14s %6s %6s %12s %18s %9s %11s" % (
        "study", "mode", "nodes", "ranks", "tokens/s", "tokens/s/device", "speed-up", "efficiency"))
    for r in rows:
        print("  %-7s %-14s %6d %6d %12.1f %18.1f %8.2fx %10.1f%%" % (
            r["study"], r["mode"], r["nodes"], r["ranks"], r["tokens_per_s"],
            r["tokens_per_s_per_device"], r["speedup"], 100 * r["efficiency"]))


def plot(rows, path, label):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# no plot: --plot needs matplotlib (Debian: apt-get install python3-matplotlib; run "
              "with /usr/bin/python3)", file=sys.stderr)
        return
    ranks = [r["ranks"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    left.plot(ranks, [r["tokens_per_s"] for r in rows], "o-", label="measured")
    left.plot(ranks, [rows[0]["tokens_per_s"] * n / ranks[0] for n in ranks], "--",
              color="grey", label="linear")
    left.set_xlabel("ranks (devices)")
    left.set_ylabel("RL tokens/s")
    left.legend()
    right.plot(ranks, [100 * r["efficiency"] for r in rows], "o-")
    right.set_ylim(0, 110)
    right.set_xlabel("ranks (devices)")
    right.set_ylabel("parallel efficiency (%)")
    for axis in (left, right):
        axis.set_xticks(ranks)
        axis.grid(alpha=0.3)
    title = label or "%s scaling" % rows[0]["study"]
    fig.suptitle("\n".join(textwrap.wrap(title, 90)), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print("# plot: %s" % path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("study_dir")
    parser.add_argument("--plot", metavar="FILE")
    parser.add_argument("--label", default="")
    parser.add_argument("--csv", action="store_true")
    args = parser.parse_args()
    rows = collect(args.study_dir)
    if not rows:
        sys.exit("scaling_table: no finished run (summary.json + scaling.txt) under %s" % args.study_dir)
    print_table(rows, args.label, args.csv)
    if args.plot:
        plot(rows, args.plot, args.label)


if __name__ == "__main__":
    main()
