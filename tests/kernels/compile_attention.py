"""Compile the chunked-prefill attention kernel for sm_90 on a machine without a GPU (ttir ->
cubin), at the tiles the heuristic picks on the H200, and report its footprint.

Triton 3.6's GPU passes run on the CPU (compile_moe.py's pipeline, imported from this folder).
For each variant it prints the shared memory the kernel declares and, from triton's own ptxas
run with -v on the same PTX, the registers a thread uses and any spill bytes. Pointer and stride args get the divisibility-16 hint
the JIT gives real launches (the model's tensors are contiguous with hd = 128), so the pipeliner
sees what it sees on the H200.

    python tests/kernels/compile_attention.py          # exit 1 naming any variant that fails
    python tests/kernels/compile_attention.py 128      # only the hd = 128 variants (Qwen3)
"""
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"

from compile_moe import compile_one  # noqa: E402  (this folder: the same sm_90 pipeline)
from strata.kernels.attention import _kernel as k  # noqa: E402
from strata.kernels.attention.tiles import AttnProblem, choose_attn_tile  # noqa: E402

ALIGNED = {"q_ptr", "k_ptr", "v_ptr", "o_ptr", "stride_qt", "stride_qh", "stride_ot",
           "stride_oh", "stride_ct", "stride_ch", "ak_ptr", "av_ptr", "aks_ptr", "avs_ptr",
           "stride_at", "stride_ah", "bk_ptr", "bv_ptr", "bks_ptr", "bvs_ptr", "stride_bt",
           "stride_bh"}


def signature(a_int8: bool, b_int8: bool) -> dict:
    def seg(p, int8):
        kv = "*i8" if int8 else "*bf16"
        return {f"{p}k_ptr": kv, f"{p}v_ptr": kv, f"{p}ks_ptr": "*fp32", f"{p}vs_ptr": "*fp32",
                f"P{p}": "i32", f"stride_{p}t": "i32", f"stride_{p}h": "i32",
                f"stride_{p}st": "i32", f"stride_{p}sh": "i32"}
    sig = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*bf16", "T": "i32",
           "stride_qt": "i32", "stride_qh": "i32", "stride_ot": "i32", "stride_oh": "i32",
           "stride_ct": "i32", "stride_ch": "i32"}
    sig.update(seg("a", a_int8))
    sig.update(seg("b", b_int8))
    sig["qk_scale"] = "fp32"
    return sig


def ordered(sig: dict) -> dict:
    """`sig` in the kernel's argument order (the divisibility hints are positional)."""
    names = list(k._chunk_attn_fwd_kernel.arg_names)
    return {n: sig[n] for n in names if n in sig}


def compile_attention(sig, const, warps, stages):
    """(metadata, footprint line) of one variant, through compile_moe's sm_90 pipeline."""
    sig = ordered(dict(sig, **{c: "constexpr" for c in const}))
    asm = {}
    md = compile_one(k._chunk_attn_fwd_kernel, sig, const, warps, stages, aligned=ALIGNED,
                     asm=asm)
    return md, ptx_usage(asm["ptx"])


def ptx_usage(ptx: str) -> str:
    """'N registers, S spill bytes' from triton's bundled ptxas -v (or why not)."""
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
    return f"{regs.group(1)} registers, spill {'/'.join(spill) or '0'} bytes"


def main(head_dims) -> int:
    fails = 0
    for hd, G in ((128, 8), (256, 4), (64, 8)):
        if head_dims and hd not in head_dims:
            continue
        tile = choose_attn_tile(AttnProblem(2048 * G, hd))
        for a8, b8 in ((False, False), (True, True), (True, False)):
            const = dict(G=G, HD=hd, BM=tile.BLOCK_M, BN=tile.BLOCK_N, A_INT8=a8, B_INT8=b8,
                         INTERP=False)
            what = (f"hd={hd} G={G} tile={tile.BLOCK_M}x{tile.BLOCK_N}/w{tile.num_warps}"
                    f"s{tile.num_stages} a={'int8' if a8 else 'bf16'} "
                    f"b={'int8' if b8 else 'bf16'}")
            try:
                md, usage = compile_attention(signature(a8, b8), const, tile.num_warps,
                                              tile.num_stages)
                print(f"ok   {what}: shared {md['shared']} B, {usage}")
            except Exception as exc:  # report every variant, then fail
                fails += 1
                print(f"FAIL {what}: {type(exc).__name__}: {str(exc)[:300]}")
    # GPT-OSS's layers (hd 64, G 8): the sliding window and the sinks, bf16 and int8 prefixes
    if not head_dims or 64 in head_dims:
        tile = choose_attn_tile(AttnProblem(2048 * 8, 64))
        for a8, win, sinks in ((False, True, True), (False, False, True), (True, True, True)):
            const = dict(G=8, HD=64, BM=tile.BLOCK_M, BN=tile.BLOCK_N, A_INT8=a8, B_INT8=a8,
                         INTERP=False, WIN=win, SINKS=sinks)
            sig = dict(signature(a8, a8), sinks_ptr="*fp32", window="i32")
            what = f"hd=64 G=8 window={win} sinks={sinks} kv={'int8' if a8 else 'bf16'}"
            try:
                md, usage = compile_attention(sig, const, tile.num_warps, tile.num_stages)
                print(f"ok   {what}: shared {md['shared']} B, {usage}")
            except Exception as exc:
                fails += 1
                print(f"FAIL {what}: {type(exc).__name__}: {str(exc)[:300]}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main([int(a) for a in sys.argv[1:]]))
