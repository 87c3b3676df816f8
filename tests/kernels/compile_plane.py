"""Compile the plane-layout Q8_0 / Q4_0 / Q4_K expert GEMM for sm_90 on a machine without a GPU
(ttir -> cubin) and report each variant's footprint: shared memory, registers and spills
(triton's ptxas -v), which tensor-core instruction the dots became (wgmma or mma.sync), and how
the code tiles reach shared memory (cp.async or TMA).

compile_moe.py's pipeline (this folder); args get the divisibility-16 hints the JIT gives real
launches (planes and rows 16-byte aligned, D and F multiples of 16).

    python tests/kernels/compile_plane.py            # the default table's tiles, both modes,
                                                     # Q8_0, Q4_0 and Q4_K, swap / no swap,
                                                     # TMA / vector loads, magic / int->float,
                                                     # the biased clamped-SwiGLU epilogue
    python tests/kernels/compile_plane.py --quick    # each format at its table's tiles (the
                                                     # suite's check)
    python tests/kernels/compile_plane.py --formats Q4_K   # the default table's tiles, Q4_K only
    python tests/kernels/compile_plane.py 128x128x64/w8s4/tma 64x128x128/w4s3   # Q8_0 (or
                                                     # --formats ...) at these tiles
"""
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

from compile_attention import ptx_usage  # noqa: E402  (this folder: ptxas -v, mma kind)
from compile_moe import compile_one  # noqa: E402
import strata.kernels.moe._plane_kernel as pk  # noqa: E402
from strata.errors import StrataError  # noqa: E402
from strata.kernels.decode import format_traits  # noqa: E402
from strata.kernels.moe.plane import KERNEL_FORMATS, PLANE_TILES, PlaneTile  # noqa: E402

ALIGNED = {"a_ptr", "stride_a", "sorted_ids_ptr", "block_expert_ptr", "arena_ptr", "slot_ptr",
           "c1_off", "s1_off", "c2_off", "s2_off", "out_ptr", "stride_out", "tw_ptr", "n_out",
           "n_in"}


def gemm_sig(mode: int) -> dict:
    """The kernel's arguments by descriptor (_plane_gemm_kernel's ROWS, WTS, OUT, EPI)."""
    return {"ROWS": {"a_ptr": "*bf16", "stride_a": "i32", "sorted_ids_ptr": "*i32",
                     "block_expert_ptr": "*i32", "n_assign": "i32"},
            "WTS": {"arena_ptr": "*u8", "slot_ptr": "*i64", "c1_off": "i32", "s1_off": "i32",
                    "c2_off": "i32", "s2_off": "i32"},
            "OUT": {"out_ptr": "*bf16" if mode == 0 else "*fp32", "stride_out": "i32",
                    "tw_ptr": "*fp32"},
            "n_out": "i32", "n_in": "i32", "n_blocks_ptr": "*i32", "padded_ptr": "*i64",
            "EPI": {"boff1": "i32", "boff2": "i32", "alpha": "fp32", "limit": "fp32"}}


def staging(ttgir: str) -> str:
    """How loads reach shared memory in the pipelined loop: TMA, cp.async, or neither."""
    kinds = [n for n, pat in (("tma", "async_tma_copy_global_to_local"),
                              ("cp.async", "async_copy_global_to_local")) if pat in ttgir]
    return "+".join(kinds) or "register loads"


class _Text(dict):
    """compile_one's `asm`, kept as text as each stage finishes (later stages lower the same
    module in place, so the object itself would not show the ttgir)."""
    def __setitem__(self, key, value):
        super().__setitem__(key, value if isinstance(value, (str, bytes)) else str(value))


def compile_tile(tile: PlaneTile, mode: int, fmt: str, **epilogue) -> str:
    """One variant's footprint line; `epilogue`: the spec's BIAS / ACT (default: the plain FFN's)."""
    g = format_traits(fmt)
    spec = pk.PlaneSpec(MODE=mode, TOPK=8, BM=tile.BLOCK_M, RB=tile.row_blocks, BN=tile.BLOCK_N,
                        BK=tile.BLOCK_K, FMT1=g, FMT2=g, SWAP=tile.swap, TMA=tile.tma,
                        MAGIC=tile.magic, INTERP=False,
                        EVEN=True,   # whole tiles, as the real shapes (D, F multiples of 64, 128)
                        **epilogue)
    asm = _Text()
    md = compile_one(pk._plane_gemm_kernel, gemm_sig(mode), dict(S=spec), tile.num_warps,
                     tile.num_stages, aligned=ALIGNED, asm=asm, maxnreg=tile.max_registers(mode))
    return f"shared {md['shared']} B, {ptx_usage(asm['ptx'])}, {staging(asm['ttgir'])}"


def main(argv) -> int:
    quick = "--quick" in argv
    args = [a for a in argv if a != "--quick"]
    fmts = None
    if "--formats" in args:
        i = args.index("--formats")
        fmts = [a for a in args[i + 1:] if a in KERNEL_FORMATS]
        bad = [a for a in args[i + 1:len(fmts) + i + 1] if a not in KERNEL_FORMATS]
        if not fmts or bad:
            print(f"--formats takes one or more of {', '.join(KERNEL_FORMATS)}", file=sys.stderr)
            return 2
        args = args[:i] + args[i + 1 + len(fmts):]
    try:
        tiles = [PlaneTile.parse(n) for n in args]
    except StrataError as exc:
        print(exc, file=sys.stderr)
        return 2
    runs = [(t, f) for f in (fmts or ["Q8_0"]) for t in tiles]
    if not tiles:
        base = list(dict.fromkeys(t for f in KERNEL_FORMATS for t in PLANE_TILES[f].values()))
        more = ([t.with_(swap=False) for t in base] + [t.with_(tma=True) for t in base]
                + [t.with_(magic=False) for t in base])
        if fmts:
            runs = [(t, f) for f in fmts for t in base + ([] if quick else more)]
        else:
            runs = [(t, f) for f in KERNEL_FORMATS for t in PLANE_TILES[f].values()]
            if not quick:
                runs += [(t, "Q8_0") for t in more] + [(t, f) for f in ("Q4_0", "Q4_K")
                                                      for t in base[:-1] + more]
    # the biased, clamped-SwiGLU epilogue (GPT-OSS-style experts) at the table's tiles
    oai = [] if quick or tiles else [(t, (fmts or ["Q8_0"])[0]) for t in base]
    fails = 0
    for (tile, fmt), epi in [(r, {}) for r in dict.fromkeys(runs)] + [(r, dict(BIAS=True, ACT=1))
                                                                      for r in oai]:
        for mode in (0, 1):
            what = (f"plane{'+bias+swiglu_oai' if epi else ''} {fmt} "
                    f"mode={'gate_up' if mode == 0 else 'down'} {tile.name}")
            try:
                print(f"ok   {what}: {compile_tile(tile, mode, fmt, **epi)}", flush=True)
            except Exception as exc:  # report every variant, then fail
                fails += 1
                print(f"FAIL {what}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
