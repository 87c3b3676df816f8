"""A later chunk's attention over its prefix by each route the KV can take, at one model's heads,
beside the SDPA rate the compute floor prices attention at.

Legend: T chunk tokens, P prefix tokens, H query heads, Hkv kv heads, hd head width.

Arms (strata.models.kv.PromptKV.attend's choices), each on q [T, H, hd], k, v [T, Hkv, hd] and
one bf16 prefix segment of P tokens, with the model's sinks when it has them (GPT-OSS):
- triton: chunk_attention (strata's kernel; sinks in its last launch).
- flash / cudnn: prefix_flash_attention's blocks (FlashAttention-2's or cuDNN's) merged by
  their log-sum-exp, the sinks folded in after the merge.
- floor: torch SDPA, causal over T + P keys as one call (strata.bench.roofline.sdpa_rate's
  call, no sinks), only where the prefix is empty: the rate the compute floor prices at.
FLOPs: 4·H·hd per query-key pair, T·P + T²/2 pairs (the floor's count). The gate: every arm's
o within REL of the fp32 reference (chunk_attention_torch with the same sinks) on a strided
sample of query rows (normalized max error).

Why: gpt-oss-120b's 131K read under 24 GiB ran at 0.75 of its compute floor, attention 5.55 s
of the 7.47 s floor (H100, 88803cc), its full layers (hd 64, sinks) on chunk_attention, as
prefix_route sends hd < 128 there; this says whether the blocks beat it at hd 64.

    python benchmarks/prefix_route_bench.py                      # GPU: gpt-oss-120b, T 32K
    python benchmarks/prefix_route_bench.py --smoke              # CPU, tiny: checks the script
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from strata import bench
from strata.kernels.attention import KVSegment, chunk_attention_for, chunk_attention_torch
from strata.kernels.attention.flash_prefix import prefix_flash_attention
from strata.shapes import get_preset

ROOT = Path(__file__).resolve().parents[1]
REL = 2e-2
SAMPLE = 256        # query rows the gate checks (strided): the fp32 reference's cost


def measure(args, rec: bench.Recorder) -> None:
    dev = rec.device
    s = get_preset(args.shape)
    H, Hkv, hd = (4, 2, 16) if args.smoke else (s.n_head, s.n_kv_head, s.head_dim)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(0)
    sinks = None
    if args.sinks:
        sinks = (torch.randn(H, generator=gen) * 2 + 3).to(dev)
    T = args.T
    for P in args.P:
        r = lambda *sh: torch.randn(*sh, generator=gen).to(dev, dt)       # noqa: E731
        q, k, v = r(T, H, hd), r(T, Hkv, hd), r(T, Hkv, hd)
        prefix = [KVSegment(r(Hkv, P, hd).transpose(0, 1), r(Hkv, P, hd).transpose(0, 1))] \
            if P else []
        rows = torch.arange(0, T, max(1, T // SAMPLE), device=dev)

        def ref():
            """The fp32 reference's sampled rows (causal within the chunk: a sampled row i
            sees the chunk's keys 0..i, so each row is its own one-query chunk)."""
            out = []
            f = lambda t: t.float()                                       # noqa: E731
            segs = [KVSegment(f(x.k), f(x.v)) for x in prefix]
            for i in rows.tolist():
                seg = segs + [KVSegment(f(k[:i]), f(v[:i]))] if i else segs
                out.append(chunk_attention_torch(f(q[i:i + 1]), f(k[i:i + 1]), f(v[i:i + 1]),
                                                 seg, sinks=sinks))
            return torch.cat(out)

        want = ref()
        triton = chunk_attention_for(q.device)
        arms = {"triton": lambda: triton(q, k, v, prefix, sinks=sinks)}
        for route in ("flash", "cudnn") if dev.type == "cuda" else ("flash",):
            arms[route] = lambda route=route: prefix_flash_attention(q, k, v, prefix,
                                                                     route=route, sinks=sinks)
        if not P and dev.type == "cuda":
            qh, kh, vh = (x.transpose(0, 1).contiguous()[None] for x in (q, k, v))

            def floor():
                return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True,
                                                      enable_gqa=True)[0].transpose(0, 1)
            arms["floor"] = floor

        def check(fn, arm):
            if arm == "floor":
                return None     # no sinks: the rate's call, not the layer's meaning
            got = fn()[rows].float()
            err = ((got - want).abs().max() / want.abs().max()).item()
            return None if err < REL else f"normalized error {err:.2e} >= {REL}"

        flops = 4.0 * H * hd * (T * P + T * T / 2)
        for arm, fn in arms.items():
            t = rec.timed(fn, check=lambda fn=fn, arm=arm: check(fn, arm), what=f"P{P}/{arm}")
            cfg = dict(shape=args.shape, T=T, P=P, H=H, Hkv=Hkv, hd=hd, sinks=bool(args.sinks),
                       arm=arm, command=args.command)
            gate = f"o within {REL} of the fp32 reference on {len(rows)} rows (normalized max)"
            rec.add_timing(t, flops, gate=gate, **cfg)
        rec.flush()


def summary(rows: list[dict]) -> None:
    for r in rows:
        c = r["config"]
        if r["figure"] == "tflops":
            print(f"[{r['label']}] T={c['T']} P={c['P']:<6} {c['arm']:<7} {r['value']:7.1f} "
                  f"TFLOP/s")


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "benchmarks" / "results", warmup=2, repeats=5)
    ap.add_argument("--shape", default="gpt-oss-120b")
    ap.add_argument("--T", type=int, default=32768)
    ap.add_argument("--P", nargs="*", type=int, default=[0, 32768, 65536, 98304])
    ap.add_argument("--no-sinks", dest="sinks", action="store_false",
                    help="leave the sinks out (a model without them)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on any device")
    args = ap.parse_args(argv)
    if args.smoke:
        args.T, args.P, args.repeats, args.warmup = 37, [0, 20], 2, 1
    elif not torch.cuda.is_available():
        print("prefix_route_bench needs a CUDA device; use --smoke to check it on a CPU",
              file=sys.stderr)
        return 2
    args.command = bench.command_line(argv)
    stem = bench.run_stem("prefix-route", ROOT, smoke=args.smoke)
    return bench.main(args, "prefix_route", measure, script=__file__, argv=argv, stem=stem,
                      summary=summary,
                      plot=lambda rs, p: bench.bars(rs, p, title=f"a later chunk's attention by "
                                                    f"route ({rs[0]['gpu']})",
                                                    x_keys=["P", "arm"], figures=["tflops"]))


if __name__ == "__main__":
    sys.exit(main())
