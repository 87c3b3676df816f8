"""Compile the chunked-prefill attention kernel for sm_90 on a machine without a GPU (ttir ->
cubin), at the tiles the heuristic picks on the H200, and report its footprint.

Triton 3.6's GPU passes run on the CPU (compile_moe.py's pipeline, imported from this folder).
For each variant it prints the shared memory the kernel declares and, from triton's own ptxas
run with -v on the same PTX, the registers a thread uses and any spill bytes. Pointer and stride args get the divisibility-16 hint
the JIT gives real launches (the model's tensors are contiguous with hd = 128), so the pipeliner
sees what it sees on the H200.

Variants per head width: bf16 segments; int8 segments read by the kernel ("kernel" path: both,
or a only); int8 codes expanded to bf16 with their scales ("expand" path) in one launch, and as
the pieces of a long prefix (a first piece that stores the softmax state, a last that resumes it
and attends the chunk).

    python tests/kernels/compile_attention.py          # exit 1 naming any variant that fails
    python tests/kernels/compile_attention.py 128      # only the hd = 128 variants (Qwen3)
    python tests/kernels/compile_attention.py --quick 128   # the variants every code path needs
                                                            # (the suite's check)
"""
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"

from compile_moe import compile_one  # noqa: E402  (this folder: the same sm_90 pipeline)
from strata.kernels.attention import _expand_kernel as ek  # noqa: E402
from strata.kernels.attention import _kernel as k  # noqa: E402
from strata.kernels.attention.expand import ROWS_PER_PROGRAM  # noqa: E402
from strata.kernels.attention.tiles import AttnProblem, choose_attn_tile  # noqa: E402

ALIGNED = {"q_ptr", "k_ptr", "v_ptr", "o_ptr", "stride_qt", "stride_qh", "stride_ot",
           "stride_oh", "stride_ct", "stride_ch", "ak_ptr", "av_ptr", "aks_ptr", "avs_ptr",
           "stride_at", "stride_ah", "bk_ptr", "bv_ptr", "bks_ptr", "bvs_ptr", "stride_bt",
           "stride_bh", "acc_ptr", "ml_ptr"}


# (name, a codes, b codes, a scaled, b scaled, resume, finish)
VARIANTS = [("bf16", "*bf16", "*bf16", False, False, False, True),
            ("int8 kernel", "*i8", "*i8", True, True, False, True),
            ("int8 kernel a only", "*i8", "*bf16", True, False, False, True),
            ("int8 expanded", "*bf16", "*bf16", True, True, False, True),
            ("int8 expanded first piece", "*bf16", "*bf16", True, True, False, False),
            ("int8 expanded last piece", "*bf16", "*bf16", True, True, True, True)]
# --quick skips these: their code paths are the others' (a single int8 launch = the last piece
# without the resume loads; a mixed launch = int8 kernel's a-segment + bf16's b-segment)
QUICK_SKIP = ("int8 kernel a only", "int8 expanded")


def signature(a_codes: str, b_codes: str, sinks: bool = False, seq: bool = False) -> dict:
    """The kernel's arguments by descriptor (_chunk_attn_fwd_kernel's CHUNK, A, B, STATE,
    EXTRA); the optional pieces' data as the launcher passes them (None where off)."""
    def seg(p, kv):
        return {f"{p}k_ptr": kv, f"{p}v_ptr": kv, f"{p}ks_ptr": "*fp32", f"{p}vs_ptr": "*fp32",
                f"P{p}": "i32", f"stride_{p}t": "i32", f"stride_{p}h": "i32",
                f"stride_{p}st": "i32", f"stride_{p}sh": "i32"}
    return {"CHUNK": {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*bf16",
                      "T": "i32", "stride_qt": "i32", "stride_qh": "i32", "stride_ot": "i32",
                      "stride_oh": "i32", "stride_ct": "i32", "stride_ch": "i32"},
            "A": seg("a", a_codes), "B": seg("b", b_codes), "qk_scale": "fp32",
            "STATE": {"acc_ptr": "*fp32", "ml_ptr": "*fp32", "stride_ml": "i32"},
            "EXTRA": {"sinks_ptr": "*fp32" if sinks else "constexpr", "window": "i32",
                      "pos_a": "i32", "pos_b": "i32", "n_prefix": "i32",
                      "starts_ptr": "*i32" if seq else "constexpr"}}


def compile_attention(sig, const, warps, stages):
    """(metadata, footprint line) of one variant (`const`: the AttnSpec's fields), through
    compile_moe's sm_90 pipeline."""
    asm = {}
    md = compile_one(k._chunk_attn_fwd_kernel, sig,
                     dict(S=k.AttnSpec(**const), sinks_ptr=None, starts_ptr=None), warps, stages,
                     aligned=ALIGNED, asm=asm)
    return md, ptx_usage(asm["ptx"])


