"""Matplotlib for the analysis commands: imported only when a figure is drawn (a
run never loads it), off-screen (Agg: cluster nodes have no display), and every
figure finished and freed the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def axes(width: float, height: float = 4.5) -> tuple[Any, Any, Any]:
    """pyplot, and a new figure of one axes ``width`` x ``height`` inches."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(width, height))
    return plt, fig, ax


def finish(plt: Any, fig: Any, ax: Any, path: Path, xlabel: str, ylabel: str, title: str,
           legend: bool = True) -> Path:
    """Labels, grid and legend (a heatmap has neither), then save the figure to
    ``path`` and free it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if legend:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save(plt, fig, path)


def save(plt: Any, fig: Any, path: Path, layout: bool = True) -> Path:
    """The figure laid out (``layout``: not a grid of heatmaps with a shared colour
    bar, which places itself), written to ``path`` and freed."""
    if layout:
        fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
