"""strata's chunked gated delta rule beside flash-linear-attention's (fla-core) on the same inputs:
time, peak device memory and the distance of each to the fp64 recurrence (issue 38 item 2).

Legend: T tokens, Hk / Hv key / value heads, dk / dv head dims (Qwen3.5's linear-attention
layer: 16 / 32 heads of 128, bf16 q/k/v, fp32 state).

    PYTHONPATH=. python experiments/deltanet_fla.py --out DIR             # GPU
    PYTHONPATH=. python experiments/deltanet_fla.py --smoke --out DIR     # CPU interpreter, tiny
    ... --arms strata "strata[split]" "strata[split,prec=tf32]" fla-core  # launches side by side

An arm "strata[SPEC]" runs strata's rule under pin_delta_launch(DeltaLaunch.parse(SPEC))
(strata.kernels.deltanet.launch: split, prec, bv, warps, stages, backend; backend=strata unless
the spec names one: auto would hand a bf16 read to fla-core); "strata" the default kernels; "strata[backend=fla]" fla-core's kernels as strata's engine launches them (on buffers of
the plan's count, strata.kernels.deltanet.fla_rule; it runs in the interpreter too).

"fla-core" is fla-core's own chunk_gated_delta_rule (its wrapper allocates for itself and
autotunes through a GPU driver: CUDA only). fla-core is strata's optional extra
(pip install 'strata[fla]': fla-core 0.6.0, einops); without it only the other rows are
written. Figures per T and implementation: ms (cuda events, median of 20 after 5 warm-ups),
tokens/s, peak MiB above the inputs (torch.cuda.max_memory_allocated), and at T <= 2048 the
largest |o - fp64| and |S - fp64| (strata's own bound is held by tests/kernels/
test_deltanet_chunk.py; here the two are only set side by side). One long-format CSV and a PNG
(strata.bench.record / plot) named with the GPU and the commit.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

from strata.bench.plot import bars
from strata.bench.record import commit_of, gpu_name, utc_now, write_csv
from strata.bench.timing import time_fn
from strata.kernels.deltanet import chunk_gated_delta_rule
from strata.kernels.deltanet.launch import DeltaLaunch, pin_delta_launch

ROOT = Path(__file__).resolve().parents[1]


def inputs(T, Hk, Hv, dk, dv, dtype, device, seed=0):
    """q, k [T, Hk, dk], v [T, Hv, dv] in dtype; g [T, Hv] fp32 log-decay (<= 0), beta [T, Hv]
    in (0, 1), h0 [Hv, dk, dv] fp32: the ranges Qwen3.5's gates produce."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)                          # noqa: E731
    q, k, v = r(T, Hk, dk).to(dtype), r(T, Hk, dk).to(dtype), r(T, Hv, dv).to(dtype)
    g = -torch.rand(T, Hv, generator=gen) * 0.5
    beta = torch.rand(T, Hv, generator=gen)
    h0 = r(Hv, dk, dv) * 0.1
    return [x.to(device) for x in (q, k, v, g, beta, h0)]


def fla_rule():
    """fla-core's chunk_gated_delta_rule as (q, k, v, g, beta, h0) -> (o [T, Hv, dv], S), or
    None where it does not import (not installed, or no GPU driver for its Triton)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    except Exception as e:                      # noqa: BLE001 (RuntimeError: no driver)
        print(f"deltanet_fla: fla-core not usable here ({type(e).__name__}: {e})",
              file=sys.stderr)
        return None

    def run(q, k, v, g, beta, h0):
        o, S = fla_chunk(q[None], k[None], v[None], g[None], beta[None], initial_state=h0[None],
                         output_final_state=True, use_qk_l2norm_in_kernel=True)
        return o[0], S[0]
    return run


def strata_rule(launch):
    """strata's chunk rule under `launch` (pinned around each call)."""
    def run(q, k, v, g, beta, h0):
        with pin_delta_launch(launch):
            return chunk_gated_delta_rule(q, k, v, g, beta, h0, use_qk_l2norm=True)
    return run


