"""Compile the plane-layout int8 expert GEMM (strata.kernels.moe._plane_int8_kernel) for sm_90 on
a machine without a GPU, beside the ggml-layout int8 GEMM on Q8_0 at the same tile
(compile_moe_int8.py's pipeline and checks: an int8 MMA, no fused multiply-add), and read what
the plane layout is for: how the weights' codes reach the tensor cores. Each line says ptxas's
registers and spill bytes, the shared memory, whether the dots are wgmma on s8, and the global
loads in the PTX by width (ld.global of u8 / b16 / b32 / v2 / v4 ..., cp.async of 4 / 8 / 16
bytes: the plane's codes should come as 8- or 16-byte cp.async, the ggml blocks' as bytes; the
q8_1 codes the gate/up epilogue writes in Q8_ORDER as vector stores, like the plain ones).
A format argument (Q8_0, Q4_0, Q4_K) picks the experts' format, all three matrices (each
unless given): Q4_0's and Q4_K's 16-byte code blocks should come as 16-byte cp.async too,
unpacked in registers, and Q4_K's super-block scales as one 16-byte load a row (ld.v4.b32).

    python tests/kernels/compile_moe_plane_int8.py                     # TILES, every format
    python tests/kernels/compile_moe_plane_int8.py Q4_0 128x128/w8s3 64x128/w4s4k2
"""
import collections
import contextlib
import io
import os
import re
import sys

os.environ["TRITON_INTERPRET"] = "0"
os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"

from compile_moe import compile_one  # noqa: E402
from compile_moe_int8 import ALIGNED, NO_FMA, SIG, _check_ptx, _ptxas_use  # noqa: E402

import strata.kernels.moe._int8_kernel as k8  # noqa: E402
import strata.kernels.moe._plane_int8_kernel as kp  # noqa: E402
from strata.errors import StrataError  # noqa: E402
from strata.kernels.decode import format_traits  # noqa: E402
from strata.kernels.moe.int8 import Int8Tile, _min_sign  # noqa: E402
from strata.kernels.moe.plane_int8 import FORMATS, PLANE_INT8_TILE  # noqa: E402
from strata.kernels.moe.q8 import ORDERS  # noqa: E402
import strata.kernels.moe._q8_kernel as q8  # noqa: E402

# the default (kb 4, scale words), int8.py's default, and spill-free kb-1 neighbours
TILES = (PLANE_INT8_TILE, Int8Tile(), Int8Tile(64, 64, 8, 3), Int8Tile(64, 128, 8, 3))

PLANE_SIG = {"qa_ptr": "*i8", "da_ptr": "*fp16", "sa_ptr": "*fp16", "stride_qa": "i32", "stride_da": "i32",
             "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32", "n_assign": "i32",
             "arena_ptr": "*u8", "slot_ptr": "*i64", "c1_off": "i32", "s1_off": "i32",
             "c2_off": "i32", "s2_off": "i32", "c_rb": "i32", "out_ptr": "*fp32",
             "stride_out": "i32",
             "tw_ptr": "*fp32", "n_out": "i32", "n_in": "i32", "n_blocks_ptr": "*i32",
             "boff1": "i32", "boff2": "i32", "alpha": "fp32", "limit": "fp32",
             "hd_ptr": "*fp16", "hs_ptr": "*fp16", "stride_hd": "i32"}
# the plane offsets are 16-byte aligned (strata.planes), D and F multiples of 32
PLANE_ALIGNED = {"qa_ptr", "da_ptr", "sa_ptr", "stride_qa", "sorted_ids_ptr", "block_expert_ptr",
                 "arena_ptr", "slot_ptr", "c1_off", "s1_off", "c2_off", "s2_off", "c_rb", "out_ptr",
                 "stride_out", "tw_ptr", "n_out", "n_in"}
MODES = ((0, dict(QH=True)), (1, {}), (0, dict(BIAS=True, ACT=1, QH=True)))


def load_widths(ptx: str) -> str:
    """The PTX's global loads (and stores) by width: 'ld.b8=N ld.v4.b32=N ... cp16=N st.b8=N'
    (cpW: cp.async of W bytes). Instructions in the code, not executions: a loop body counts
    once, the prologue's and the remainder loop's copies too."""
    n = collections.Counter()
    for m in re.finditer(r"\bst\.global(?:\.[a-z_]+)*?((?:\.v\d)?\.[usbf]\d+)\s", ptx):
        n["st" + m.group(1)] += 1
    for m in re.finditer(r"\bld\.global(?:\.[a-z_]+)*?((?:\.v\d)?\.[usbf]\d+)\s", ptx):
        n["ld" + m.group(1)] += 1
    for m in re.finditer(r"cp\.async\.c[ag]\.shared\.global(?:\.[a-zA-Z0-9_:]+)*\s+\[[^]]+\],"
                         r"\s*\[[^]]+\],\s*(0x[0-9a-fA-F]+|\d+)", ptx):
        n[f"cp{int(m.group(1), 0)}"] += 1
    return " ".join(f"{k}={v}" for k, v in sorted(n.items()))


