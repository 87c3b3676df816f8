"""Draw docs/figures/concepts.png: VRAM = dense + KV + expert cache; loan, carve, ring, tail, pool.

    python docs/figures/make_concepts.py

Proportions are illustrative (a 12 GiB card, qwen3-30b-a3b Q8_0), not to scale byte for byte.
"""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

OUT = Path(__file__).with_name("concepts.png")

# (label, bottom, height, x, width, colour) in a 0..100 tall column
BOXES = [  # (label, bottom, height, x, width, colour, label at "mid" or "top")
    ("dense weights (attention, norms, router, embeddings)", 0, 14, 0, 10, "#9ecae1", "mid"),
    ("KV cache (longest prompt)", 14, 8, 0, 10, "#c6dbef", "mid"),
    ("expert cache: resident slots, round-robin over layers", 22, 30, 0, 10, "#a1d99b", "mid"),
    ("LOAN: top slots of the cache (<= lend_cap 0.9), one prompt", 52, 40, 0, 10, "#fdd0a2",
     "top"),
    ("ring: R slots of max_blob (streamed experts)", 53, 15, 1, 8, "#fd8d3c", "mid"),
    ("activations of one chunk (x, xn, union of attention | moe)", 68, 8, 1, 8, "#fdae6b", "mid"),
    ("TAIL: carve stop .. loan end", 76.5, 12, 1, 8, "#fee6ce", "top"),
    ("slab pool: stream-k scratch (STRATA_MMQ_SLAB=1)", 77.5, 6.5, 2, 6, "#fcbba1", "mid"),
    ("reserve (CUDA context, slack)", 92, 8, 0, 10, "#d9d9d9", "mid"),
]


def main() -> None:
    fig, ax = plt.subplots(figsize=(9, 8))
    for label, y, h, x, w, colour, where in BOXES:
        ax.add_patch(Rectangle((x, y), w, h, facecolor=colour, edgecolor="k", lw=0.8))
        ty = y + h / 2 if where == "mid" else y + h - 1.8
        ax.text(x + w / 2, ty, label, ha="center", va="center", fontsize=8.5)
    ax.annotate("CARVE: bump allocator over the loan\n(ring first, then activations;\n"
                "bytes_needed = a dry carve's stop)", xy=(9, 66), xytext=(10.6, 64), fontsize=8.5,
                arrowprops=dict(arrowstyle="->"))
    ax.annotate("refilled from host memory\nafter the prompt (also on failure)", xy=(10, 90),
                xytext=(10.6, 90), fontsize=8.5, arrowprops=dict(arrowstyle="->"))
    ax.annotate("experts not cached stream over PCIe\n(H2D, ~55 GB/s) into ring slots",
                xy=(9, 58), xytext=(10.6, 50), fontsize=8.5, arrowprops=dict(arrowstyle="->"))
    ax.set_xlim(0, 17)
    ax.set_ylim(0, 100)
    ax.set_yticks([0, 100], ["0", "VRAM top"])
    ax.set_xticks([])
    ax.set_title("strata: one GPU's VRAM during a prompt")
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
