"""Compile the log-sum-exp merge kernel (strata.kernels.attention._merge_kernel) for sm_90 on a
machine without a GPU (ttir -> cubin) at MLA's value widths and merge_tile's tiles, and report
its footprint (registers, spills: triton's ptxas -v).

compile_moe.py's pipeline (this folder); pointers and strides get the divisibility-16 hint the
JIT gives real launches (the state's rows and the kernels' outputs are 16-aligned at these
widths).

    python tests/kernels/compile_merge.py          # every width x o dtype x FIRST
    python tests/kernels/compile_merge.py --quick  # DeepSeek-V3's 128, bf16, both FIRSTs (the
                                                   # suite's check)
"""
import itertools
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402

from compile_attention import ptx_usage  # noqa: E402  (this folder: ptxas -v)
from compile_moe import compile_one  # noqa: E402
from strata.kernels.attention import _merge_kernel as k  # noqa: E402
from strata.kernels.attention.merge import merge_tile  # noqa: E402

ALIGNED = {"acc_ptr", "lse_ptr", "o_ptr", "lb_ptr", "stride_oh", "stride_on", "stride_lh"}


class _Text(dict):
    def __setitem__(self, key, value):
        super().__setitem__(key, value if isinstance(value, (str, bytes)) else str(value))


def main(argv) -> int:
    quick = "--quick" in argv
    widths, dtypes = ([128], ["*bf16"]) if quick else ([16, 128, 192, 512], ["*bf16", "*fp16",
                                                                             "*fp32"])
    fails = 0
    for D, ot, first in itertools.product(widths, dtypes, (False, True)):
        t = merge_tile(D)
        const = dict(D=D, BM=t.block_m, BD=triton.next_power_of_2(D), FIRST=first)
        sig = {"acc_ptr": "*fp32", "lse_ptr": "*fp32", "o_ptr": ot, "lb_ptr": "*fp32",
               "n_rows": "i32", "n": "i32", "stride_oh": "i32", "stride_on": "i32",
               "stride_lh": "i32"}
        asm = _Text()
        what = f"merge D={D} o={ot[1:]} first={first}"
        try:
            compile_one(k._lse_merge_kernel, sig, const, t.num_warps, 1, aligned=ALIGNED,
                        asm=asm)
            print(f"ok   {what}: {ptx_usage(asm['ptx'])}")
        except Exception as exc:  # noqa: BLE001 - reported, counted
            fails += 1
            print(f"FAIL {what}: {str(exc)[:200]}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
