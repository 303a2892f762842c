"""Markdown tables, JSON summaries and matplotlib figures for the experiments."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from benchmarks.experiments.runner import RESULTS

SYSTEM_LABELS = {"roll": "ROLL", "roll-large": "ROLL-Large", "rlboost": "RLBoost+", "pearl": "PEARL"}
COLORS = {"roll": "#7f7f7f", "roll-large": "#bcbd22", "rlboost": "#1f77b4", "pearl": "#d62728"}
ROLE_COLORS = {"C": "#2ca02c", "P": "#9467bd", "D": "#ff7f0e", "oC": "#98df8a", "oP": "#c5b0d5", "oD": "#ffbb78"}


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) and abs(v) < 10 else f"{v:.0f}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write(experiment: str, summary: dict[str, Any], markdown: str) -> Path:
    out = RESULTS / experiment
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / f"{experiment}.md").write_text(markdown)
    print(markdown, flush=True)
    return out


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def step_series(result: dict[str, Any]) -> tuple[list[float], list[float]]:
    """Per-step throughput as a step function over the step's time span (minutes)."""
    xs, ys = [], []
    for s in result["steps"]:
        xs += [s["start_s"] / 60, s["end_s"] / 60]
        ys += [s["throughput"], s["throughput"]]
    return xs, ys


def roles_panel(ax, result: dict[str, Any], *, title: str = "") -> None:
    """Stacked active workers by role over time: own (dark) and borrowed (light)."""
    samples = result["samples"]
    if not samples:
        return
    t = [s["t_s"] / 60 for s in samples]
    keys = [k for k in ("C", "P", "D", "oC", "oP", "oD") if any(s.get(k) for s in samples)]
    ax.stackplot(t, *[[s.get(k, 0) for s in samples] for k in keys], step="post",
                 labels=[("borrowed " if k.startswith("o") else "") + {"C": "colocated", "P": "prefill",
                                                                        "D": "decode"}[k[-1]] for k in keys],
                 colors=[ROLE_COLORS[k] for k in keys])
    ax.set_ylabel("workers")
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, loc="upper right", ncol=3)


def grouped_bars(ax, groups: Sequence[str], series: dict[str, list[float]], *, ylabel: str,
                 colors: dict[str, str] | None = None) -> None:
    """One bar per series in each group, side by side, with a legend."""
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([j + (i - len(series) / 2 + 0.5) * width for j in range(len(groups))], values, width,
               label=label, **({"color": colors[label]} if colors else {}))
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
