"""Throughput of strata.kernels.dequantize per block format, against the device copy rate.

    python benchmarks/dequant_bench.py                 # GPU: every format, bf16 out, 32768 x 4096
    python benchmarks/dequant_bench.py --smoke         # CPU interpreter, tiny: checks the script

What bounds it: dequantize reads the blocks and writes the decoded matrix, so its rate is
(bytes read + bytes written) / time, the same count as a device-to-device copy's read + write.
The reference is the measured 4.19 TB/s device copy of an H200 (SPEC); the script also measures a
copy of the same size on the machine it runs on and reports both.

Before timing a format, the kernel's output is checked bit for bit against dequantize_torch on
the benchmark's own data; a mismatch stops the run (no speed is reported for a wrong kernel).
Times are the median of --repeats runs timed with CUDA events (perf_counter on the CPU).
Results: benchmarks/results/dequant-<gpu>-<commit>.csv (long format) and .png.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as dt
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from strata.formats import get_format  # noqa: E402
from strata.kernels import dequantize, dequantize_torch  # noqa: E402
from strata.kernels.decode import TRITON_FORMATS  # noqa: E402
from strata.kernels.dequant import dequant_tiles  # noqa: E402

H200_COPY_RATE = 4.19e12  # bytes/s, read + write, measured device copy (SPEC)
FORMATS = list(TRITON_FORMATS)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def commit() -> str:
    def git(*a):
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no").strip() else "")


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"cpu-interpreter ({platform.processor() or platform.machine()})"


def time_fn(fn, dev: torch.device, repeats: int, warmup: int) -> float:
    """Median seconds of fn() over `repeats` runs, after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def random_blocks(fmt, n: int, k: int, dev: torch.device, seed: int = 0) -> torch.Tensor:
    """Random valid blocks [n, row_bytes]: random bytes, fp16 scales forced finite and small."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    raw = torch.randint(0, 256, (n, fmt.row_bytes(k)), generator=gen, device=dev,
                        dtype=torch.int32).to(torch.uint8)
    blocks = raw.view(-1, fmt.block_bytes)
    for off in fmt.fp16_fields:
        blocks[:, off + 1] &= 0x3B  # exponent < 0x1F: finite, |d| < 1 (no inf in the decoded data)
    return raw


def check(raw, fmt, dtype, tiles) -> None:
    """Bit-exact against dequantize_torch on the first rows of the benchmark's data."""
    part = raw[: min(64, raw.shape[0])]
    got, want = dequantize(part, fmt, dtype, tiles=tiles), dequantize_torch(part, fmt, dtype)
    if not torch.equal(got.view(torch.int16 if got.element_size() == 2 else torch.int32),
                       want.view(torch.int16 if want.element_size() == 2 else torch.int32)):
        raise SystemExit(f"dequantize({fmt.name}, {dtype}) differs from dequantize_torch: "
                         f"fix the kernel before benchmarking it")


