"""How fast a pack's expert blobs get into page-locked host memory, and how fast they stream from it.

    python benchmarks/pin_bench.py                      # GPU machine: a 16 GiB file in /dev/shm
    python benchmarks/pin_bench.py --gib 1 --smoke      # CPU: checks the script (no pinning)

A file of --gib GiB stands in for a pack in the page cache (/dev/shm). Each option maps it afresh
(`torch.from_file`, as `Pack.open` does, so every option pays the map's page faults) and walks it a
layer at a time (--layer-mb, default one qwen3-30b-a3b Q8_0 layer: 128 x 5,222,400 B):

- alloc:       torch.empty(pin_memory=True) alone (cudaHostAlloc), no copy
- copy-1:      pinned alloc + one copy_ per layer (what HostExperts did)
- copy-N:      pinned alloc + N threads copying 64 MiB pieces (strata.engine.pinning.pinned_copy)
- register:    cudaHostRegister of the whole mapping, read-only, nothing copied

Figures: GB/s of each (bytes / wall seconds), and the host->device rate from the pinned result,
blob by blob (the streamed ring's access pattern), against one 1 GiB pinned copy. Bytes are
checked after every option (the gate: pinned memory that holds other bytes reports nothing).
"""
from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from strata import bench  # noqa: E402
from strata.engine.pinning import Registration, parallel_copy, pinned_copy  # noqa: E402

QWEN3_LAYER = 128 * 5_222_400


def make_file(path: Path, nbytes: int) -> None:
    """A file of pseudo-random bytes (a 64 MiB random piece repeated)."""
    if path.exists() and path.stat().st_size == nbytes:
        return
    piece = torch.randint(0, 256, (64 << 20,), dtype=torch.uint8).numpy().tobytes()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(piece[:min(left, len(piece))])
            left -= len(piece)


def fresh_map(path: Path, nbytes: int) -> torch.Tensor:
    return torch.from_file(str(path), shared=False, size=nbytes, dtype=torch.uint8)


def free_host() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        empty = getattr(torch._C, "_host_emptyCache", None)
        if empty is not None:
            empty()


def _pageable_copy(v: torch.Tensor, threads: int) -> torch.Tensor:
    out = torch.empty(v.shape, dtype=torch.uint8)
    parallel_copy(out, v, threads)
    return out


def h2d_rate(layers: list[torch.Tensor], blob: int, limit: int = 2 << 30) -> float:
    """GB/s of blob-by-blob non_blocking copies from the given host layers to one device slot
    ring (up to `limit` bytes), CUDA-event timed."""
    dev = torch.device("cuda")
    ring = torch.empty((16, blob), dtype=torch.uint8, device=dev)
    blobs = [l[a:a + blob] for l in layers for a in range(0, l.numel() - blob + 1, blob)]
    blobs = blobs[: max(1, limit // blob)]
    for i, b in enumerate(blobs[:16]):
        ring[i % 16].copy_(b, non_blocking=True)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i, b in enumerate(blobs):
        ring[i % 16].copy_(b, non_blocking=True)
    stop.record()
    stop.synchronize()
    return len(blobs) * blob / (start.elapsed_time(stop) / 1e3) / 1e9


def one_copy_rate(nbytes: int = 1 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dst.copy_(src, non_blocking=True)
    stop.record()
    stop.synchronize()
    return nbytes / (start.elapsed_time(stop) / 1e3) / 1e9


def measure(args, rec: bench.Recorder) -> None:
    nbytes = int(args.gib * (1 << 30))
    layer = min(int(args.layer_mb * 1e6), nbytes)
    nbytes -= nbytes % layer
    path = Path(args.path)
    t0 = time.perf_counter()
    make_file(path, nbytes)
    print(f"pin_bench: {nbytes / 1e9:.1f} GB file at {path} ({time.perf_counter() - t0:.1f} s)")
    gpu = torch.cuda.is_available()
    bound = "one 1 GiB pinned H2D copy" if gpu else ""
    ref_rate = one_copy_rate() if gpu else None
    if gpu:
        rec.add("H2D one 1 GiB copy", ref_rate, "GB/s", bound="PCIe 5 x16 (SPEC: 55.4 GB/s)")
    blob = 5_222_400
    options = ["alloc", "copy-1"] + [f"copy-{n}" for n in args.threads]
    if gpu:
        options.append("register")
    for opt in options:
        free_host()
        src = fresh_map(path, nbytes)
        views = [src[a:a + layer] for a in range(0, nbytes, layer)]
        reg = None
        t0 = time.perf_counter()
        if opt == "alloc":
            held = [torch.empty(v.shape, dtype=torch.uint8, pin_memory=gpu) for v in views]
        elif opt.startswith("copy-"):
            n = int(opt.split("-")[1])
            held = [pinned_copy(v, threads=n) if gpu else _pageable_copy(v, n) for v in views] \
                if n > 1 else [torch.empty(v.shape, dtype=torch.uint8, pin_memory=gpu).copy_(v)
                               for v in views]
        else:
            try:
                reg = Registration(src, read_only=True)
            except RuntimeError as e:
                print(f"pin_bench: register: {e}")
                rec.add("pin rate", "failed", "GB/s", option=opt, note=str(e))
                continue
            held = views
        dt = time.perf_counter() - t0
        rate = nbytes / dt / 1e9
        if opt != "alloc":
            step = max(1, len(views) // 4)
            ok = all(torch.equal(held[i][:: 4099], views[i][:: 4099]) for i in range(0, len(views), step))
            if not ok:
                raise bench.GateRefused(f"{opt}: the pinned bytes differ from the file")
        pinned = all(h.is_pinned() for h in held) if gpu else False
        rec.add("pin rate", rate, "GB/s", option=opt, seconds=round(dt, 3), gib=args.gib,
                layer_mb=args.layer_mb, pinned=pinned, bound="host memcpy (no fixed ceiling)")
        print(f"pin_bench: {opt:10s} {rate:6.2f} GB/s ({dt:.2f} s, pinned={pinned})")
        if gpu and opt != "alloc":
            r = h2d_rate(held, blob)
            rec.add("H2D blob by blob", r, "GB/s", option=opt, blob=blob, bound=bound,
                    bound_value=ref_rate)
            print(f"pin_bench: {opt:10s} H2D blob by blob {r:6.2f} GB/s (1 GiB copy {ref_rate:.2f})")
        if reg is not None:
            reg.close()
        del held, views, src
        rec.flush()
    if not args.keep:
        path.unlink(missing_ok=True)


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "benchmarks" / "results")
    ap.add_argument("--gib", type=float, default=16.0, help="file size in GiB (default 16)")
    ap.add_argument("--layer-mb", type=float, default=QWEN3_LAYER / 1e6,
                    help="bytes per layer in MB (default one qwen3-30b-a3b Q8_0 layer)")
    ap.add_argument("--threads", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--path", default="/dev/shm/strata_pin_bench.bin")
    ap.add_argument("--keep", action="store_true", help="keep the file for the next run")
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny file, no pinning")
    args = ap.parse_args(argv)
    if args.smoke:
        args.gib, args.layer_mb, args.threads = min(args.gib, 0.0625), 8.0, [4]
        if not os.path.isdir(os.path.dirname(args.path)):
            args.path = "/tmp/strata_pin_bench.bin"
    return bench.main(args, "pin", measure, script=__file__, argv=argv,
                      stem="pin-smoke" if args.smoke else "pin")


if __name__ == "__main__":
    sys.exit(main())