def _wgmma_s8(ptx: str) -> str:
    w = set(re.findall(r"wgmma\.mma_async\S*\.(s8|u8|bf16|f16)", ptx))
    m = set(re.findall(r"\bmma\.sync\S*\.(s8|bf16|f16)", ptx))
    return f"wgmma.{'/'.join(sorted(w)) or '-'} mma.sync.{'/'.join(sorted(m)) or '-'}"


def _one(fn, sig, spec, tile, aligned, what) -> list[str]:
    asm = {}
    try:
        with contextlib.redirect_stdout(io.StringIO()) as log:
            md = compile_one(fn, sig, dict(S=spec), tile.num_warps, tile.num_stages,
                             aligned=aligned, asm=asm, options=NO_FMA)
    except Exception as exc:
        print(f"FAIL {what}: {str(exc)[:300]}")
        return [what]
    errs = _check_ptx(asm["ptx"], what)
    print(f"{'FAIL' if errs else 'ok  '} {what} {_ptxas_use(log.getvalue())} "
          f"shared={md['shared']} {_wgmma_s8(asm['ptx'])} {load_widths(asm['ptx'])}", flush=True)
    return errs


def _q8_ordered(order: int) -> list[str]:
    """The quantizer with its codes in a plane order (ORDER 1 Q8_0's, 2 Q4_0's) keeps IEEE
    divisions and no fused multiply-add (compile_moe_int8.py's check of the plain one)."""
    sig = {"x_ptr": "*bf16", "stride_x": "i32", "q_ptr": "*i8", "stride_q": "i32",
           "d_ptr": "*fp16", "s_ptr": "*fp16", "stride_d": "i32", "n_rows": "i32"}
    asm = {}
    with contextlib.redirect_stdout(io.StringIO()):
        compile_one(q8._q8_1_kernel, sig, dict(BR=16, ORDER=order), 4, 1,
                    aligned={"x_ptr", "stride_x", "q_ptr", "stride_q"}, asm=asm, options=NO_FMA)
    ptx = asm["ptx"]
    ok = ("div.rn.f32" in ptx and "div.full.f32" not in ptx
          and not re.search(r"\bfma\.rn\.f32", ptx))
    print(f"{'ok  ' if ok else 'FAIL'} q8_1 ORDER={order} x=*bf16 {load_widths(ptx)}")
    return [] if ok else [f"q8_1 ORDER={order}: divisions not IEEE or a fused multiply-add"]


def main(argv=None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    fmts = [a for a in args if a in FORMATS] or list(FORMATS)
    try:
        tiles = [Int8Tile.parse(a) for a in args if a not in FORMATS] or TILES
    except StrataError as exc:
        print(exc, file=sys.stderr)
        return 2
    fails = []
    for fmt, tile in ((f, t) for f in fmts for t in tiles):
        fails += _tile(fmt, tile)
    for order in sorted({ORDERS[f][0] for f in fmts}):
        fails += _q8_ordered(order)
    for f in fails:
        print("FAIL", f)
    return 1 if fails else 0


def _tile(fmt: str, tile: Int8Tile) -> list[str]:
    """Both kernels at one tile on experts all of `fmt`, each mode."""
    tr = format_traits(fmt)
    fails = []
    for mode, extra in MODES:
        S = kp.PlaneInt8Spec(MODE=mode, TOPK=8, BM=tile.BLOCK_M, BN=tile.BLOCK_N,
                             INTERP=False, KB=tile.kb, WORDS=tile.kb in (2, 4),
                             Q4=fmt in ("Q4_0", "Q4_K"), KQ=fmt == "Q4_K",
                             HORD=ORDERS[fmt][0], **extra)
        sig = dict(PLANE_SIG, out_ptr="*i8") if extra.get("QH") else PLANE_SIG
        fails += _one(kp._plane_int8_gemm_kernel, sig, S, tile, PLANE_ALIGNED,
                      f"plane int8 {fmt} {tile.name} mode={mode} {extra}")
        mn = _min_sign(fmt)
        S8 = k8.Int8Spec(MODE=mode, TOPK=8, FMT1=tr, FMT2=tr, MIN1=mn, MIN2=mn,
                         BM=tile.BLOCK_M, BN=tile.BLOCK_N, INTERP=False, KB=tile.kb, **extra)
        sig8 = dict(SIG, out_ptr="*i8") if extra.get("QH") else SIG
        fails += _one(k8._int8_gemm_kernel, sig8, S8, tile, ALIGNED,
                      f"ggml int8  {fmt} {tile.name} mode={mode} {extra}")
    return fails


if __name__ == "__main__":
    sys.exit(main())
