"""Does a synthetic model route like a trained MoE? Expert hit fraction and residual RMS per layer.

    python benchmarks/synth_hits.py                       # 48 layers, E=128, K=8, D=512, T=2048 (CPU, minutes)
    python benchmarks/synth_hits.py --preset qwen3-30b-a3b --tokens 2048   # the full shape (GPU host)
    python benchmarks/synth_hits.py --smoke               # tiny: checks the script

What bounds it: a trained MoE with load balancing hits nearly every expert of a layer at
T >= 2048, K = 8, E = 128 (expected fraction for uniform independent routing: 1 - (1 - K/E)^T, i.e.
1.0 here). A synthetic model that falls short makes every streaming number optimistic (fewer
experts to move). Also compared: the synthesizer with flat q/k norms (synth_pack(qk_norm_scale=1)), where
near-uniform attention lets a shared residual component grow until routing collapses.
Writes benchmarks/results/synth-hits-<commit>.csv (strata.bench long format: figures hit_fraction,
peak_load_over_mean, resid_rms per layer and q/k norm scale) and .png; `--base REF` adds the same
run at a git ref. Untimed: no gate applies.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

import strata.packs.synth as synth
from strata import bench
from strata.engine.route_trace import route_trace
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]


def run(shape, T, quant, qk_scale, seed, use_model):
    with tempfile.TemporaryDirectory() as d:
        p = synth.synth_pack(Path(d) / "m.pack", shape, synth.ExpertFormats.of(quant), seed=seed,
                             qk_norm_scale=qk_scale)
        ids = torch.randint(0, shape.vocab, (T,), generator=torch.Generator().manual_seed(seed))
        tr = route_trace(p, ids, use_model=use_model)
    loads = [torch.bincount(t.flatten(), minlength=shape.n_expert).float() for t in tr.topk]
    rms = tr.resid_rms or [float("nan")] * shape.n_layer
    return [(i, f, r, float(l.max() / l.mean())) for i, (f, r, l) in
            enumerate(zip(tr.hit_fractions(shape.n_expert), rms, loads))]


FIGURES = {"hit_fraction": "fraction", "peak_load_over_mean": "ratio", "resid_rms": "rms"}


def shape_of(a):
    shape = get_preset(a.preset) if a.preset else get_preset("qwen3-30b-a3b").with_(
        d_model=512, d_expert=64, n_head=8, n_kv_head=2, head_dim=64, vocab=4096)
    if a.smoke:
        shape, a.tokens = get_preset("small").with_(n_layer=3, n_expert=32, top_k=4), 64
    if a.layers:
        shape = shape.with_(n_layer=a.layers)
    return shape


def measure(a, rec: bench.Recorder) -> None:
    shape = shape_of(a)
    uniform = 1 - (1 - shape.top_k / shape.n_expert) ** a.tokens
    for qk in (synth.QK_NORM_SCALE, 1.0):
        for i, f, r, peak in run(shape, a.tokens, a.quant, qk, 0, a.model or None):
            cfg = dict(qk_norm_scale=qk, layer=i, tokens=a.tokens, n_expert=shape.n_expert,
                       top_k=shape.top_k, d_model=shape.d_model, quant=a.quant)
            rec.add("hit_fraction", f, "fraction", bound="uniform routing 1-(1-K/E)^T",
                    bound_value=uniform, **cfg)
            rec.add("peak_load_over_mean", peak, "ratio", **cfg)
            rec.add("resid_rms", r, "rms", **cfg)


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(14, 4))
    series = dict.fromkeys((r["label"], r["config"]["qk_norm_scale"]) for r in rows)
    for label, qk in series:
        for k, key in enumerate(FIGURES):
            rr = [r for r in rows if r["figure"] == key and r["label"] == label
                  and r["config"]["qk_norm_scale"] == qk]
            ax[k].plot([r["config"]["layer"] for r in rr], [r["value"] for r in rr], marker=".",
                       label=f"q/k norm x{qk:g}" + ("" if label == "tree" else f" @{label}"))
            ax[k].set_xlabel("layer")
            ax[k].set_title(key.replace("_", " "))
    ax[0].set_ylim(0, 1.05)
    ax[0].axhline(rows[0]["bound_value"] or 1.0, color="gray", lw=0.5)
    ax[0].legend()
    c = rows[0]["config"]
    fig.suptitle(f"synthetic MoE routing: T={c['tokens']}, E={c['n_expert']}, K={c['top_k']}, "
                 f"D={c['d_model']}, {1 + max(r['config']['layer'] for r in rows)} layers, "
                 f"{c['quant']} ({rows[0]['commit']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary(rows):
    for label, qk in dict.fromkeys((r["label"], r["config"]["qk_norm_scale"]) for r in rows):
        fr = [r["value"] for r in rows if r["figure"] == "hit_fraction" and r["label"] == label
              and r["config"]["qk_norm_scale"] == qk]
        print(f"[{label}] q/k norm x{qk:g}: hit fraction min {min(fr):.3f} "
              f"mean {sum(fr) / len(fr):.3f}")


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "benchmarks" / "results")
    ap.add_argument("--preset", default=None, help="a strata preset (default: 48L E128 K8 D512)")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--quant", default="Q8_0")
    ap.add_argument("--model", action="store_true",
                    help="the model on the default device (packs already are; CUDA: Triton GEMM)")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    stem = f"synth-hits-{'smoke-' if a.smoke else ''}{bench.commit_of(ROOT)}"
    return bench.main(a, "synth_hits", measure, script=__file__, argv=argv, stem=stem,
                      plot=plot, summary=summary)


if __name__ == "__main__":
    sys.exit(main())
