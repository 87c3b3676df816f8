"""Compile the Gated DeltaNet kernels (strata.kernels.deltanet) for sm_90 on a machine without a
GPU (ttir -> cubin) at Qwen3.5 / Qwen3-Next's shapes and the launchers' tiles, and report their
footprint (registers, spills, which MMA the dots became).

compile_moe.py's pipeline (this folder); pointers and strides get the divisibility-16 hint the
JIT gives real launches (rows contiguous, head dims multiples of 16).

    python tests/kernels/compile_deltanet.py          # exit 1 naming any variant that fails
    python tests/kernels/compile_deltanet.py --quick  # Qwen3.5's two chunk kernels (the suite's)
"""
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from compile_attention import ptx_usage  # noqa: E402  (this folder: ptxas -v)
from compile_moe import compile_one  # noqa: E402
from strata.kernels.deltanet import _chunk_kernel as ck, _norm_kernel as nk  # noqa: E402
from strata.kernels.deltanet.launch import DEFAULT  # noqa: E402
from strata.kernels.deltanet.norms import ROW_ELEMS  # noqa: E402

ALIGNED = {"k_ptr", "v_ptr", "q_ptr", "w_ptr", "u_ptr", "h0_ptr", "o_ptr", "ht_ptr", "x_ptr",
           "z_ptr", "out_ptr", "stride_x", "stride_z", "oi_ptr", "vn_ptr"}
BV, PREC, STAGES, WARPS = DEFAULT.bv, DEFAULT.prec, DEFAULT.stages, DEFAULT.warps


def ordered(fn, sig: dict) -> dict:
    return {n: sig[n] for n in fn.arg_names if n in sig}


def chunk_variants(Hk, Hv, dk, dv, qk="*fp32", v="*bf16", o="*bf16"):
    BK = max(16, triton.next_power_of_2(dk))
    bv = min(BV, max(16, triton.next_power_of_2(dv)))
    dims = dict(HK=Hk, HV=Hv, DK=dk, DV=dv, BT=64, BK=BK, BV=bv, PREC=PREC)
    sig = {"k_ptr": qk, "v_ptr": v, "g_ptr": "*fp32", "beta_ptr": "*bf16", "gc_ptr": "*fp32",
           "w_ptr": "*fp32", "u_ptr": "*fp32", "T": "i32"}
    yield "wy", ck._gdn_wy_fwd_kernel, ordered(ck._gdn_wy_fwd_kernel, sig), dims
    sig = {"q_ptr": qk, "k_ptr": qk, "w_ptr": "*fp32", "u_ptr": "*fp32", "gc_ptr": "*fp32",
           "h0_ptr": "*fp32", "o_ptr": o, "ht_ptr": "*fp32", "oi_ptr": o, "T": "i32",
           "scale": "fp32"}
    const = dict(dims, HAS_H0=True, SPLIT=False)
    yield "state", ck._gdn_state_fwd_kernel, ordered(ck._gdn_state_fwd_kernel, sig), const
    # the split launch (strata.kernels.deltanet.launch): the scan without the intra-chunk part,
    # then the output kernel parallel over chunks
    sig = dict(sig, oi_ptr="*fp32")
    yield ("state-split", ck._gdn_state_fwd_kernel, ordered(ck._gdn_state_fwd_kernel, sig),
           dict(const, SPLIT=True))
    sig = {"q_ptr": qk, "k_ptr": qk, "vn_ptr": "*fp32", "gc_ptr": "*fp32", "oi_ptr": "*fp32",
           "o_ptr": o, "T": "i32", "scale": "fp32"}
    yield "out", ck._gdn_out_fwd_kernel, ordered(ck._gdn_out_fwd_kernel, sig), dims


def norm_variants(N):
    bn = triton.next_power_of_2(N)
    bm = max(1, ROW_ELEMS // bn)
    sig = {"x_ptr": "*bf16", "out_ptr": "*fp32", "n_rows": "i32", "stride_x": "i32",
           "eps": "fp32"}
    yield "l2norm", nk._l2norm_fwd_kernel, sig, dict(N=N, BM=bm, BN=bn)
    sig = {"x_ptr": "*bf16", "z_ptr": "*bf16", "w_ptr": "*fp32", "out_ptr": "*bf16",
           "n_rows": "i32", "stride_x": "i32", "stride_z": "i32", "eps": "fp32"}
    yield ("gated_rms_norm", nk._gated_rms_norm_fwd_kernel, sig,
           dict(N=N, BM=bm, BN=bn, PT=tl.float32, INTERP=False))


def variants():
    # Qwen3.5-35B-A3B and Qwen3-Next-80B-A3B: 16 key heads, 32 value heads, 128 wide
    for what, fn, sig, const in chunk_variants(16, 32, 128, 128):
        yield f"{what} Hk=16 Hv=32 dk=dv=128", fn, sig, const, WARPS
    for what, fn, sig, const in chunk_variants(16, 32, 128, 128, qk="*bf16", o="*fp32"):
        yield f"{what} Hk=16 Hv=32 dk=dv=128 bf16 q/k", fn, sig, const, WARPS
    for what, fn, sig, const in chunk_variants(1, 3, 48, 24):
        yield f"{what} Hk=1 Hv=3 dk=48 dv=24", fn, sig, const, WARPS
    for what, fn, sig, const in norm_variants(128):
        yield f"{what} N=128", fn, sig, const, 4


QUICK = ("wy Hk=16 Hv=32 dk=dv=128", "state Hk=16 Hv=32 dk=dv=128")


def main(quick: bool = False) -> int:
    fails = 0
    for what, fn, sig, const, warps in variants():
        if quick and what not in QUICK:
            continue
        asm = {}
        try:
            compile_one(fn, sig, const, warps, STAGES, aligned=ALIGNED, asm=asm)
            print(f"ok   {what} w{warps}: {ptx_usage(asm['ptx'])}")
        except Exception as exc:  # report every variant, then fail
            fails += 1
            print(f"FAIL {what}: {type(exc).__name__}: {str(exc)[:300]}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main("--quick" in sys.argv))
