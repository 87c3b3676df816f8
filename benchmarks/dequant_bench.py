"""Throughput of strata.kernels.dequantize per block format, against the device copy rate; with
--mode experts, of the decode-once path (strata.kernels.moe.expert_dequant, the decoded expert FFN's
decode step) per path and tile.

    python benchmarks/dequant_bench.py                 # GPU: every format, bf16 out, 32768 x 4096
    python benchmarks/dequant_bench.py --smoke         # CPU interpreter, tiny: checks the script
    python benchmarks/dequant_bench.py --mode experts  # GPU: decode-once, 128 experts x 768 x 2048
        (qwen3-30b-a3b's gate), the K-quants/IQ4_XS through the byte path and the super-block
        word path at several tiles, Q8_0 through bytes and words, MXFP4 through bytes and its
        stream of words at several program sizes (--stream-blocks), in one run
    python benchmarks/dequant_bench.py --mode experts --formats MXFP4 --expert-shape 128,2880,2880
        # gpt-oss's experts (1530-byte rows, not whole words)

--mode experts reports each figure three ways: GB/s of input bytes (the blocks), of output bytes
(bf16), and of both against the device copy measured in the same run (read + write, like the
decode). Each (format, path, tile) is gated bit for bit against dequantize_torch on the first and
last expert before it is timed.

What bounds it: dequantize reads the blocks and writes the decoded matrix, so its rate is
(bytes read + bytes written) / time, the same count as a device-to-device copy's read + write.
The reference is the measured 4.19 TB/s device copy of an H200 (SPEC); the script also measures a
copy of the same size on the machine it runs on and reports both.

Follows strata.bench: before timing a format, the kernel's output is checked bit for bit against
dequantize_torch on the benchmark's own data (the gate: a mismatch stops the run, no speed is
reported for a wrong kernel); times are the median of --repeats runs timed with CUDA events
(perf_counter on the CPU, labelled); `--base REF` adds the same run at a git ref.
Results: benchmarks/results/dequant-<gpu>-<commit>.csv (strata.bench long format) and .png.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from strata import bench
from strata.formats import get_format
from strata.blob import MatrixSlot, align_up
from strata.experts import ExpertSet
from strata.kernels import dequantize, dequantize_torch
from strata.kernels.decode import FAST_CODE_FORMATS, TRITON_FORMATS
from strata.kernels.decode.streams import STREAM_FORMATS
from strata.kernels.decode.superblocks import SUPERBLOCK_FORMATS
from strata.kernels.dequant import dequant_tiles
from strata.kernels.moe.expert_dequant import decode_launch, decode_matrix_into
from strata.kernels.moe.tiles import pin_tile

ROOT = Path(__file__).resolve().parents[1]

H200_COPY_RATE = 4.19e12  # bytes/s, read + write, measured device copy (SPEC)
H200_BOUND = "4.19 TB/s D2D (H200 copy, SPEC)"
FORMATS = list(TRITON_FORMATS)
EXPERT_FORMATS = [*SUPERBLOCK_FORMATS, "Q8_0", "MXFP4"]
# decode-once paths: bytes (decode_tile_runs per 64 x 64 tile), words (Q8_0/Q4_0 pair_tile at
# each --word-tiles tile; MXFP4 decode.streams at each --stream-blocks size), superblocks
# (decode.superblocks at each --sb-tiles tile)
EXPERT_PATHS = ("bytes", "words", "superblocks")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
GATE = "bit-exact vs dequantize_torch (first 64 rows of the timed data)"


def random_blocks(fmt, n: int, k: int, dev: torch.device, seed: int = 0) -> torch.Tensor:
    """Random valid blocks [n, row_bytes]: random bytes, fp16 scales forced finite and small."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    raw = torch.randint(0, 256, (n, fmt.row_bytes(k)), generator=gen, device=dev,
                        dtype=torch.int32).to(torch.uint8)
    blocks = raw.view(-1, fmt.block_bytes)
    for off in fmt.fp16_fields:
        blocks[:, off + 1] &= 0x3B  # exponent < 0x1F: finite, |d| < 1 (no inf in the decoded data)
    return raw


