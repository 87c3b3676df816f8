"""Compile the fused norm kernels for sm_90 on a machine without a GPU (ttir -> cubin) at the
models' shapes and the tiles norm_tile picks, and report their footprint (registers, spills).

compile_moe.py's pipeline (this folder); pointers and strides get the divisibility-16 hint the
JIT gives real launches (the models' rows are contiguous, widths multiples of 16).

    python tests/kernels/compile_norm.py          # exit 1 naming any variant that fails
    python tests/kernels/compile_norm.py --quick  # qwen3-30b-a3b's two (the suite's check)
"""
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402

from compile_attention import ptx_usage  # noqa: E402  (this folder: ptxas -v)
from compile_moe import compile_one  # noqa: E402
from strata.kernels import _norm_kernel as k  # noqa: E402
from strata.kernels import _rope_pairs_kernel as rk  # noqa: E402
from strata.kernels import rope_pairs as rp  # noqa: E402
from strata.kernels.norm import norm_tile  # noqa: E402

ROWS_ALIGNED = {"x_ptr", "w_ptr", "out_ptr", "stride_x", "stride_o"}
HEADS_ALIGNED = {"x_ptr", "w_ptr", "cos_ptr", "sin_ptr", "out_ptr", "stride_xt", "stride_xh",
                 "stride_ct", "stride_st"}
# (x, w, out) element types: the bf16 model; an fp16 one with an fp32 weight (fp32 output)
TYPES = [("*bf16", "*bf16", "*bf16"), ("*fp16", "*fp32", "*fp32")]


def ordered(fn, sig: dict) -> dict:
    """`sig` in the kernel's argument order (the divisibility hints are positional)."""
    return {n: sig[n] for n in fn.arg_names if n in sig}


def rows_variant(N: int, types, has_w: bool):
    x, w, o = types
    t = norm_tile(N)
    const = dict(N=N, BM=t.block_m, BN=triton.next_power_of_2(N), HAS_W=has_w, INTERP=False)
    sig = {"x_ptr": x, "w_ptr": w, "out_ptr": o, "n_rows": "i32", "stride_x": "i32",
           "stride_o": "i32", "eps": "fp32", **{c: "constexpr" for c in const}}
    return k._rms_norm_fwd_kernel, ordered(k._rms_norm_fwd_kernel, sig), const, t, ROWS_ALIGNED


def heads_variant(NH: int, HD: int, types, norm: bool, rot: int = 0):
    x, w, o = types
    t = norm_tile(HD)
    const = dict(NH=NH, HD=HD, HB=triton.next_power_of_2(HD // 2), BM=t.block_m, NORM=norm,
                 INTERP=False, ROT=0 if rot in (0, HD) else rot, HF=triton.next_power_of_2(HD))
    sig = {"x_ptr": x, "w_ptr": w, "cos_ptr": "*fp32", "sin_ptr": "*fp32", "out_ptr": o,
           "n_rows": "i32", "stride_xt": "i32", "stride_xh": "i32", "stride_ct": "i32",
           "stride_st": "i32", "eps": "fp32", **{c: "constexpr" for c in const}}
    fn = k._qk_norm_rope_fwd_kernel
    return fn, ordered(fn, sig), const, t, HEADS_ALIGNED


def pairs_variant(R: int, x: str):
    """rope_pairs_'s kernel on MLA's q_pe (strided rows: no alignment hint on the strides)."""
    t = rp.pairs_tile(R)
    const = dict(P=R // 2, PB=triton.next_power_of_2(R // 2), BM=t.block_m, INTERP=False)
    sig = {"x_ptr": x, "cos_ptr": "*fp32", "sin_ptr": "*fp32", "n_rows": "i32", "T": "i32",
           "stride_g": "i32", "stride_t": "i32", "stride_c": "i32", "stride_s": "i32",
           **{c: "constexpr" for c in const}}
    fn = rk._rope_pairs_kernel
    return fn, ordered(fn, sig), const, t, {"cos_ptr", "sin_ptr"}


def variants():
    for N in (2048, 4096, 8192):     # qwen3-30b-a3b's D, larger models' D
        for types in TYPES:
            yield f"rms_norm N={N} {types[0][1:]}/{types[1][1:]}", rows_variant(N, types, True)
    yield "rms_norm N=2048 no weight", rows_variant(2048, TYPES[0], False)
    for NH, HD in ((32, 128), (4, 128), (64, 64)):   # Qwen3's q and k heads, GPT-OSS's q
        for norm in (True, False):
            yield (f"qk_norm_rope NH={NH} HD={HD} norm={norm}",
                   heads_variant(NH, HD, TYPES[0], norm))
    yield "qk_norm_rope NH=32 HD=128 fp16/fp32", heads_variant(32, 128, TYPES[1], True)
    # partial rotary: Qwen3.5 / Qwen3-Next (64 of 256, q 16 / 32 heads, k 2), MiniMax-M2 (64 of
    # 128, no per-head norm), GLM-4.5-Air (64 of 128, 96 heads)
    for NH, HD, R, norm in ((16, 256, 64, True), (2, 256, 64, True), (48, 128, 64, False),
                            (96, 128, 64, True)):
        yield (f"qk_norm_rope NH={NH} HD={HD} rot={R} norm={norm}",
               heads_variant(NH, HD, TYPES[0], norm, R))


    for R, x in ((64, "*bf16"), (64, "*fp32"), (8, "*bf16")):   # DeepSeek-V3's R, a tiny one
        yield f"rope_pairs R={R} {x[1:]}", pairs_variant(R, x)


QUICK = ("rms_norm N=2048 bf16/bf16", "qk_norm_rope NH=32 HD=128 norm=True",
         "qk_norm_rope NH=16 HD=256 rot=64 norm=True", "rope_pairs R=64 bf16")


def main(quick: bool = False) -> int:
    fails = 0
    for what, (fn, sig, const, tile, aligned) in variants():
        if quick and what not in QUICK:
            continue
        asm = {}
        try:
            # the pair kernel launches without fp fusion (rope_pairs: the twin's roundings)
            opts = {"enable_fp_fusion": False} if fn is rk._rope_pairs_kernel else None
            compile_one(fn, sig, const, tile.num_warps, 1, aligned=aligned, asm=asm,
                        options=opts)
            print(f"ok   {what} BM={tile.block_m}/w{tile.num_warps}: {ptx_usage(asm['ptx'])}")
        except Exception as exc:  # report every variant, then fail
            fails += 1
            print(f"FAIL {what}: {type(exc).__name__}: {str(exc)[:300]}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main("--quick" in sys.argv))
