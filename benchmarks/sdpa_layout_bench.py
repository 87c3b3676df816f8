"""The first chunk's attention as the engine calls it against the SDPA call the compute floor times.

Legend: T chunk tokens, H query heads, Hkv kv heads, hd head width.

The all-resident read's compute floor (strata.bench.roofline.sdpa_rate) times
scaled_dot_product_attention on q [1, H, T, hd], k, v [1, Hkv, T, hd], all contiguous. The
engine's first chunk (strata.kernels.attention.flash.first_chunk_attention) passes the same q
and k (norm_rope writes [H, T, hd]) but v as the projection wrote it, [T, Hkv, hd], seen through
a transpose, and reads o back as [T, H·hd]. At 32K the read's attention ran at 586 TFLOP/s
against the floor's 670 (profile_resident 6e7b876): this bench says which of the differences
costs it.

Arms, each at P = 0, causal, GQA:
- floor: the floor's call (contiguous q, k, v).
- engine: first_chunk_attention on the engine's tensors, then o as [T, H·hd] (the o
  projection's input; reshape copies when o is not already in that order).
- v-contiguous: the engine's call with v copied to [Hkv, T, hd] first (the copy timed).
- floor/<backend>: the floor's call pinned to one SDPA backend (cudnn, flash), where it runs.

Figures: ms and TFLOP/s (2·T²·H·hd: the floor's count). The gate: every arm's o within REL of the
floor arm's (normalized max error; different backends differ in rounding only).

    python benchmarks/sdpa_layout_bench.py             # GPU: qwen3-30b-a3b, T 8K, 32K
    python benchmarks/sdpa_layout_bench.py --smoke     # CPU, tiny: checks the script
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from strata import bench
from strata.kernels.attention.flash import first_chunk_attention
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]
REL = 2e-2


def backends() -> dict:
    """SDPA backends to pin (name -> SDPBackend), those this torch names."""
    from torch.nn.attention import SDPBackend
    return {n: getattr(SDPBackend, a) for n, a in (("cudnn", "CUDNN_ATTENTION"),
                                                   ("flash", "FLASH_ATTENTION"))
            if hasattr(SDPBackend, a)}


def measure(args, rec: bench.Recorder) -> None:
    dev = rec.device
    s = get_preset(args.shape)
    H, Hkv, hd = (4, 2, 16) if args.smoke else (s.n_head, s.n_kv_head, s.head_dim)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    for T in args.T:
        q = torch.randn(H, T, hd, device=dev, dtype=dt)          # norm_rope's output order
        k = torch.randn(Hkv, T, hd, device=dev, dtype=dt)
        v_proj = torch.randn(T, Hkv * hd, device=dev, dtype=dt)  # the v projection's output
        v = v_proj.view(T, Hkv, hd)
        vc = v.transpose(0, 1).contiguous()

        def floor():
            return F.scaled_dot_product_attention(q[None], k[None], vc[None], is_causal=True,
                                                  enable_gqa=True)[0]             # [H, T, hd]

        def engine():
            o = first_chunk_attention(q.transpose(0, 1), k.transpose(0, 1), v)   # [T, H, hd]
            return o.reshape(T, H * hd)

        def v_contiguous():
            o = F.scaled_dot_product_attention(q[None], k[None],
                                               v.transpose(0, 1).contiguous()[None],
                                               is_causal=True, enable_gqa=True)[0]
            return o.transpose(0, 1).reshape(T, H * hd)

        ref = floor().transpose(0, 1).reshape(T, H * hd).float()
        arms = {"floor": floor, "engine": engine, "v-contiguous": v_contiguous}
        if dev.type == "cuda":
            from torch.nn.attention import sdpa_kernel
            for name, be in backends().items():
                def pinned(be=be):
                    with sdpa_kernel([be]):
                        return floor()
                arms[f"floor/{name}"] = pinned

        def check(fn):
            try:
                o = fn()
            except RuntimeError as exc:   # a pinned backend that does not take these inputs
                return f"did not run: {str(exc)[:120]}"
            o = o.transpose(0, 1).reshape(T, H * hd) if o.dim() == 3 else o
            err = ((o.float() - ref).abs().max() / ref.abs().max()).item()
            return None if err < REL else f"normalized error {err:.2e} >= {REL}"

        flops = 2.0 * T * T * H * hd
        for arm, fn in arms.items():
            why = check(fn)
            if why and why.startswith("did not run"):
                print(f"T={T} {arm}: {why}", file=sys.stderr)
                rec.add("skipped", "", "", bound=why, T=T, arm=arm)
                continue
            t = rec.timed(fn, check=lambda fn=fn: check(fn), what=f"T{T}/{arm}")
            cfg = dict(shape=args.shape, T=T, H=H, Hkv=Hkv, hd=hd, arm=arm,
                       command=args.command)
            gate = f"o within {REL} of the floor arm's (normalized max)"
            rec.add_timing(t, flops, gate=gate, **cfg)
        rec.flush()


def summary(rows: list[dict]) -> None:
    for r in rows:
        c = r["config"]
        if r["figure"] == "tflops":
            print(f"[{r['label']}] T={c['T']:<6} {c['arm']:<16} {r['value']:8.1f} TFLOP/s")


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "benchmarks" / "results", warmup=3, repeats=10)
    ap.add_argument("--shape", default="qwen3-30b-a3b")
    ap.add_argument("--T", nargs="*", type=int, default=[8192, 32768])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any device")
    args = ap.parse_args(argv)
    if args.smoke:
        args.T, args.repeats, args.warmup = [37], 2, 1
    elif not torch.cuda.is_available():
        print("sdpa_layout_bench needs a CUDA device; use --smoke to check it on a CPU",
              file=sys.stderr)
        return 2
    args.command = bench.command_line(argv)
    stem = bench.run_stem("sdpa-layout", ROOT, smoke=args.smoke)
    return bench.main(args, "sdpa_layout", measure, script=__file__, argv=argv, stem=stem,
                      summary=summary,
                      plot=lambda rs, p: bench.bars(rs, p, title=f"first-chunk SDPA "
                                                    f"({rs[0]['gpu']})", x_keys=["T", "arm"],
                                                    figures=["tflops"]))


if __name__ == "__main__":
    sys.exit(main())
