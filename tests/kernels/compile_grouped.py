"""Compile the grouped decoded FFN's kernels (silu_mul, scatter_rows, combine_sorted) for sm_90
on a machine without a GPU (ttir -> cubin) and report their footprint (registers, spills: ptxas -v).

compile_moe.py's pipeline (this folder); args get the divisibility-16 hints the JIT gives real
launches (bf16 rows of F, fp32 rows of D, F and D multiples of 16 at every real shape).

    python tests/kernels/compile_grouped.py        # each at its GPU tile (combine_sorted: both
                                                   # sides of MASK and of ADD once)
"""
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

from compile_attention import ptx_usage  # noqa: E402  (this folder: ptxas -v)
from compile_moe import compile_one  # noqa: E402
import strata.kernels.moe._grouped_kernel as gk  # noqa: E402

KERNELS = {
    "silu_mul": (gk._silu_mul_kernel,
                 {"g_ptr": "*bf16", "u_ptr": "*bf16", "stride_gu": "i32", "h_ptr": "*bf16",
                  "stride_h": "i32", "n_valid_ptr": "*i32", "F": "i32"},
                 {"g_ptr", "u_ptr", "stride_gu", "h_ptr", "stride_h", "F"},
                 dict(BR=8, BC=256, INTERP=False)),
    "scatter_rows": (gk._scatter_kernel,
                     {"yd_ptr": "*bf16", "stride_yd": "i32", "order_ptr": "*i64",
                      "tw_ptr": "*fp32", "yk_ptr": "*fp32", "stride_yk": "i32",
                      "n_valid_ptr": "*i32", "D": "i32"},
                     {"yd_ptr", "stride_yd", "order_ptr", "tw_ptr", "yk_ptr", "stride_yk", "D"},
                     dict(BR=8, BC=256)),
}
_SORTED_SIG = {"yd_ptr": "*bf16", "stride_yd": "i32", "inv_ptr": "*i64", "tw_ptr": "*fp32",
               "ids_ptr": "*i64", "stride_it": "i32", "stride_ik": "i32", "out_ptr": "*fp32",
               "stride_ot": "i32", "T": "i32", "D": "i32"}
_SORTED_ALIGNED = {"yd_ptr", "stride_yd", "inv_ptr", "tw_ptr", "ids_ptr", "out_ptr", "stride_ot",
                   "D"}
for _mask, _add in ((True, False), (False, True)):   # combine_tile's GPU tile, qwen3's K 8
    KERNELS[f"combine_sorted mask={_mask} add={_add}"] = (
        gk._combine_sorted_kernel, dict(_SORTED_SIG, out_ptr="*fp32" if _add else "*bf16"),
        _SORTED_ALIGNED, dict(TOPK=8, MASK=_mask, ADD=_add, BT=4, BD=512, INTERP=False))


class _Text(dict):
    def __setitem__(self, key, value):
        super().__setitem__(key, value if isinstance(value, (str, bytes)) else str(value))


def main(argv) -> int:
    fails = 0
    for name, (fn, sig, aligned, const) in KERNELS.items():
        asm = _Text()
        try:
            compile_one(fn, sig, const, 4, 1, aligned=aligned, asm=asm)
            print(f"ok   {name}: {ptx_usage(asm['ptx'])}")
        except Exception as exc:  # noqa: BLE001 - reported, counted
            fails += 1
            print(f"FAIL {name}: {str(exc)[:200]}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
