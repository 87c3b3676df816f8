"""A PNG of long-format rows: one panel per figure, a bar per config and label, bounds dashed."""
from __future__ import annotations

from pathlib import Path


def config_name(row: dict, keys: list[str] | None = None) -> str:
    cfg = row["config"]
    keys = keys if keys is not None else sorted(cfg)
    return " ".join(f"{cfg[k]}" for k in keys if k in cfg) or "-"


def bars(rows: list[dict], path: str | Path, *, title: str = "", x_keys: list[str] | None = None,
         figures: list[str] | None = None) -> Path:
    """Bar chart of `value` per config (x_keys of config, all keys by default), one bar per label
    (tree, the --base REF), one panel per figure; a dashed line at each figure's bound_value."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if isinstance(r["value"], float)]   # categorical figures: not drawn
    figures = figures or list(dict.fromkeys(r["figure"] for r in rows))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    fig, axes = plt.subplots(len(figures), 1, figsize=(9, 3.2 * len(figures)), squeeze=False)
    for ax, figure in zip(axes[:, 0], figures):
        rs = [r for r in rows if r["figure"] == figure]
        cats = list(dict.fromkeys(config_name(r, x_keys) for r in rs))
        width = 0.8 / max(1, len(labels))
        for i, label in enumerate(labels):
            vals = {config_name(r, x_keys): r["value"] for r in rs if r["label"] == label}
            ax.bar([j + i * width for j in range(len(cats))], [vals.get(c, 0) for c in cats],
                   width, label=label)
        for bv, words in {(r["bound_value"], r["bound"]) for r in rs if r.get("bound_value")}:
            ax.axhline(bv, color="k", ls="--", lw=1, label=words)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats, rotation=20,
                      fontsize=8)
        ax.set_ylabel(rs[0]["unit"] if rs else "")
        ax.set_title(figure, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