def plot(rows: list[dict], path: Path, title: str, copy_measured: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({(r["out_dtype"], r["decoder"]) for r in rows})
    names = list(dict.fromkeys(r["format"] for r in rows))
    fig, ax = plt.subplots(figsize=(min(12, max(6, 0.6 * len(names) * len(dtypes))), 4.5))
    width = 0.8 / len(dtypes)
    for i, (dname, dec) in enumerate(dtypes):
        vals = [next((r["GBps"] for r in rows if r["format"] == n and r["out_dtype"] == dname
                      and r["decoder"] == dec), 0) for n in names]
        ax.bar([j + i * width for j in range(len(names))], vals, width,
               label=f"out {dname}, {dec}")
    ax.axhline(H200_COPY_RATE / 1e9, color="k", ls="--", lw=1, label="H200 copy 4.19 TB/s (SPEC)")
    ax.axhline(copy_measured / 1e9, color="gray", ls=":", lw=1, label="copy measured here")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=30)
    ax.set_ylabel("GB/s (bytes read + written)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated format names")
    ap.add_argument("--out-dtypes", default="bf16", help="comma-separated: fp32,bf16,fp16")
    ap.add_argument("--decoders", default="elem,runs",
                    help="comma-separated: elem (decode_tile, scales per weight), runs "
                         "(decode_tile_runs, scales once per run of 32)")
    ap.add_argument("--rows", type=int, default=32768, help="N rows (output features)")
    ap.add_argument("--cols", type=int, default=4096, help="K weights per row (multiple of 256)")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes and 2 repeats, any device (the interpreter on a CPU)")
    args = ap.parse_args(argv)

    from tqdm import tqdm

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.smoke:
        args.rows, args.cols, args.repeats, args.warmup = 8, 256, 2, 1
    elif dev.type != "cuda":
        raise SystemExit("dequant_bench needs a CUDA device; use --smoke to check it on a CPU")
    fmts = [get_format(f) for f in args.formats.split(",")]
    dtypes = [DTYPES[d] for d in args.out_dtypes.split(",")]
    gpu, sha = device_name(dev), commit()
    command = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    # the copy every figure is read against: same read+write volume as a bf16 decode
    nbytes = args.rows * args.cols * 2
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_s = time_fn(lambda: dst.copy_(src), dev, args.repeats, args.warmup)
    copy_rate = 2 * nbytes / copy_s
    del src, dst

    rows = []
    for fmt in tqdm(fmts, desc="dequant_bench", file=sys.stderr):
        raw = random_blocks(fmt, args.rows, args.cols, dev)
        for dtype, dec in [(d, dec) for d in dtypes for dec in args.decoders.split(",")]:
            if dec not in ("elem", "runs"):
                raise SystemExit(f"unknown decoder {dec!r}; use elem or runs")
            tiles = dataclasses.replace(dequant_tiles(fmt, args.rows, args.cols),
                                        runs=dec == "runs")
            check(raw, fmt, dtype, tiles)
            out_bytes = args.rows * args.cols * torch.empty((), dtype=dtype).element_size()
            s = time_fn(lambda: dequantize(raw, fmt, dtype, tiles=tiles), dev, args.repeats,
                        args.warmup)
            moved = raw.numel() + out_bytes
            rows.append({
                "gpu": gpu, "commit": sha, "command": command, "utc": stamp,
                "torch": torch.__version__, "triton": __import__("triton").__version__,
                "format": fmt.name, "out_dtype": str(dtype).removeprefix("torch."),
                "decoder": dec, "tile_bn": tiles.bn, "tile_bk": tiles.bk,
                "rows": args.rows, "cols": args.cols, "bytes_read": raw.numel(),
                "bytes_written": out_bytes, "median_ms": s * 1e3, "GBps": moved / s / 1e9,
                "frac_of_h200_copy": moved / s / H200_COPY_RATE,
                "copy_measured_GBps": copy_rate / 1e9,
                "frac_of_copy_measured": moved / s / copy_rate,
                "repeats": args.repeats,
            })
        del raw

    args.out_dir.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in gpu).strip("-").lower()
    stem = args.out_dir / f"dequant-{slug}-{sha}{'-smoke' if args.smoke else ''}"
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot(rows, stem.with_suffix(".png"),
         f"strata dequantize, {args.rows} x {args.cols}, {gpu}, {sha}\n{command}", copy_rate)
    for r in rows:
        print(f"{r['format']:>7} -> {r['out_dtype']:<8} {r['decoder']:<4} {r['median_ms']:9.3f} ms "
              f"{r['GBps']:9.1f} GB/s  {100 * r['frac_of_h200_copy']:5.1f}% of 4.19 TB/s  "
              f"{100 * r['frac_of_copy_measured']:5.1f}% of copy here")
    print(f"copy measured: {copy_rate / 1e9:.1f} GB/s; wrote {stem}.csv and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
