"""Compile the expert GEMM's kernels for sm_90 on a machine without a GPU (ttir -> cubin).

Triton 3.6's GPU passes run on the CPU; this caught a TritonGPUCoalesce assertion that the
interpreter cannot see. Args get the divisibility-16 hints the JIT gives real launches, so the
pipeliner sees what it sees on the H200.

    python tests/kernels/compile_moe.py            # every mode x schedule x format, one tile
    python tests/kernels/compile_moe.py Q8_0 Q4_K  # only these formats (each variant it takes)
    python tests/kernels/compile_moe.py --decode-once MXFP4   # only the decode-once kernel's
"""
import itertools
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton._C.libtriton import ir  # noqa: E402

import strata.kernels.moe._ffn_kernel as k  # noqa: E402
import strata.kernels.moe._expert_dequant_kernel as dq  # noqa: E402
import strata.kernels.moe.expert_dequant as dq_launch  # noqa: E402
from strata.formats import get_format  # noqa: E402
from strata.kernels.decode import FAST_CODE_FORMATS, format_traits  # noqa: E402
from strata.kernels.decode.streams import STREAM_BLOCK, STREAM_FORMATS  # noqa: E402
from strata.kernels.decode.superblocks import SUPERBLOCK_FORMATS  # noqa: E402
from strata.kernels.moe.tiles import DEFAULT_STREAM_BLOCKS, DEFAULT_SUPERBLOCK_TILE  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
BACKEND = CUDABackend(TARGET)
ALIGNED = {"a_ptr", "sorted_ids_ptr", "block_expert_ptr", "arena_ptr", "slot_ptr", "off1", "rb1",
           "off2", "rb2", "out_ptr", "stride_out", "tw_ptr", "scratch_ptr", "stride_a", "n_out",
           "n_in"}


def compile_one(fn, sig, const, warps, stages, aligned=ALIGNED, asm=None, maxnreg=None,
                options=None):
    """Compile `fn` to a cubin; returns the metadata. `sig`: each argument's type, a dict of
    {name: type} for a tuple argument (a descriptor; "constexpr" elements take their value from
    `const` under the element's name); `aligned`: the args (or descriptor elements) hinted
    divisible by 16; `asm`, a dict, receives each stage's output by name (ttir ... ptx, cubin);
    `maxnreg` the launch option of that name (registers a thread, None: ptxas's choice);
    `options`: more launch options (e.g. enable_fp_fusion=False)."""
    leaves = {n for ty in sig.values() if isinstance(ty, dict) for n in ty}
    sig = dict(sig, **{c: "constexpr" for c in const if c not in leaves})
    attrs, types = {}, {}
    consts = {c: v for c, v in const.items() if c not in leaves}
    for name, ty in sig.items():
        i = fn.arg_names.index(name)
        if not isinstance(ty, dict):
            types[name] = ty
            if name in aligned:
                attrs[(i,)] = [["tt.divisibility", 16]]
            continue
        types[name] = tuple(ty.values())
        for j, (leaf, t) in enumerate(ty.items()):
            if leaf in aligned:
                attrs[(i, j)] = [["tt.divisibility", 16]]
            if t == "constexpr":
                consts[(i, j)] = const[leaf]
    src = ASTSource(fn, types, consts, attrs=attrs)
    opts = BACKEND.parse_options({"num_warps": warps, "num_stages": stages,
                                  **({"maxnreg": maxnreg} if maxnreg else {}),
                                  **(options or {})})
    ctx = ir.context()
    ir.load_dialects(ctx)
    BACKEND.load_dialects(ctx)
    mod = src.make_ir(TARGET, opts, BACKEND.get_codegen_implementation(opts),
                      BACKEND.get_module_map(), ctx)
    stages_ = {}
    BACKEND.add_stages(stages_, opts, src.language)
    md = {}
    for name in ("ttir", "ttgir", "llir", "ptx", "cubin"):
        mod = stages_[name](mod, md)
        if asm is not None:
            asm[name] = mod
    return md


