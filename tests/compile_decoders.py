"""Compile the test decode kernel for sm_90 (H200) without a GPU: `python compile_decoders.py Q4_K ...`.

Run by tests/test_decode.py in a process with TRITON_INTERPRET=0; exits 1 naming any format that
fails to compile.
"""
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from strata.formats import get_format
import test_decode

SIG = {"w_ptr": "*u8", "out_ptr": "*fp32", "tab_ptr": "*i32", "N": "i32", "K": "i32",
       "row_bytes": "i64", "row0": "i32", "k0": "i32",
       "FMT": "constexpr", "BN": "constexpr", "BK": "constexpr"}


def main(names) -> int:
    failed = []
    for name in names:
        src = ASTSource(fn=test_decode._decode_window_kernel, signature=SIG,
                        constexprs={"FMT": get_format(name).ggml_type, "BN": 64, "BK": 128})
        try:
            triton.compile(src, target=GPUTarget("cuda", 90, 32))
        except Exception as e:  # report every format, then fail
            failed.append(name)
            print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
    if failed:
        print("failed to compile for sm_90:", ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
