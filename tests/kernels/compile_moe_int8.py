"""Compile the int8 expert GEMM and the q8_1 quantizer for sm_90 on a machine without a GPU
(compile_moe.py's pipeline, this folder), and read the PTX for what the design relies on: the
int8 MMA (wgmma ... .s8 on Hopper, else mma ... .s8), IEEE divisions in the quantizer
(div.rn.f32), and no fused multiply-add in the GEMM's rescale or the quantizer's roundf (both
launches pass enable_fp_fusion=False). Each GEMM line says what ptxas reports of its registers
(regs, and the bytes of spill stores / loads).

    python tests/kernels/compile_moe_int8.py            # every int8 format, both modes, TILES
    python tests/kernels/compile_moe_int8.py Q8_0 Q4_K  # only these formats
    python tests/kernels/compile_moe_int8.py Q8_0 128x128/w8s3k4   # at this Int8Tile
"""
import contextlib
import io
import os
import re
import sys

os.environ["TRITON_INTERPRET"] = "0"
os.environ["TRITON_DUMP_PTXAS_LOG"] = "1"   # ptxas -v's lines, printed: read for regs and spills

from compile_moe import compile_one  # noqa: E402

import strata.kernels.moe._int8_kernel as k  # noqa: E402
import strata.kernels.moe._q8_kernel as q8  # noqa: E402
from strata.kernels.decode import format_traits  # noqa: E402
from strata.errors import StrataError  # noqa: E402
from strata.kernels.moe.int8 import INT8_FORMATS, Int8Tile, _min_sign  # noqa: E402

TILES = (Int8Tile(), Int8Tile(kb=4))   # the default, and its reduction step of four blocks

SIG = {"qa_ptr": "*i8", "da_ptr": "*fp16", "sa_ptr": "*fp16", "stride_qa": "i32",
       "stride_da": "i32", "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32",
       "n_assign": "i32", "arena_ptr": "*u8", "slot_ptr": "*i64", "off1": "i32", "rb1": "i32",
       "off2": "i32", "rb2": "i32", "out_ptr": "*fp32", "stride_out": "i32", "tw_ptr": "*fp32",
       "n_out": "i32", "n_in": "i32", "n_blocks_ptr": "*i32", "boff1": "i32", "boff2": "i32",
       "alpha": "fp32", "limit": "fp32", "hd_ptr": "*fp16", "hs_ptr": "*fp16",
       "stride_hd": "i32"}
ALIGNED = {"qa_ptr", "da_ptr", "sa_ptr", "stride_qa", "sorted_ids_ptr", "block_expert_ptr",
           "arena_ptr", "slot_ptr", "off1", "rb1", "off2", "rb2", "out_ptr", "stride_out",
           "tw_ptr", "n_out", "n_in"}
NO_FMA = {"enable_fp_fusion": False}


def _check_ptx(ptx: str, what: str) -> list[str]:
    bad = []
    if not re.search(r"(wgmma|mma)\.[^\n]*\.s8", ptx):
        bad.append(f"{what}: no int8 MMA in the PTX")
    if re.search(r"\bfma\.rn\.f32", ptx):
        bad.append(f"{what}: fma.rn.f32 in the PTX (the rescale must not fuse)")
    return bad


def _ptxas_use(log: str) -> str:
    """'regs=R spill=S/L' (bytes of spill stores / loads) from ptxas -v's lines."""
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return (f"regs={regs.group(1) if regs else '?'} "
            f"spill={'/'.join(spill.groups()) if spill else '?'}")


def main(argv=None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    only = [a for a in args if "/" not in a]
    bad = [f for f in only if f not in INT8_FORMATS]
    if bad:
        print(f"no int8 split for {bad}; choose from {', '.join(INT8_FORMATS)}", file=sys.stderr)
        return 2
    try:
        tiles = [Int8Tile.parse(a) for a in args if "/" in a] or TILES
    except StrataError as exc:
        print(exc, file=sys.stderr)
        return 2
    fails = []
    for tile, fmt in ((t, f) for t in tiles for f in only or INT8_FORMATS):
        tr = format_traits(fmt)
        for mode, extra in ((0, {}), (0, dict(QH=True)), (1, {}),
                            (0, dict(BIAS=True, ACT=1, QH=True))):
            S = k.Int8Spec(MODE=mode, TOPK=8, FMT1=tr, FMT2=tr, MIN1=_min_sign(fmt),
                           MIN2=_min_sign(fmt), BM=tile.BLOCK_M, BN=tile.BLOCK_N, INTERP=False,
                           KB=tile.kb, **extra)
            what = f"int8 gemm {tile.name} fmt={fmt} mode={mode} {extra}"
            asm = {}
            sig = dict(SIG, out_ptr="*i8") if extra.get("QH") else dict(SIG)
            try:
                with contextlib.redirect_stdout(io.StringIO()) as log:
                    md = compile_one(k._int8_gemm_kernel, sig, dict(S=S), tile.num_warps,
                                     tile.num_stages, aligned=ALIGNED, asm=asm, options=NO_FMA)
                errs = _check_ptx(asm["ptx"], what)
                fails += errs
                print(f"{'FAIL' if errs else 'ok  '} {what} {_ptxas_use(log.getvalue())} "
                      f"shared={md['shared']}", flush=True)
            except Exception as exc:
                fails.append(what)
                print(f"FAIL {what}: {str(exc)[:300]}")
    sig = {"x_ptr": "*fp32", "stride_x": "i32", "q_ptr": "*i8", "stride_q": "i32",
           "d_ptr": "*fp16", "s_ptr": "*fp16", "stride_d": "i32", "n_rows": "i32"}
    for xt in ("*fp32", "*bf16"):
        asm = {}
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                compile_one(q8._q8_1_kernel, dict(sig, x_ptr=xt), dict(BR=16), 4, 1,
                            aligned={"x_ptr", "stride_x", "q_ptr", "stride_q"}, asm=asm,
                            options=NO_FMA)      # as strata.kernels.moe.q8 launches it
            ptx = asm["ptx"]
            ok = ("div.rn.f32" in ptx and "div.full.f32" not in ptx
                  and not re.search(r"\bfma\.rn\.f32", ptx))
            print(f"{'ok  ' if ok else 'FAIL'} q8_1 x={xt}")
            if not ok:
                fails.append(f"q8_1 x={xt}: divisions not IEEE (div.rn.f32) or a fused "
                             f"multiply-add (roundf must read the rounded product)")
        except Exception as exc:
            fails.append(f"q8_1 x={xt}")
            print(f"FAIL q8_1 x={xt}: {str(exc)[:300]}")
    for f in fails:
        print("FAIL", f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