def ptx_usage(ptx: str) -> str:
    """'N registers, S spill bytes, <mma kind>' from triton's bundled ptxas -v (or why not),
    with ', wgmma serialized' where ptxas reports C7515 (each wgmma waited on before the next
    issues: a non-wgmma instruction defines an accumulator inside the async stage)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        exe = get_ptxas(90).path
    except Exception as exc:  # noqa: BLE001 - the footprint line is informative only
        return f"(no ptxas: {type(exc).__name__})"
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([exe, "-v", "--gpu-name=sm_90a", src, "-o", os.path.join(tmp, "k.o")],
                           capture_output=True, text=True)
    text = r.stdout + r.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spill = re.findall(r"(\d+) bytes spill (?:stores|loads)", text)
    if not regs:
        return f"(ptxas said: {text.strip()[:200]})"
    return (f"{regs.group(1)} registers, spill {'/'.join(spill) or '0'} bytes, "
            f"{mma_kind(ptx)}{', wgmma serialized' if 'C7515' in text else ''}")


def mma_kind(ptx: str) -> str:
    """Which tensor-core instructions the dots became: Hopper's wgmma (operands from shared
    memory) or the older mma.sync (operands in registers, a fraction of sm_90's rate)."""
    kinds = [n for n, pat in (("wgmma", "wgmma.mma_async"), ("mma.sync", "mma.sync"))
             if pat in ptx]
    return "+".join(kinds) or "no mma"


def main(head_dims, quick=False) -> int:
    fails = 0
    for hd, G in ((128, 8), (256, 4), (64, 8)):
        if head_dims and hd not in head_dims:
            continue
        tile = choose_attn_tile(AttnProblem(2048 * G, hd))
        for name, a, b, a_sc, b_sc, resume, finish in VARIANTS:
            if quick and name in QUICK_SKIP:
                continue
            const = dict(G=G, HD=hd, BM=tile.BLOCK_M, BN=tile.BLOCK_N, A_SCALED=a_sc,
                         B_SCALED=b_sc, RESUME=resume, FINISH=finish, INTERP=False)
            what = (f"hd={hd} G={G} tile={tile.BLOCK_M}x{tile.BLOCK_N}/w{tile.num_warps}"
                    f"s{tile.num_stages} {name}")
            try:
                md, usage = compile_attention(signature(a, b), const, tile.num_warps,
                                              tile.num_stages)
                print(f"ok   {what}: shared {md['shared']} B, {usage}")
            except Exception as exc:  # report every variant, then fail
                fails += 1
                print(f"FAIL {what}: {type(exc).__name__}: {str(exc)[:300]}")
        for scale in (False, True):
            what = f"hd={hd} expand_codes{' scaled' if scale else ''} BR={ROWS_PER_PROGRAM}/w4"
            try:
                sig = {"src_ptr": "*i8", "dst_ptr": "*bf16", "sc_ptr": "*fp32", "R": "i32",
                       "Hkv": "i32", "stride_st": "i32", "stride_sh": "i32", "stride_dt": "i32",
                       "stride_dh": "i32", "stride_ct": "i32", "stride_ch": "i32",
                       "HD": "constexpr", "BR": "constexpr", "SCALE": "constexpr",
                       "INTERP": "constexpr"}
                asm = {}
                md = compile_one(ek._expand_codes_kernel, sig,
                                 dict(HD=hd, BR=ROWS_PER_PROGRAM, SCALE=scale, INTERP=False), 4,
                                 1, aligned={"src_ptr", "dst_ptr", "stride_st", "stride_sh",
                                             "stride_dt", "stride_dh"}, asm=asm)
                print(f"ok   {what}: shared {md['shared']} B, {ptx_usage(asm['ptx'])}")
            except Exception as exc:  # report every variant, then fail
                fails += 1
                print(f"FAIL {what}: {type(exc).__name__}: {str(exc)[:300]}")
    # GPT-OSS's layers (hd 64, G 8): the sliding window and the sinks, bf16 and int8 prefixes,
    # one launch and the pieces of a split prefix (window in every piece, sinks in the last)
    if not head_dims or 64 in head_dims:
        tile = choose_attn_tile(AttnProblem(2048 * 8, 64))
        for name, a, b, a_sc, b_sc, resume, finish in VARIANTS:
            if quick and name in QUICK_SKIP:
                continue
            # --quick: both together (each one's code is a part of that variant's)
            for win, sinks in ((True, True),) if quick else ((True, True), (False, True),
                                                             (True, False)):
                const = dict(G=8, HD=64, BM=tile.BLOCK_M, BN=tile.BLOCK_N, A_SCALED=a_sc,
                             B_SCALED=b_sc, RESUME=resume, FINISH=finish, INTERP=False,
                             WIN=win, SINKS=sinks)
                sig = signature(a, b, sinks=sinks)
                what = f"hd=64 G=8 window={win} sinks={sinks} {name}"
                try:
                    md, usage = compile_attention(sig, const, tile.num_warps, tile.num_stages)
                    print(f"ok   {what}: shared {md['shared']} B, {usage}")
                except Exception as exc:  # report every variant, then fail
                    fails += 1
                    print(f"FAIL {what}: {type(exc).__name__}: {str(exc)[:300]}")
    # packed sequences (starts: block-diagonal causal, no prefix): plain (Qwen3, hd 128) and
    # with the window and sinks (GPT-OSS, hd 64)
    for hd, G, win in ((128, 8, False), (64, 8, True)):
        if head_dims and hd not in head_dims:
            continue
        fails += packed_variant(hd, G, win)
    return 1 if fails else 0


def packed_variant(hd: int, G: int, win: bool) -> int:
    """Compile the one-launch bf16 kernel with SEQ (and WIN, SINKS when `win`); 1 if it fails."""
    tile = choose_attn_tile(AttnProblem(2048 * G, hd))
    const = dict(G=G, HD=hd, BM=tile.BLOCK_M, BN=tile.BLOCK_N, A_SCALED=False, B_SCALED=False,
                 RESUME=False, FINISH=True, INTERP=False, SEQ=True, WIN=win, SINKS=win)
    sig = signature("*bf16", "*bf16", sinks=win, seq=True)
    what = f"hd={hd} G={G} packed sequences window={win} sinks={win}"
    try:
        md, usage = compile_attention(sig, const, tile.num_warps, tile.num_stages)
        print(f"ok   {what}: shared {md['shared']} B, {usage}")
        return 0
    except Exception as exc:  # report every variant, then fail
        print(f"FAIL {what}: {type(exc).__name__}: {str(exc)[:300]}")
        return 1


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:] if a != "--quick"], "--quick" in sys.argv))
