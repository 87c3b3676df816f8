"""Whether cuDNN's attention takes MLA's head widths as they are, and how fast: one causal
launch over T tokens of H heads, q/k of width dq and values of dv, bf16, through torch's
`_scaled_dot_product_cudnn_attention` (what strata.models.mla_attend.attend_block_cudnn calls),
beside FlashAttention-2 where its one width fits (dq == dv: MLA's V padded to 192).

Legend: T tokens, H heads, dq the q/k width (DeepSeek-V3: 128 + 64), dv the value width.
Figures (strata.bench.Recorder's long rows: commit, GPU, gate, timer): ms per launch and the
TFLOP/s of the causal product, H·T²·(dq + dv) (half of 2·T²·H·(dq + dv): the mask's half), each
timed only after o passes its check against fp32 SDPA on two heads (bf16 bound 2e-2 of max |o|);
a width a kernel refuses is an `error` row. Writes cudnn_mla_probe-GPU.csv under --out.

    python3 benchmarks/cudnn_mla_probe.py --tokens 4096,8192,32768 --out DIR   # GPU only
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from strata.bench import GateRefused, Recorder, record
from strata.errors import StrataError

WIDTHS = ((192, 128), (192, 192), (128, 128))   # MLA's own, V padded to q/k, plain hd 128
REL = 2e-2


def arms(q, k, v, scale):
    """(name, launch) of each kernel that takes these widths."""
    yield "cudnn", lambda: torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, True, False, scale=scale)[0]
    if q.shape[-1] == v.shape[-1]:
        T = q.shape[2]
        yield "flash", lambda: torch.ops.aten._flash_attention_forward(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, None, T, T, 0.0,
            True, False, scale=scale)[0].transpose(1, 2)


def probe(rec: Recorder, H: int, T: int, dq: int, dv: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(T + dq + dv)
    q, k = (torch.randn(1, H, T, dq, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    v = torch.randn(1, H, T, dv, device="cuda", dtype=torch.bfloat16, generator=g)
    scale, cfg = dq ** -0.5, dict(T=T, H=H, dq=dq, dv=dv)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[:, :2].float(), k[:, :2].float(), v[:, :2].float(), is_causal=True, scale=scale)
    what = f"o vs fp32 SDPA, 2 heads, < {REL} of max |o|"
    for name, run in arms(q, k, v, scale):
        try:
            run()
        except RuntimeError as e:    # a width the kernel does not take: said, not timed
            rec.add("error", str(e).splitlines()[0][:160], "", arm=name, **cfg)
            continue

        def check(run=run):
            err = float((run()[:, :2].float() - ref).abs().max() / ref.abs().max())
            return True if err < REL else f"error {err:.3g} of max |o|"
        t = rec.timed(run, check=check, what=what)
        rec.add_timing(t, H * T * T * (dq + dv), gate=what, arm=name, **cfg)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="4096,8192,32768")
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--out", type=Path, default=Path("."))
    a = ap.parse_args(argv)
    try:
        if not torch.cuda.is_available():
            raise StrataError("cudnn_mla_probe times cuDNN's attention: it needs a CUDA GPU")
        tokens = [int(t) for t in a.tokens.split(",") if t]
        if not tokens or min(tokens) < 1 or a.heads < 1:
            raise StrataError(f"--tokens and --heads take positive ints, got {a.tokens!r}, "
                              f"{a.heads}")
        rec = Recorder("cudnn_mla_probe", warmup=1, repeats=5)
        for T in tokens:
            for dq, dv in WIDTHS:
                probe(rec, a.heads, T, dq, dv)
        for r in rec.rows:
            c = r["config"]
            value = r["value"] if r["figure"] == "error" else f"{r['value']:.4g} {r['unit']}"
            print(f"{c['arm']:6s} T={c['T']:6d} dq={c['dq']} dv={c['dv']}: {r['figure']} "
                  f"{value}")
        path = record.write_csv(rec.rows, a.out / f"cudnn_mla_probe-"
                                f"{record.gpu_name().replace(' ', '_')}.csv")
        print(f"wrote {path}")
    except (StrataError, GateRefused, ValueError, OSError) as e:
        print(f"cudnn_mla_probe: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
