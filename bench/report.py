"""The bench table (stdout), ``bench/out/results.json`` and the plots (``bench/out/*.png``)."""

from __future__ import annotations

from pathlib import Path

from bench.common import FIGURES, OUT, SERIES, save_results


def table() -> str:
    head = f"{'':4} {'figure':<46} {'measured':>18} {'ceiling / rival':>18} {'ratio':>7}  {'goal':<22} met"
    lines = [head, "-" * len(head)]
    for f in FIGURES:
        rival = f"{f.rival:,.2f}" if f.rival is not None else "-"
        ratio = f"{f.ratio:.3g}" if f.ratio is not None else "-"
        met = "-" if f.met is None else ("yes" if f.met else "NO")
        lines.append(
            f"{f.id:4} {f.what[:46]:<46} {f'{f.value:,.2f} {f.unit}':>18} {rival:>18} {ratio:>7}  {f.goal[:22]:<22} {met}"
        )
        if f.rival_what:
            lines.append(f"{'':4}   ceiling/rival: {f.rival_what}")
    return "\n".join(lines)


def plots() -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plots")
        return []
    OUT.mkdir(exist_ok=True)
    written = []
    merge = SERIES.get("merge_vs_history")
    if merge:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(
            merge["history_rows"],
            merge["incremental_s"],
            "o-",
            label=f"incremental MERGE ({merge['increment']:,} changes)",
        )
        ax.plot(merge["history_rows"], merge["full_s"], "s-", label="full ROW_NUMBER() recompute")
        ax.set_xscale("log")
        ax.set_xlabel("history rows")
        ax.set_ylabel("seconds (median)")
        ax.set_title("Merge time vs history size")
        ax.legend()
        ax.grid(True, alpha=0.3)
        path = OUT / "merge_vs_history.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    stages = SERIES.get("stage_throughput")
    if stages:
        names = list(stages)
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [stages[n]["measured"] for n in names], width=0.4, label="loader")
        ax.bar([x + 0.2 for x in xs], [stages[n]["ceiling"] for n in names], width=0.4, label="ceiling / rival")
        ax.set_xticks(list(xs), names)
        ax.set_yscale("log")
        ax.set_ylabel("changes per second (median)")
        ax.set_title("Per-stage throughput vs its ceiling")
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)
        path = OUT / "stage_throughput.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def finish() -> None:
    print("\n" + table())
    print(f"\nfigures: {save_results()}")
    for p in plots():
        print(f"plot: {p}")
