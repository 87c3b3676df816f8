"""Compile the fused router kernel for sm_90 on a machine without a GPU (ttir -> cubin) at the
models' expert counts and the tiles router_tile picks, and report its footprint (registers,
spills) and whether the sum over D stays promoted out of the tensor cores (each dot from a zero
accumulator: triton folds `acc + dot(a, b, 0)` back into one dot unless the kernel stops it).

compile_moe.py's pipeline (this folder); pointers and strides get the divisibility-16 hint the
JIT gives real launches (contiguous rows, D a multiple of 16).

    python tests/kernels/compile_router.py          # exit 1 naming any variant that fails
    python tests/kernels/compile_router.py --quick  # qwen3-30b-a3b's and seed-512e's (the suite)
"""
import os
import re
import sys

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402

from compile_attention import ptx_usage  # noqa: E402  (this folder: ptxas -v)
from compile_moe import compile_one  # noqa: E402
from compile_plane import _Text  # noqa: E402  (compile_one's stages kept as text)
from strata.kernels.moe import _router_kernel as k  # noqa: E402
from strata.kernels.moe.router import router_tile  # noqa: E402

ALIGNED = {"x_ptr", "w_ptr", "ids_ptr", "wt_ptr", "stride_xt", "stride_wp", "stride_we"}


def promoted(ttgir: str) -> str:
    """"promoted" when no dot of the kernel accumulates into the loop's running sum (a loop
    block argument, %argN: each D step's dots start from zero, or from the step's earlier
    part), "FOLDED" when triton fed the running sum back into a dot."""
    dots = re.findall(r"(?:warp_group_dot|tt\.dot) (%[\w.]+), (%[\w.]+), (%[\w.]+)", ttgir)
    return "promoted" if dots and not any(c.startswith("%arg") for _, _, c in dots) else "FOLDED"


def variant(E: int, K: int, parts: int, logits: bool = False):
    t = router_tile(E, parts)
    const = dict(K=K, KP=triton.next_power_of_2(K), P=parts, BM=t.block_m,
                 BE=max(16, triton.next_power_of_2(E)), BD=t.block_d, RENORM=True, INTERP=False,
                 LOGITS=logits)
    sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "ids_ptr": "*i64", "wt_ptr": "*fp32", "T": "i32",
           "D": "i32", "E": "i32", "stride_xt": "i32", "stride_wp": "i32", "stride_we": "i32",
           **{c: "constexpr" for c in const}}
    sig = {n: sig[n] for n in k._softmax_topk_fwd_kernel.arg_names if n in sig}
    return sig, const, t


def variants():
    yield "E=128 K=8 bf16 weight", variant(128, 8, 1)       # qwen3-30b-a3b
    yield "E=512 K=8 bf16 weight", variant(512, 8, 1)       # seed-512e
    yield "E=128 K=8 fp32 weight", variant(128, 8, 3)       # an fp32 router, three parts
    yield "E=256 K=8 bf16 weight", variant(256, 8, 1)       # DeepSeek-V3's experts
    yield "E=512 K=8 fp32 weight", variant(512, 8, 3)
    yield "E=8 K=2 bf16 weight", variant(8, 2, 1)           # Mixtral
    yield "E=60 K=4 fp16 weight", variant(60, 4, 2)         # E not a power of two, two parts
    yield "E=256 logits", variant(256, 1, 1, logits=True)   # DeepSeek-V3's sigmoid router's GEMM
    yield "E=128 logits", variant(128, 1, 1, logits=True)   # GPT-OSS's


QUICK = ("E=128 K=8 bf16 weight", "E=512 K=8 bf16 weight")


def main(quick: bool = False) -> int:
    fails = 0
    for what, (sig, const, tile) in variants():
        if quick and what not in QUICK:
            continue
        asm = _Text()
        try:
            compile_one(k._softmax_topk_fwd_kernel, sig, const, tile.num_warps, tile.num_stages,
                        aligned=ALIGNED, asm=asm)
            print(f"ok   {what} BM={tile.block_m} BD={tile.block_d}/w{tile.num_warps}"
                  f"s{tile.num_stages}: {ptx_usage(asm['ptx'])}, {promoted(asm['ttgir'])}")
        except Exception as exc:  # report every variant, then fail
            fails += 1
            print(f"FAIL {what}: {type(exc).__name__}: {str(exc)[:300]}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main("--quick" in sys.argv))
