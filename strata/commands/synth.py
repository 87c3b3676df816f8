"""`strata synth --preset NAME --quant TYPE -o model.gguf`: a random model (GGUF or pack), laid out
as llama.cpp lays its architecture out (tiny-<arch> presets for every architecture).

`--mix Q4_K_M` (Q5_K_M, Q3_K_M, Q2_K, IQ4_XS; MXFP4_MOE, gpt-oss's) lays the model out as
llama.cpp's stock mix does: per-layer expert types and every dense tensor's type by llama.cpp's
rules (strata.packs.mixes).

Written to a temp file beside OUT and renamed when whole; an existing OUT of another kind (a pack
when writing a GGUF, or the other way round) is refused unless --force."""
from __future__ import annotations

import sys

from strata.commands._args import positive


def add_parser(sub):
    p = sub.add_parser("synth", help="write a random model of any architecture as GGUF (or a "
                                     "pack)",
                       description=__doc__)
    p.add_argument("--preset", required=True, help="model shape (strata.shapes.PRESETS)")
    p.add_argument("--quant", default=None, help="expert format (default Q8_0)")
    p.add_argument("--mix", default=None,
                   help="a llama.cpp stock mix for every tensor: Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, "
                        "IQ4_XS, MXFP4_MOE (instead of --quant)")
    p.add_argument("--imatrix", action="store_true",
                   help="with --mix: the layout an importance-matrix quantization gets (IQ4_XS "
                        "keeps ffn_down in IQ4_XS on the first eighth of layers)")
    for m in ("gate", "up", "down"):
        p.add_argument(f"--quant-{m}", default=None, help=f"format of the {m} matrices (default --quant)")
    p.add_argument("-o", "--out", required=True, help="output .gguf (or a pack with --pack)")
    p.add_argument("--layers", type=positive("--layers"), default=None,
                   help="keep only the first N layers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dense-type", default="BF16", choices=["BF16", "F16", "F32"],
                   help="type of the attention/embedding/LM-head matrices (norms, router: F32)")
    p.add_argument("--pack", action="store_true",
                   help="write a pack directly instead of a GGUF (any format, Q2_0 included)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing OUT (or --hits-csv) of another kind")
    p.add_argument("--report-hits", action="store_true",
                   help="afterwards, route random tokens and print each layer's expert hit fraction")
    p.add_argument("--hits-tokens", type=positive("--hits-tokens"), default=2048,
                   help="tokens for --report-hits (T)")
    p.add_argument("--hits-csv", default=None, help="also write the per-layer report as CSV")
    return p


def run(args) -> int:
    from strata import filekind
    from strata.atomic import check_output
    from strata.errors import StrataError
    from strata.packs.synth import ExpertFormats, Mix, synth_gguf, synth_pack
    from strata.shapes import get_preset
    shape = get_preset(args.preset)
    if args.layers is not None:
        shape = shape.with_(n_layer=args.layers)
    if args.mix is not None:
        if any(q is not None for q in (args.quant, args.quant_gate, args.quant_up, args.quant_down)):
            raise StrataError("--mix sets every tensor's type; drop --quant/--quant-gate/--quant-up/"
                              "--quant-down, or drop --mix")
        fmts = Mix.stock(args.mix, shape, imatrix=args.imatrix)
        desc = f"{fmts.name} mix (" + ", ".join(sorted({f"{f.gate}/{f.up}/{f.down}"
                                                        for f in fmts.experts})) + ")"
    else:
        if args.imatrix:
            raise StrataError("--imatrix only changes a --mix layout; give --mix too")
        fmts = ExpertFormats.of(args.quant or "Q8_0", args.quant_gate, args.quant_up,
                                args.quant_down)
        desc = f"{fmts.gate}/{fmts.up}/{fmts.down}"
    out = check_output(args.out, "-o", kind=filekind.PACK if args.pack else filekind.GGUF,
                       force=args.force)
    csv = None
    if args.hits_csv:
        if not args.report_hits:
            raise StrataError("--hits-csv writes the --report-hits table: add --report-hits")
        csv = check_output(args.hits_csv, "--hits-csv", kind=filekind.OTHER, inputs=[out],
                           force=args.force)
    try:
        if args.pack:
            out = synth_pack(out, shape, fmts, args.seed, args.dense_type)
        else:
            out = synth_gguf(out, shape, fmts, args.seed, args.dense_type)
    except OSError as e:   # a full disk: the writer removed its partial file
        from strata.atomic import os_error_line
        raise StrataError(os_error_line(e, out)) from None
    print(f"{out}: {shape.n_layer} layers, E={shape.n_expert}, experts {desc}")
    if args.report_hits:
        report_hits(out, shape, args.hits_tokens, args.seed, csv)
    return 0


def report_hits(path, shape, T: int, seed: int, csv_path=None) -> list[float]:
    import torch

    from strata.atomic import atomic_write
    from strata.engine.route_trace import route_trace
    ids = torch.randint(0, shape.vocab, (T,), generator=torch.Generator().manual_seed(seed))
    tr = route_trace(path, ids)  # a GGUF: fp32 on the CPU; a pack: the default device
    fr = tr.hit_fractions(shape.n_expert)
    print(f"expert hit fraction per layer, T={T} random tokens, K={shape.top_k}, E={shape.n_expert}:")
    rms = tr.resid_rms or [float("nan")] * len(fr)
    for i, (f, r) in enumerate(zip(fr, rms)):
        print(f"  layer {i:3d}: {f:6.3f} of experts hit   residual RMS {r:7.3f}")
    print(f"  min {min(fr):.3f}  mean {sum(fr) / len(fr):.3f}", file=sys.stdout)
    if csv_path:
        with atomic_write(csv_path) as tmp, open(tmp, "w") as f:
            f.write("layer,tokens,top_k,n_expert,hit_fraction,resid_rms\n")
            for i, (h, r) in enumerate(zip(fr, rms)):
                f.write(f"{i},{T},{shape.top_k},{shape.n_expert},{h:.6f},{r:.6f}\n")
    return fr
