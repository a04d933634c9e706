"""Bus bandwidth against message size, log-log: one panel per collective
(shared axes, so panels compare at a glance), one line per backend in each,
same colour and style for a backend everywhere. Each collective is drawn
from the column that is its plain torch call (in place for
all_reduce/broadcast/reduce, out of place for the others).

Used by collectives_perf.py --plot, or on a saved run:

    python benchmarks/plot_busbw.py results.json busbw.png
"""
import json
import sys

import coll_ops

STYLES = [("tab:red", "-", "o"), ("tab:blue", "--", "s"), ("tab:green", ":", "^"), ("tab:purple", "-.", "D")]


def size_label(nbytes, _pos=None):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes:g}B"


def plot(rows, path, config):
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    backends = list(dict.fromkeys(r["backend"] for r in rows))
    colls = list(dict.fromkeys(r["collective"] for r in rows))
    nrows = -(-len(colls) // 4)  # at most 4 panels a row, rows as even as possible
    cols = -(-len(colls) // nrows)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols + 0.6, 3.6 * nrows + 1.0), dpi=110,
                             sharex=True, sharey=True, squeeze=False)
    sizes = sorted({r["size"] for r in rows})
    ticks = sizes[::max(1, -(-len(sizes) // 8))]  # at most 8 labelled sizes, all of them measured ones
    for ax, coll in zip(axes.flat, colls):
        native = coll_ops.COLLECTIVES[coll].native
        tag = "ip" if native == "in-place" else "oop"
        for (color, style, marker), backend in zip(STYLES, backends):
            pts = [(r["size"], r[f"{tag}_busbw"]) for r in rows
                   if r["collective"] == coll and r["backend"] == backend and r[f"{tag}_busbw"] > 0]
            if pts:
                ax.plot(*zip(*pts), linestyle=style, marker=marker, color=color, markersize=4, linewidth=1.8,
                        label=backend)
        ax.set_title(f"{coll} ({native})", fontsize=11)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(size_label))
        ax.tick_params(axis="x", labelrotation=45, labelbottom=True)
        ax.grid(True, which="major", alpha=0.45)
        ax.grid(True, which="minor", axis="y", alpha=0.12)
    for ax in axes.flat[len(colls):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("bus bandwidth (GB/s)")
    for i in range(cols):  # under the lowest visible panel of each column
        axes[(len(colls) - 1 - i) // cols, i].set_xlabel("size (bytes; K, M = KiB, MiB)")
    world, nodes, per_node = config.get("layout", (config.get("world"), 1, config.get("world")))
    types = "/".join(config.get("types", ["float"]))
    fig.suptitle(f"nccl-tests bus bandwidth vs size: {world} ranks = {nodes} machine(s) x {per_node}, "
                 f"{types}, torch {config.get('torch', '?')}", fontsize=12, y=0.99)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.95), ncol=len(backends), fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path)
    plt.close(fig)


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    with open(sys.argv[1]) as f:
        saved = json.load(f)
    plot(saved["rows"], sys.argv[2], saved["config"])


if __name__ == "__main__":
    main()