def check(raw, fmt, dtype, tiles):
    """Bit-exact against dequantize_torch on the first rows of the benchmark's data (the gate)."""
    part = raw[: min(64, raw.shape[0])]
    got, want = dequantize(part, fmt, dtype, tiles=tiles), dequantize_torch(part, fmt, dtype)
    if not torch.equal(got.view(torch.int16 if got.element_size() == 2 else torch.int32),
                       want.view(torch.int16 if want.element_size() == 2 else torch.int32)):
        return f"dequantize({fmt.name}, {dtype}) differs from dequantize_torch"
    return None


def plot(rows: list[dict], path: Path) -> None:
    if any(r["figure"] == "decode-once input rate" for r in rows):
        return plot_experts(rows, path)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [r for r in rows if r["figure"] == "dequantize rate"]
    copies = {r["label"]: r["value"] for r in rows if r["figure"] == "copy rate measured"}
    series = list(dict.fromkeys((r["label"], r["config"]["out_dtype"], r["config"]["decoder"])
                                for r in rates))
    names = list(dict.fromkeys(r["config"]["format"] for r in rates))
    fig, ax = plt.subplots(figsize=(min(12, max(6, 0.6 * len(names) * len(series))), 4.5))
    width = 0.8 / max(1, len(series))
    for i, (label, dname, dec) in enumerate(series):
        vals = [next((r["value"] for r in rates if r["config"]["format"] == n
                      and r["label"] == label and r["config"]["out_dtype"] == dname
                      and r["config"]["decoder"] == dec), 0) for n in names]
        ax.bar([j + i * width for j in range(len(names))], vals, width,
               label=f"{label}: out {dname}, {dec}")
    ax.axhline(H200_COPY_RATE / 1e9, color="k", ls="--", lw=1, label="H200 copy 4.19 TB/s (SPEC)")
    for label, rate in copies.items():
        ax.axhline(rate, color="gray", ls=":", lw=1, label=f"{label}: copy measured here")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=30)
    ax.set_ylabel("GB/s (bytes read + written)")
    r0 = rates[0]
    ax.set_title(f"strata dequantize, {r0['config']['rows']} x {r0['config']['cols']}, "
                 f"{r0['gpu']}, {r0['commit']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def measure(args, rec: bench.Recorder) -> None:
    from tqdm import tqdm

    dev = rec.device
    fmts = [get_format(f) for f in args.formats.split(",")]
    dtypes = [DTYPES[d] for d in args.out_dtypes.split(",")]

    # the copy every figure is read against: same read+write volume as a bf16 decode
    nbytes = args.rows * args.cols * 2
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t = rec.timed(lambda: dst.copy_(src), check=lambda: None, what="copy")
    copy_rate = 2 * nbytes / t.median_s
    rec.add("copy rate measured", copy_rate / 1e9, "GB/s", bound=H200_BOUND,
            bound_value=H200_COPY_RATE / 1e9, timer=t.timer, bytes=2 * nbytes)
    del src, dst

    for fmt in tqdm(fmts, desc="dequant_bench", file=sys.stderr):
        raw = random_blocks(fmt, args.rows, args.cols, dev)
        for dtype, dec in [(d, dec) for d in dtypes for dec in args.decoders.split(",")]:
            if dec not in ("elem", "runs", "words"):
                raise SystemExit(f"unknown decoder {dec!r}; use elem, runs or words")
            if dec == "words" and fmt.name not in ("Q8_0", "Q4_0"):
                continue   # the word path exists for Q8_0/Q4_0 only
            tiles = dataclasses.replace(dequant_tiles(fmt, args.rows, args.cols),
                                        runs=dec == "runs", words=dec == "words")
            t = rec.timed(lambda: dequantize(raw, fmt, dtype, tiles=tiles),
                          check=lambda: check(raw, fmt, dtype, tiles),
                          what=f"{fmt.name} -> {dtype} ({dec})")
            out_bytes = args.rows * args.cols * torch.empty((), dtype=dtype).element_size()
            moved = raw.numel() + out_bytes
            cfg = dict(format=fmt.name, out_dtype=str(dtype).removeprefix("torch."),
                       decoder=dec, tile_bn=tiles.bn, tile_bk=tiles.bk, rows=args.rows,
                       cols=args.cols, bytes_read=raw.numel(),
                       bytes_written=out_bytes, command=args.command)
            rec.add("dequantize rate", moved / t.median_s / 1e9, "GB/s", bound=H200_BOUND,
                    bound_value=H200_COPY_RATE / 1e9, gate=GATE, timer=t.timer, **cfg)
            rec.add("dequantize time", t.median_ms, "ms", gate=GATE, timer=t.timer, **cfg)
            rec.add("fraction of copy measured", moved / t.median_s / copy_rate, "ratio",
                    bound="copy measured here", bound_value=1.0, gate=GATE, timer=t.timer, **cfg)
        del raw


def _tile_name(c: dict) -> str:
    if c["path"] == "superblocks":
        return f"{c['path']} {c['tile_rows']}x{c['tile_superblocks']}sb"
    if c["path"] == "words" and c.get("tile_blocks"):
        return f"words stream {c['tile_blocks']} blocks"
    if c["path"] == "words":
        return f"words {c['tile_rows']}x{c['tile_cols']}"
    return c["path"]


def plot_experts(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    copies = {r["label"]: r["value"] for r in rows if r["figure"] == "copy rate measured"}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, fig_name in zip(axes, ("decode-once input rate", "decode-once output rate")):
        rates = [r for r in rows if r["figure"] == fig_name]
        series = list(dict.fromkeys((r["label"], _tile_name(r["config"])) for r in rates))
        names = list(dict.fromkeys(r["config"]["format"] for r in rates))
        width = 0.8 / max(1, len(series))
        for i, (label, tile) in enumerate(series):
            vals = [next((r["value"] for r in rates if r["config"]["format"] == n
                          and r["label"] == label and _tile_name(r["config"]) == tile), 0)
                    for n in names]
            ax.bar([j + i * width for j in range(len(names))], vals, width,
                   label=f"{label}: {tile}")
        for label, rate in copies.items():
            ax.axhline(rate / 2, color="gray", ls=":", lw=1,
                       label=f"{label}: copy measured / 2 (one direction)")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=30)
        ax.set_ylabel(f"GB/s of {'input (blocks)' if 'input' in fig_name else 'output (bf16)'}")
        ax.set_title(fig_name, fontsize=9)
        ax.legend(fontsize=6)
    c = rows[-1]["config"]
    fig.suptitle(f"strata decode-once, {c['experts']} experts x {c['rows']} x {c['cols']}, "
                 f"{rows[0]['gpu']}, {rows[0]['commit']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def raw_experts(fmt, n_expert: int, rows: int, cols: int, dev) -> tuple[ExpertSet, MatrixSlot]:
    """n_expert random valid [rows, cols] matrices of `fmt` in one arena (blobs 256-aligned, as
    strata.blob lays them), and the MatrixSlot that reads them."""
    raw = random_blocks(fmt, n_expert * rows, cols, dev)            # [E * rows, row_bytes]
    nbytes = rows * fmt.row_bytes(cols)
    size = align_up(nbytes)
    arena = torch.zeros(n_expert * size, dtype=torch.uint8, device=dev)
    arena.view(n_expert, size)[:, :nbytes] = raw.view(n_expert, nbytes)
    slot = torch.arange(n_expert, device=dev, dtype=torch.int64) * size
    return ExpertSet(arena, slot, None), MatrixSlot("gate", fmt, rows, cols, 0, nbytes)


def expert_pins(fmt, tiles: list[tuple[int, int]], paths: list[str],
                word_tiles: list[tuple[int, int]] = ((64, 64),),
                stream_blocks: list[int] = (256,)):
    """(path, tile, pin_tile overrides) of every path `fmt` takes among `paths`."""
    for p in paths:
        if p == "bytes":
            yield p, None, dict(words=False, streams=False, superblocks=False)
        elif p == "words" and fmt.name in FAST_CODE_FORMATS:
            for t in word_tiles:
                yield p, t, dict(words=True, superblocks=False, word_tile=t)
        elif p == "words" and fmt.name in STREAM_FORMATS:
            for b in stream_blocks:
                yield p, b, dict(streams=True, stream_blocks=b)
        elif p == "superblocks" and fmt.name in SUPERBLOCK_FORMATS:
            for t in tiles:
                yield p, t, dict(superblocks=True, superblock_tile=t)


def measure_experts(args, rec: bench.Recorder) -> None:
    from tqdm import tqdm

    dev = rec.device
    E, R, C = args.expert_shape
    paths = args.paths.split(",")
    bad = [p for p in paths if p not in EXPERT_PATHS]
    if bad:
        raise SystemExit(f"unknown path {bad[0]!r}; use {', '.join(EXPERT_PATHS)}")
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.sb_tiles.split(",")]
    word_tiles = [tuple(int(v) for v in t.split("x")) for t in args.word_tiles.split(",")]
    stream_blocks = [int(b) for b in args.stream_blocks.split(",")]
    out = torch.empty(E, R, C, dtype=torch.bfloat16, device=dev)
    out_bytes = out.numel() * 2
    src = torch.empty(out_bytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t = rec.timed(lambda: dst.copy_(src), check=lambda: None, what="copy")
    copy_rate = 2 * out_bytes / t.median_s
    rec.add("copy rate measured", copy_rate / 1e9, "GB/s", bound=H200_BOUND,
            bound_value=H200_COPY_RATE / 1e9, timer=t.timer, bytes=2 * out_bytes)
    del src, dst
    every = torch.arange(E, device=dev, dtype=torch.int64) * (R * C * 2)
    flat = out.view(torch.uint8).view(-1)
    for fmt in tqdm([get_format(f) for f in args.formats.split(",")], desc="dequant_bench",
                    file=sys.stderr):
        experts, mat = raw_experts(fmt, E, R, C, dev)
        in_bytes = E * mat.nbytes

        def check(fmt=fmt, experts=experts, mat=mat):
            out.fill_(float("nan"))
            decode_matrix_into(experts, mat, every, flat, 0)
            for e in (0, E - 1):
                s0 = int(experts.slot_offset[e])
                raw = experts.arena[s0:s0 + mat.nbytes].view(R, mat.row_bytes)
                want = dequantize_torch(raw, fmt, torch.bfloat16)
                if not torch.equal(out[e].view(torch.int16), want.view(torch.int16)):
                    return f"decode-once {fmt.name} expert {e} differs from dequantize_torch"
            return None

        for path, tile, pin in expert_pins(fmt, tiles, paths, word_tiles, stream_blocks):
            with pin_tile(**pin):
                lc = decode_launch(mat)
                t = rec.timed(lambda: decode_matrix_into(experts, mat, every, flat, 0),
                              check=check, what=f"{fmt.name} decode-once ({path} {tile})")
            cfg = dict(format=fmt.name, path=path, tile_rows=lc["BN"],
                       tile_superblocks=lc["BK"] // 256 if lc["SUPER"] else 0,
                       tile_cols=lc["BK"], tile_blocks=lc["BN"] if lc["STREAM"] else 0,
                       aligned=lc["ALIGNED"], experts=E, rows=R, cols=C,
                       bytes_read=in_bytes, bytes_written=out_bytes, command=args.command)
            gate = "bit-exact vs dequantize_torch (first and last expert of the timed data)"
            rec.add("decode-once input rate", in_bytes / t.median_s / 1e9, "GB/s",
                    bound="copy measured here / 2", bound_value=copy_rate / 2e9, gate=gate,
                    timer=t.timer, **cfg)
            rec.add("decode-once output rate", out_bytes / t.median_s / 1e9, "GB/s",
                    bound="copy measured here / 2", bound_value=copy_rate / 2e9, gate=gate,
                    timer=t.timer, **cfg)
            rec.add("decode-once time", t.median_ms, "ms", gate=gate, timer=t.timer, **cfg)
            rec.add("fraction of copy measured", (in_bytes + out_bytes) / t.median_s / copy_rate,
                    "ratio", bound="copy measured here", bound_value=1.0, gate=gate,
                    timer=t.timer, **cfg)
        del experts
        rec.flush()


def summary(rows: list[dict]) -> None:
    for r in rows:
        c = r["config"]
        if r["figure"] == "decode-once input rate":
            frac = next(x["value"] for x in rows if x["figure"] == "fraction of copy measured"
                        and x["config"] == c and x["label"] == r["label"])
            out = next(x["value"] for x in rows if x["figure"] == "decode-once output rate"
                       and x["config"] == c and x["label"] == r["label"])
            print(f"[{r['label']}] {c['format']:>7} {_tile_name(c):<28} in {r['value']:8.1f} "
                  f"GB/s  out {out:8.1f} GB/s  {100 * frac:5.1f}% of the copy")
        elif r["figure"] == "dequantize rate":
            print(f"[{r['label']}] {c['format']:>7} -> {c['out_dtype']:<8} {c['decoder']:<4} "
                  f"{r['value']:9.1f} GB/s  "
                  f"{100 * r['value'] * 1e9 / H200_COPY_RATE:5.1f}% of 4.19 TB/s")
        elif r["figure"] == "copy rate measured":
            print(f"[{r['label']}] copy measured: {r['value']:.1f} GB/s")


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "benchmarks" / "results", warmup=5, repeats=50)
    ap.add_argument("--mode", choices=("dequantize", "experts"), default="dequantize",
                    help="dequantize: strata.kernels.dequantize (one matrix); experts: the "
                         "decode-once path (decode_matrix_into) over an expert set")
    ap.add_argument("--formats", default=None,
                    help=f"comma-separated format names (default: every Triton format; "
                         f"--mode experts: {','.join(EXPERT_FORMATS)})")
    ap.add_argument("--out-dtypes", default="bf16", help="comma-separated: fp32,bf16,fp16")
    ap.add_argument("--decoders", default="elem,runs,words",
                    help="comma-separated: elem (decode_tile, scales per weight), runs "
                         "(decode_tile_runs, scales once per run of 32), words (Q8_0/Q4_0: "
                         "aligned int32 words, decode.pair_tile)")
    ap.add_argument("--rows", type=int, default=32768, help="N rows (output features)")
    ap.add_argument("--cols", type=int, default=4096, help="K weights per row (multiple of 256)")
    ap.add_argument("--expert-shape", default="128,768,2048",
                    help="--mode experts: E,R,C experts x rows x cols (C a multiple of each "
                         "format's block: 256 for the super-block formats, 32 for Q8_0 and "
                         "MXFP4; gpt-oss: 128,2880,2880)")
    ap.add_argument("--paths", default=",".join(EXPERT_PATHS),
                    help="--mode experts: comma-separated decode-once paths (bytes, words, "
                         "superblocks); each format takes those it has")
    ap.add_argument("--sb-tiles", default="32x2,64x1,32x1,16x2,32x4,128x1",
                    help="--mode experts: super-block path tiles, ROWSxSUPERBLOCKS")
    ap.add_argument("--word-tiles", default="64x64",
                    help="--mode experts: Q8_0/Q4_0 word path tiles, ROWSxCOLS (COLS a multiple "
                         "of 64), e.g. 64x64,32x256,64x256,16x512")
    ap.add_argument("--stream-blocks", default="64,128,256,512",
                    help="--mode experts: MXFP4 stream path programs, blocks a program (powers "
                         "of two >= 16; 1024 spills registers at 4 warps on sm_90)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes and 2 repeats, any device (the interpreter on a CPU)")
    args = ap.parse_args(argv)
    try:
        args.expert_shape = tuple(int(v) for v in args.expert_shape.split(","))
        if len(args.expert_shape) != 3 or min(args.expert_shape) < 1:
            raise ValueError
    except ValueError:
        print(f"dequant_bench: --expert-shape must be E,R,C (positive), got "
              f"{args.expert_shape!r}", file=sys.stderr)
        return 2
    if args.formats is None:
        args.formats = ",".join(EXPERT_FORMATS if args.mode == "experts" else FORMATS)
    if args.smoke:
        args.rows, args.cols, args.repeats, args.warmup = 8, 256, 2, 1
        args.expert_shape = (2, 8, 256)
    cols = args.expert_shape[2]
    odd = [f for f in args.formats.split(",") if args.mode == "experts"
           and cols % get_format(f).block]
    if odd:
        print(f"dequant_bench: --expert-shape C = {cols} is not whole {odd[0]} blocks "
              f"({get_format(odd[0]).block} weights); pick C or --formats", file=sys.stderr)
        return 2
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("dequant_bench needs a CUDA device; use --smoke to check it on a CPU")
    args.command = bench.command_line(argv)
    mode = "-experts" if args.mode == "experts" else ""
    stem = bench.run_stem(f"dequant{mode}", ROOT, smoke=args.smoke)
    return bench.main(args, "dequant", measure_experts if args.mode == "experts" else measure, script=__file__, argv=argv, stem=stem, plot=plot,
                      summary=summary)


if __name__ == "__main__":
    sys.exit(main())
