"""Compile the expert-grouping kernels (strata.kernels.moe._group_kernel) for sm_90 on a machine
without a GPU (ttir -> cubin) at the launcher's constexprs for qwen3-30b-a3b (E 128) and
seed-512e (E 512), and report their footprint (registers, spills).

compile_moe.py's pipeline (this folder).

    python tests/kernels/compile_group.py          # exit 1 naming any variant that fails
"""
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402

from compile_attention import ptx_usage  # noqa: E402  (this folder: ptxas -v)
from compile_moe import compile_one  # noqa: E402
from compile_plane import _Text  # noqa: E402
from strata.kernels.moe import _group_kernel as g  # noqa: E402


def variants():
    for E in (128, 512):
        NB = triton.next_power_of_2(E + 2)
        yield (f"count E={E}", g._group_count_kernel,
               {"ids_ptr": "*i64", "n": "i32", "E": "i32", "hist_ptr": "*i32",
                "sorted_ptr": "*i32", "rows": "i32", "fill_per": "i32"},
               dict(C=1024, NB=NB), 4)
        yield (f"scan E={E}", g._group_scan_kernel,
               {"hist_ptr": "*i32", "n_chunks": "i32", "E": "i32", "BM": "i32",
                "max_blocks": "i32", "counts_ptr": "*i64", "padded_ptr": "*i64",
                "block_expert_ptr": "*i32", "n_dev_ptr": "*i32"},
               dict(NB=NB, PC=max(1, 8192 // NB), BB=max(16, 8192 // NB)), 8)
        yield (f"place E={E}", g._group_place_kernel,
               {"ids_ptr": "*i64", "n": "i32", "E": "i32", "hist_ptr": "*i32",
                "padded_ptr": "*i64", "sorted_ptr": "*i32"},
               dict(C=1024, NB=NB), 4)


def main() -> int:
    fails = 0
    for what, fn, sig, const, warps in variants():
        asm = _Text()
        try:
            compile_one(fn, sig, const, warps, 1, aligned=set(), asm=asm)
            print(f"ok   {what}: {ptx_usage(asm['ptx'])}")
        except Exception as exc:  # report every variant, then fail
            fails += 1
            print(f"FAIL {what}: {type(exc).__name__}: {str(exc)[:300]}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