def gemm_sig(mode):
    """_moe_gemm_kernel's arguments by descriptor (ROWS, WTS, OUT, EPI)."""
    return {"ROWS": {"a_ptr": "*bf16", "stride_a": "i32", "sorted_ids_ptr": "*i32",
                     "block_expert_ptr": "*i32", "n_assign": "i32"},
            "WTS": {"arena_ptr": "*u8", "slot_ptr": "*i64", "off1": "i32", "rb1": "i32",
                    "off2": "i32", "rb2": "i32"},
            "OUT": out_sig(mode), "tab_ptr": "*i32", "n_out": "i32", "n_in": "i32",
            "n_blocks_ptr": "*i32", "n_programs": "i32", "EPI": EPI_SIG}


def out_sig(mode):
    return {"out_ptr": "*bf16" if mode == 0 else "*fp32", "stride_out": "i32", "tw_ptr": "*fp32",
            "scratch_ptr": "*fp32"}


EPI_SIG = {"boff1": "i32", "boff2": "i32", "alpha": "fp32", "limit": "fp32"}


def main(argv=None) -> int:
    fails = 0
    only = list(argv if argv is not None else sys.argv[1:])
    decode_only = "--decode-once" in only
    only = [f for f in only if f != "--decode-once"]
    bad = [f for f in only if f not in k.TRITON_FORMATS]
    if bad:
        print(f"no Triton decoder for {bad}; choose from {', '.join(k.TRITON_FORMATS)}",
              file=sys.stderr)
        return 2
    fmts = list(only or k.TRITON_FORMATS)
    if decode_only:
        return 1 if decode_once(fmts) else 0
    names = {f: f for f in k.TRITON_FORMATS}
    runs = [(mode, sched, fmt, v) for mode, sched, fmt, v in
            itertools.product((0, 1), (0, 1), fmts, k.DOT_VARIANTS)
            if v == "decode" or names[fmt] in k.SCALED_CODE_FORMATS
            and (not v.startswith("swap_fast") or names[fmt] in k.FAST_CODE_FORMATS)]
    for mode, sched, fmt, v in runs:
        tr = format_traits(fmt)
        const = dict(SCHED=sched, S=k.GemmSpec(MODE=mode, TOPK=8, FMT1=tr, FMT2=tr, BM=128,
                                                BN=64, BK=64, INTERP=False,
                                                **k.dot_plan(names[fmt], names[fmt], 64, v)))
        try:
            md = compile_one(k._moe_gemm_kernel, gemm_sig(mode), const, 4, 3)
            print(f"ok   gemm mode={mode} sched={sched} fmt={fmt} dot={v} shared={md['shared']}")
        except Exception as exc:
            fails += 1
            print(f"FAIL gemm mode={mode} sched={sched} fmt={fmt} dot={v}: {str(exc)[:200]}")
    # the biased, clamped-SwiGLU epilogue (GPT-OSS experts), on its decode path
    for mode, sched, fmt in itertools.product((0, 1), (0, 1), fmts):
        tr = format_traits(fmt)
        const = dict(SCHED=sched, S=k.GemmSpec(MODE=mode, TOPK=4, FMT1=tr, FMT2=tr, BM=128,
                                                BN=64, BK=64, INTERP=False, BIAS=True, ACT=1,
                                                **k.dot_plan(names[fmt], names[fmt], 64,
                                                             "decode")))
        try:
            compile_one(k._moe_gemm_kernel, gemm_sig(mode), const, 4, 3)
            print(f"ok   gemm+bias+swiglu_oai mode={mode} sched={sched} fmt={fmt}")
        except Exception as exc:
            fails += 1
            print(f"FAIL gemm+bias+swiglu_oai mode={mode} sched={sched} fmt={fmt}: "
                  f"{str(exc)[:200]}")
    for mode in (0, 1):
        sig = {"GRP": {"sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32", "n_assign": "i32"},
               "OUT": out_sig(mode), "n_out": "i32", "n_in": "i32", "n_blocks_ptr": "*i32",
               "n_programs": "i32", "BLOBS": {"arena_ptr": "*u8", "slot_ptr": "*i64"},
               "EPI": EPI_SIG}
        for extra in ({}, dict(BIAS=True, ACT=1)):
            try:
                compile_one(k._moe_fixup_kernel, sig,
                            dict(S=k.FixupSpec(MODE=mode, TOPK=8, BM=128, BN=64, BK=64,
                                               INTERP=False, **extra)), 4, 3)
                print(f"ok   fixup mode={mode} {extra}")
            except Exception as exc:
                fails += 1
                print(f"FAIL fixup mode={mode} {extra}: {str(exc)[:200]}")
    fails += decode_once(fmts)
    return 1 if fails else 0


