#!/usr/bin/python3
"""Plots of one rlfusion run directory, as PNGs next to its trace (or in --out):

  throughput.png  tokens/s per training step (policy version) and the run's overall rate
  breakdown.png   each rank's time split into generate / train / queue / communication / other
                  / idle (stacked, % of the wall time)
  timeline.png    each rank's phases over time (one row per rank, coloured by phase)

The step and breakdown figures are the ones `rlfusion report RUN_DIR --json` computes (one
definition, docs/METRICS.md); the timeline reads trace.h5 directly with h5py. Needs Debian's
python3-h5py and python3-matplotlib (`make plots` installs them).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import h5py
import matplotlib

matplotlib.use("Agg")  # batch nodes have no display
import matplotlib.pyplot as plt  # noqa: E402

CATEGORIES = ["generate", "train", "queue", "communication", "other", "idle"]
COLOURS = {"generate": "tab:green", "train": "tab:blue", "queue": "tab:orange",
           "communication": "tab:red", "other": "tab:gray", "idle": "white"}


def fail(message):
    print(f"plot_run: error: {message}", file=sys.stderr)
    sys.exit(2)


def find_rlfusion(given):
    for candidate in [given, os.environ.get("RLFUSION"), shutil.which("rlfusion"),
                      os.path.join(os.path.dirname(__file__), "..", "..", "build", "src",
                                   "rlfusion")]:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    fail("cannot find the rlfusion binary: pass --rlfusion PATH or set RLFUSION")


def report(rlfusion, run_dir):
    done = subprocess.run([rlfusion, "report", run_dir, "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"rlfusion report {run_dir} failed: {done.stderr.strip() or done.stdout.strip()}")
    line = next((l for l in done.stdout.splitlines() if l.startswith('{"command":"report"')), None)
    if line is None:
        fail(f"rlfusion report {run_dir} printed no JSON")
    return json.loads(line)


def plot_throughput(summary, path):
    steps = summary["steps"]
    fig, ax = plt.subplots(figsize=(8, 4))
    if steps:
        ax.plot([s["version"] for s in steps], [s["tokens_per_s"] for s in steps],
                marker=".", linewidth=1, label="per step")
        ax.axhline(summary["total"]["tokens_per_s"], color="black", linestyle="--",
                   label=f"overall {summary['total']['tokens_per_s']:,.0f} tokens/s")
        ax.legend(loc="lower right")
    else:
        ax.text(0.5, 0.5, "no training steps in this trace", ha="center", transform=ax.transAxes)
    ax.set_xlabel("training step (policy version)")
    ax.set_ylabel("tokens trained / s")
    meta = summary["metadata"]
    ax.set_title(f"{meta.get('command', 'run')} {meta.get('mode', '')}: model "
                 f"{meta.get('model', '?')}, task {meta.get('task', '?')}, "
                 f"{summary['world_size']} ranks".replace("  ", " "))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_breakdown(summary, path):
    ranks = summary["ranks"]
    fig, ax = plt.subplots(figsize=(max(4, 1 + 0.6 * len(ranks)), 4))
    bottom = [0.0] * len(ranks)
    x = [r["rank"] for r in ranks]
    for category in CATEGORIES:
        values = [r[f"{category}_pct"] for r in ranks]
        ax.bar(x, values, bottom=bottom, label=category, color=COLOURS[category],
               edgecolor="black", linewidth=0.5)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xlabel("rank")
    ax.set_ylabel(f"% of wall time ({summary['wall_s']:.2f} s)")
    ax.set_xticks(x)
    ax.set_ylim(0, 100)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    ax.set_title("time per rank")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_timeline(trace_path, path):
    with h5py.File(trace_path, "r") as trace:
        world = int(trace.attrs["world_size"])
        phase_type = trace[f"rank_{0:05d}/events"].dtype["phase"]
        names = {value: name for name, value in h5py.check_enum_dtype(phase_type).items()}
        fig, ax = plt.subplots(figsize=(10, 1 + 0.5 * world))
        colours = {}
        palette = plt.get_cmap("tab20")
        for rank in range(world):
            events = trace[f"rank_{rank:05d}/events"][()]
            # One collection per phase (thousands of events draw in one call each); longer phases
            # first, so nested inner phases draw on top of the phases around them.
            by_phase = {}
            for phase, begin, end in zip(events["phase"], events["begin"], events["end"]):
                by_phase.setdefault(names[int(phase)], []).append((begin, end - begin))
            for name, spans in sorted(by_phase.items(),
                                      key=lambda item: -sum(w for _, w in item[1]) / len(item[1])):
                colour = colours.setdefault(name, palette(len(colours) % 20))
                ax.broken_barh(spans, (rank - 0.4, 0.8), facecolors=colour)
        ax.set_yticks(range(world))
        ax.set_yticklabels([f"rank {r}" for r in range(world)])
        ax.invert_yaxis()
        ax.set_xlabel("time since the run's epoch (s)")
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
        ax.legend(handles, list(colours), loc="upper left", bbox_to_anchor=(1.0, 1.0),
                  fontsize="small")
        ax.set_title("phases per rank")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="a run directory holding trace.h5")
    parser.add_argument("--out", help="directory for the PNGs (default: the run directory)")
    parser.add_argument("--rlfusion", help="the rlfusion binary (default: $RLFUSION, PATH, build/)")
    args = parser.parse_args()
    trace_path = os.path.join(args.run_dir, "trace.h5")
    if not os.path.isfile(trace_path):
        fail(f"'{trace_path}' does not exist (is '{args.run_dir}' a run directory?)")
    out = args.out or args.run_dir
    if not os.path.isdir(out):
        fail(f"output directory '{out}' does not exist")
    summary = report(find_rlfusion(args.rlfusion), args.run_dir)
    written = []
    for name, draw in [("throughput.png", lambda p: plot_throughput(summary, p)),
                       ("breakdown.png", lambda p: plot_breakdown(summary, p)),
                       ("timeline.png", lambda p: plot_timeline(trace_path, p))]:
        path = os.path.join(out, name)
        draw(path)
        written.append(path)
    for path in written:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