def truth(q, k, v, g, beta, h0):
    """The recurrence in fp64 on the CPU (L2-normed q, k; the dk^-1/2 scale): o [T, Hv, dv],
    S [Hv, dk, dv]. (strata.kernels.deltanet.naive holds the same in fp32, the twins' dtype.)"""
    d = lambda x: x.detach().cpu().double()                                 # noqa: E731
    qd, kd, vd, gd, bd = (d(x) for x in (q, k, v, g, beta))
    T, Hk, dk = qd.shape
    Hv = vd.shape[1]
    qd = qd * torch.rsqrt((qd * qd).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
    kd = kd * torch.rsqrt((kd * kd).sum(-1, keepdim=True) + 1e-6)
    qd, kd = (x.repeat_interleave(Hv // Hk, dim=1) for x in (qd, kd))      # [T, Hv, dk]
    S = d(h0).clone()
    o = torch.empty(T, Hv, vd.shape[2], dtype=torch.double)
    for t in range(T):
        S = S * gd[t].exp()[:, None, None]
        delta = (vd[t] - torch.einsum("hkv,hk->hv", S, kd[t])) * bd[t][:, None]
        S = S + kd[t][:, :, None] * delta[:, None, :]
        o[t] = torch.einsum("hkv,hk->hv", S, qd[t])
    return o, S


def measure(name, fn, x, T, ref, device):
    row = {"impl": name, "T": T}
    figs = {}
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn(*x)
        torch.cuda.synchronize()
        figs["peak above inputs"] = ((torch.cuda.max_memory_allocated() - base) / 2**20, "MiB")
    t = time_fn(lambda: fn(*x), device=device, warmup=5 if device.type == "cuda" else 1,
                repeats=20 if device.type == "cuda" else 2)
    figs["time"] = (t.median_ms, "ms")
    figs["tokens/s"] = (T / t.median_s, "tok/s")
    if ref is not None:
        o, S = fn(*x)
        figs["max |o - fp64|"] = (float((o.double().cpu() - ref[0]).abs().max()), "abs")
        figs["max |S - fp64|"] = (float((S.double().cpu() - ref[1]).abs().max()), "abs")
    return row, figs, t.timer


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, nargs="+", default=[512, 1024, 2048, 8192, 32768])
    ap.add_argument("--heads", default="16,32,128,128", help="Hk,Hv,dk,dv")
    ap.add_argument("--truth-max", type=int, default=2048,
                    help="compare with the fp64 recurrence up to this T (it runs on the CPU)")
    ap.add_argument("--arms", nargs="+", default=["strata", "fla-core"],
                    help='"strata", "strata[SPEC]" (a DeltaLaunch spec), "fla-core"')
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    a = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not a.smoke else "cpu")
    Hk, Hv, dk, dv = map(int, a.heads.split(","))
    Ts = a.T
    if a.smoke:
        Hk, Hv, dk, dv, Ts = 1, 2, 16, 16, [70, 130]
    impls = {}
    for arm in a.arms:
        if arm == "fla-core":
            theirs = fla_rule() if device.type == "cuda" else None
            if theirs is not None:
                impls[arm] = theirs
        elif arm == "strata" or (arm.startswith("strata[") and arm.endswith("]")):
            spec = arm[7:-1] if arm != "strata" else ""
            launch = DeltaLaunch.parse(spec)
            impls[arm] = strata_rule(launch if "backend" in spec
                                     else replace(launch, backend="strata"))
        else:
            raise SystemExit(f"deltanet_fla: unknown arm {arm!r} (strata, strata[SPEC], "
                             f"fla-core)")
    gpu, commit = gpu_name(), commit_of(ROOT)
    rows = []
    for T in Ts:
        x = inputs(T, Hk, Hv, dk, dv, torch.bfloat16 if device.type == "cuda" else torch.float32,
                   device)
        ref = truth(*x) if T <= a.truth_max else None
        for name, fn in impls.items():
            cfg, figs, timer = measure(name, fn, x, T, ref, device)
            cfg.update(Hk=Hk, Hv=Hv, dk=dk, dv=dv)
            line = " ".join(f"{f} {v:.4g} {u}" for f, (v, u) in figs.items())
            print(f"[deltanet] {name} T={T}: {line}", flush=True)
            for f, (v, u) in figs.items():
                rows.append(dict(experiment="deltanet_fla", label=name, gpu=gpu, commit=commit,
                                 timestamp=utc_now(), torch=torch.__version__,
                                 triton=__import__("triton").__version__, config=cfg, figure=f,
                                 value=v, unit=u, bound="", bound_value=None, gate="",
                                 timer=timer if f in ("time", "tokens/s") else ""))
        del x
    tag = "smoke" if a.smoke else f"{gpu.replace(' ', '_')}-{commit}"
    csv = write_csv(rows, a.out / f"deltanet_fla-{tag}.csv")
    png = bars(rows, a.out / f"deltanet_fla-{tag}.png", x_keys=["T"],
               figures=["tokens/s", "peak above inputs"] if device.type == "cuda" else
               ["tokens/s"],
               title=f"gated delta rule, Hk {Hk} Hv {Hv} dk {dk} dv {dv}: strata vs fla-core "
                     f"({gpu}, {commit})")
    print(f"wrote {csv} and {png}")
    return 0 if all(math.isfinite(r["value"]) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