def decode_once(fmts) -> int:
    """Compile the decode-once kernel's variants of each format in `fmts` (every path it takes)
    and the bias copy, printing each one's footprint (shared memory; registers and spills from
    ptxas -v); returns the failures."""
    from compile_attention import ptx_usage   # (it imports this module's compile_one)
    fails = 0
    sig = {"arena_ptr": "*u8", "slot_ptr": "*i64", "dst_slot_ptr": "*i64", "mat_off": "i32",
           "row_bytes": "i32", "dst_ptr": "*u8", "dst_off": "i32", "tab_ptr": "*i32", "R": "i32",
           "C": "i32"}
    # (hinted as the JIT specializes real launches: sizes and offsets divisible by 16)
    hints = set(sig) - {"dst_slot_ptr"}
    for name in fmts:
        variants = [("bytes", dict(BN=64, BK=64))]
        if name in FAST_CODE_FORMATS:
            variants.append(("words", dict(BN=64, BK=64, WORDS=True)))
        if name in SUPERBLOCK_FORMATS:
            rows, nsb = DEFAULT_SUPERBLOCK_TILE
            for aligned in (True, False):
                if aligned and get_format(name).block_bytes % 4:
                    continue   # never word-aligned (superblock_words_fit)
                variants += [(f"superblocks aligned={aligned} tile={t}",
                              dict(BN=t[0], BK=256 * t[1], SUPER=True, ALIGNED=aligned))
                             for t in dict.fromkeys(((rows, nsb), (64, 1)))]
        if name in STREAM_FORMATS:   # launched one block a row (expert_dequant.decode_view)
            variants += [(f"stream blocks={b}", dict(BN=b, BK=STREAM_BLOCK, STREAM=True))
                         for b in dict.fromkeys((DEFAULT_STREAM_BLOCKS, 64))]
        for what, const in variants:
            try:
                asm = {}
                md = compile_one(dq._dequant_fwd_kernel, dict(sig),
                                 {"FMT": format_traits(name), "INTERP": False, "WORDS": False,
                                  "SUPER": False, "ALIGNED": False, "STREAM": False, **const},
                                 4, 3, aligned=hints, asm=asm)
                print(f"ok   expert_dequant fmt={name} {what} shared={md['shared']}, "
                      f"{ptx_usage(asm['ptx'])}")
            except Exception as exc:
                fails += 1
                print(f"FAIL expert_dequant fmt={name} {what}: {str(exc)[:200]}")
    # the biased experts' fp32 biases copied beside the decoded matrices (format-free)
    sig = {"arena_ptr": "*u8", "slot_ptr": "*i64", "src_off": "i32", "dst_slot_ptr": "*i64",
           "dst_ptr": "*u8", "dst_off": "i32", "N": "i32"}
    try:
        md = compile_one(dq._copy_words_kernel, sig, {"BW": dq_launch.BIAS_WORDS}, 4, 3,
                         aligned=set(sig) - {"dst_slot_ptr", "N"})
        print(f"ok   copy_biases BW={dq_launch.BIAS_WORDS} shared={md['shared']}")
    except Exception as exc:
        fails += 1
        print(f"FAIL copy_biases: {str(exc)[:200]}")
    return fails


if __name__ == "__main__":
    sys.exit(main())
