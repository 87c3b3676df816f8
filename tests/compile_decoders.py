"""Compile the decode kernels for sm_90 (H200) without a GPU: `python compile_decoders.py Q4_K ...`.

Every format named: strata.kernels.dequantize's kernel (strata.kernels._dequant_kernel), bf16
out, both decode paths (RUNS 0 and 1), and for the super-block formats the decode-once kernel's
super-block word path at the default tile (aligned where the format's blocks can be, else
through word pairs; tests/kernels/compile_moe.py compiles every variant of that kernel).
The first format named of each decoder family (strata.kernels.decode.FAMILIES) also takes every
other variant: the test-only window kernel (decode_tile and decode_tile_runs) and the dequant
kernel's fp32 and fp16 outputs. A format's own code is its family's decode functions and its
traits, which the bf16 dequant compile reaches on both paths; the output dtype and the window
kernel are the same code for every format of a family, so compiling them once a family keeps
what a type error could hide in while the test compiles ~90 kernels instead of ~210 (~100 s of
a fresh CI run's Triton compiles before).

Run by tests/test_decode.py in a process with TRITON_INTERPRET=0; exits 1 naming any format that
fails to compile.
"""
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from strata.formats import get_format
from strata.kernels import _dequant_kernel
from strata.kernels.moe import _expert_dequant_kernel
from strata.kernels.decode import FAMILIES, format_traits
from strata.kernels.decode.superblocks import SUPERBLOCK_FORMATS
from strata.kernels.moe.tiles import DEFAULT_SUPERBLOCK_TILE
import test_decode

SIG = {"w_ptr": "*u8", "out_ptr": "*fp32", "tab_ptr": "*i32", "N": "i32", "K": "i32",
       "row_bytes": "i64", "row0": "i32", "k0": "i32",
       "FMT": "constexpr", "BN": "constexpr", "BK": "constexpr", "RUNS": "constexpr"}
DEQUANT_SIG = {"w_ptr": "*u8", "out_ptr": "*fp32", "tab_ptr": "*i32", "N": "i32", "K": "i32",
               "row_bytes": "i64", "FMT": "constexpr", "OUT": "constexpr", "INTERP": "constexpr",
               "BN": "constexpr", "BK": "constexpr", "RUNS": "constexpr"}
OUT_PTR = {0: "*fp32", 1: "*bf16", 2: "*fp16"}
EXPERT_SIG = {"arena_ptr": "*u8", "slot_ptr": "*i64", "dst_slot_ptr": "*i64", "mat_off": "i32",
              "row_bytes": "i32", "dst_ptr": "*u8", "dst_off": "i32", "tab_ptr": "*i32",
              "R": "i32", "C": "i32", "FMT": "constexpr", "BN": "constexpr", "BK": "constexpr",
              "INTERP": "constexpr", "WORDS": "constexpr", "SUPER": "constexpr",
              "ALIGNED": "constexpr"}


def family(name) -> str:
    """The family module whose traits bundle decodes `name`."""
    t = format_traits(name)
    return next(m.__name__ for m in FAMILIES if any(v is t for v in vars(m).values()))


def sources(name, every: bool):
    """The kernels compiled for `name`: every variant when `every` (the first of its family),
    else the bf16 dequant on both paths and the super-block path."""
    fmt = format_traits(name)
    for runs in (False, True) if every else ():
        yield f"window-runs{int(runs)}", ASTSource(
            fn=test_decode._decode_window_kernel, signature=SIG,
            constexprs={"FMT": fmt, "BN": 64, "BK": 128, "RUNS": runs})
    for out, ptr in OUT_PTR.items():
        if not every and ptr != "*bf16":
            continue
        sig = dict(DEQUANT_SIG, out_ptr=ptr)
        for runs in (False, True):
            yield f"dequant-out{out}-runs{int(runs)}", ASTSource(
                fn=_dequant_kernel._dequant_kernel, signature=sig,
                constexprs={"FMT": fmt, "OUT": out, "INTERP": False, "BN": 8, "BK": 512,
                            "RUNS": runs})
    if name in SUPERBLOCK_FORMATS:
        rows, nsb = DEFAULT_SUPERBLOCK_TILE
        aligned = get_format(name).block_bytes % 4 == 0
        yield f"expert-superblocks-aligned{int(aligned)}", ASTSource(
            fn=_expert_dequant_kernel._dequant_fwd_kernel, signature=EXPERT_SIG,
            constexprs={"FMT": fmt, "BN": rows, "BK": 256 * nsb, "INTERP": False, "WORDS": False,
                        "SUPER": True, "ALIGNED": aligned})


def main(names) -> int:
    failed, seen = [], set()
    for name in names:
        fam = family(name)
        every, _ = fam not in seen, seen.add(fam)
        for what, src in sources(name, every):
            try:
                triton.compile(src, target=GPUTarget("cuda", 90, 32))
            except Exception as e:  # report every format, then fail
                failed.append(f"{name} {what}")
                print(f"{name} {what}: {type(e).__name__}: {e}", file=sys.stderr)
    if failed:
        print("failed to compile for sm_90:", ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
