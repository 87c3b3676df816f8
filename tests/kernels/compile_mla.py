"""Compile MLA's block-attention kernel (strata.kernels.attention._mla_kernel) for sm_90 on a
machine without a GPU (ttir -> cubin) at DeepSeek-V3's widths (q/k 192 = 128 + 64, v 128) and
report its footprint: the shared memory it declares and, from triton's own ptxas -v on the same
PTX, the registers a thread uses, spill bytes, and which tensor-core instructions the dots
became (compile_attention.ptx_usage).

compile_moe.py's pipeline (this folder). Pointers and (head, row) strides get the
divisibility-16 hint the JIT gives real launches (every stride is a multiple of the widths 192
and 128, every block starts on a row), n and m none (a block's sizes are the prompt's).

Variants: the four launches the blocked attention makes (first or resumed, masked or not) at
the heuristic's tiles (a full block's, BM 128, and a short chunk's, BM 64, 32, 16), o bf16
(the last block, into the output) or fp32 (the carried state); without --quick also other
tiles (experiments for the GPU's A/B, pinned by pin_mla_tile).

    python tests/kernels/compile_mla.py           # the launches and the other tiles
    python tests/kernels/compile_mla.py --quick   # the launches at the heuristic's tiles (the
                                                  # suite's check)
"""
import itertools
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

from compile_attention import ptx_usage  # noqa: E402  (this folder: ptxas -v)
from compile_moe import compile_one  # noqa: E402
from strata.kernels.attention import _mla_kernel as k  # noqa: E402
from strata.kernels.attention.mla_block import split_width, tile_width  # noqa: E402
from strata.kernels.attention.tiles import AttnTile, choose_mla_tile  # noqa: E402

ALIGNED = {"q_ptr", "stride_qh", "stride_qt", "k_ptr", "stride_kh", "stride_kt", "v_ptr",
           "stride_vh", "stride_vt", "o_ptr", "stride_oh", "stride_ot", "acc_ptr", "stride_ah",
           "stride_at", "lse_ptr"}
HD, HV = 192, 128
BLOCK_QUERIES = (4096, 40, 20, 1)    # a full block's tile and a short last chunk's (BM 64, 32, 16)
OTHER_TILES = [AttnTile(128, 32, 8, 2), AttnTile(128, 64, 8, 2), AttnTile(128, 128, 8, 2),
               AttnTile(64, 64, 4, 2), AttnTile(64, 64, 4, 3)]


def signature(o_type: str) -> dict:
    def desc(p, *strides):
        return {f"{p}_ptr": "*fp32" if p in ("acc", "lse") else ("*bf16" if p != "o" else o_type),
                **{f"stride_{s}": "i32" for s in strides}}
    return {"Q": desc("q", "qh", "qt"), "K": desc("k", "kh", "kt"), "V": desc("v", "vh", "vt"),
            "O": desc("o", "oh", "ot"), "ACC": desc("acc", "ah", "at"), "LSE": desc("lse", "lh"),
            "n": "i32", "m": "i32", "qk_scale": "fp32"}


def compile_variant(tile: AttnTile, masked: bool, resume: bool, o_type: str) -> tuple[dict, str]:
    da, db = split_width(HD)
    spec = k.MLASpec(DA=da, DB=db, DV=HV, BDA=tile_width(da), BDB=tile_width(db),
                     BDV=tile_width(HV), BM=tile.BLOCK_M, BN=tile.BLOCK_N, MASKED=masked,
                     RESUME=resume, INTERP=False)
    asm = {}
    md = compile_one(k._mla_attention_kernel, signature(o_type), dict(S=spec), tile.num_warps,
                     tile.num_stages, aligned=ALIGNED, asm=asm)
    return md, ptx_usage(asm["ptx"])


def main(argv) -> int:
    quick = "--quick" in argv
    tiles = [choose_mla_tile(n, HD, HV) for n in BLOCK_QUERIES] + ([] if quick else OTHER_TILES)
    fails = 0
    for tile, (masked, resume, o_type) in itertools.product(
            tiles, ((False, False, "*fp32"), (False, True, "*fp32"), (True, True, "*bf16"),
                    (True, False, "*bf16"))):
        what = (f"mla hd={HD} v={HV} tile={tile.BLOCK_M}x{tile.BLOCK_N}/w{tile.num_warps}"
                f"s{tile.num_stages} masked={masked} resume={resume} o={o_type[1:]}")
        try:
            md, usage = compile_variant(tile, masked, resume, o_type)
            print(f"ok   {what}: shared {md['shared']} B, {usage}")
        except Exception as exc:  # noqa: BLE001 - report every variant, then fail
            fails += 1
            print(f"FAIL {what}: {type(exc).__name__}: {str(exc)[:300]}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
