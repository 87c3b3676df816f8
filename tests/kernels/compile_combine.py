"""Compile the expert FFN's combine kernel for sm_90 on a machine without a GPU (ttir -> cubin) and
report each variant's footprint (registers, spills: triton's ptxas -v).

compile_moe.py's pipeline (this folder); args get the divisibility-16 hints the JIT gives real
launches (yk rows of D fp32, D a multiple of 16).

    python tests/kernels/compile_combine.py           # MASK x ADD at the default GPU tile, K = 8
    python tests/kernels/compile_combine.py --quick   # (mask, bf16) and (all, add): each side of
                                                      # each constexpr once (the suite's check)
"""
import itertools
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

from compile_attention import ptx_usage  # noqa: E402  (this folder: ptxas -v)
from compile_moe import compile_one  # noqa: E402
import strata.kernels.moe._combine_kernel as ck  # noqa: E402
from strata.kernels.moe.combine import CombineTile  # noqa: E402

SIG = {"yk_ptr": "*fp32", "stride_yk": "i32", "ids_ptr": "*i64", "stride_it": "i32",
       "stride_ik": "i32", "out_ptr": "*fp32", "stride_ot": "i32", "T": "i32", "D": "i32"}
ALIGNED = {"yk_ptr", "stride_yk", "ids_ptr", "out_ptr", "stride_ot", "D"}


class _Text(dict):
    def __setitem__(self, key, value):
        super().__setitem__(key, value if isinstance(value, (str, bytes)) else str(value))


def main(argv) -> int:
    tile = CombineTile(4, 512)   # combine_tile's GPU choice
    fails = 0
    variants = ([(True, False), (False, True)] if "--quick" in argv
                else list(itertools.product((False, True), (False, True))))
    for mask, add in variants:
        sig = dict(SIG, out_ptr="*fp32" if add else "*bf16")
        const = dict(TOPK=8, MASK=mask, ADD=add, BT=tile.BLOCK_T, BD=tile.BLOCK_D, INTERP=False)
        asm = _Text()
        try:
            compile_one(ck._combine_fwd_kernel, sig, const, tile.num_warps, 1, aligned=ALIGNED,
                        asm=asm)
            print(f"ok   combine mask={mask} add={add}: {ptx_usage(asm['ptx'])}")
        except Exception as exc:  # noqa: BLE001 - reported, counted
            fails += 1
            print(f"FAIL combine mask={mask} add={add}: {str(exc)[:200]}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
