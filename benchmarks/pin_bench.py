"""How fast a pack's expert blobs get into page-locked host memory, and how fast they stream from it.

    python benchmarks/pin_bench.py                      # GPU machine: a 16 GiB file in /dev/shm
    python benchmarks/pin_bench.py --gib 1 --smoke      # CPU: checks the script (no pinning)

A file of --gib GiB stands in for a pack in the page cache (/dev/shm). Each option maps it afresh
(`torch.from_file`, as `Pack.open` does, so every option pays the map's page faults) and walks it a
layer at a time (--layer-mb, default one qwen3-30b-a3b Q8_0 layer: 128 x 5,222,400 B):

- alloc:       torch.empty(pin_memory=True) alone (cudaHostAlloc), no copy
- copy-1:      pinned alloc + one copy_ per layer (what HostExperts did)
- copy-N:      pinned alloc + N threads copying 64 MiB pieces
- hostreg-N:   torch's host allocator set to malloc + cudaHostRegister with N register threads
- thp-N:       anonymous memory on transparent huge pages, N threads copy, then cudaHostRegister
- register:    cudaHostRegister, read-only, of a shared read-only map of the file (what
               HostExperts locks in place), nothing copied. Runs before 56e7006 registered the
               private map instead, which Linux 6.x unshares page by page into anonymous
               memory: their "register" rates (2.0 GB/s in pin-nvidia-h200-d9c8ef3.csv) are
               that copy's
- pread-N:     huge pages as thp-N, but N threads read the file into them with os.preadv
               (64 MiB pieces, the GIL released in the syscall, no faults on the file's map)
- bg-thp-N / bg-pread-N: thp-N / pread-N on a background thread while the main thread runs
               Python (what a fresh process does while its pinning thread works: imports,
               Triton's compiles); the rate the pinning thread gets beside a busy interpreter
- bgsi-...:    the same with the interpreter's switch interval cut to 0.1 ms (each GIL hand-off
               to a copy thread waits up to the 5 ms default while the main thread runs Python)

Each option runs in a fresh process (no pinned blocks cached by an earlier one, no map faulted).

Figures: GB/s of each (bytes / wall seconds), and the host->device rate from the pinned result,
blob by blob (the streamed ring's access pattern), against one 1 GiB pinned copy. Bytes are
checked after every option (the gate: pinned memory that holds other bytes reports nothing).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

from strata import bench  # noqa: E402
from strata.engine.pinning import (Registration, huge_page_buffer, parallel_copy,  # noqa: E402
                                   shared_read_map)

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


OPTIONS = ("alloc", "copy-1", "copy-8", "hostreg-8", "thp-8", "thp-16", "register",
           "pread-8", "pread-16", "bg-thp-8", "bg-pread-8", "bg-pread-16", "bgsi-thp-8",
           "bgsi-pread-8", "bgsi-pread-16")


def pread_into(fd: int, dst: torch.Tensor, offset: int, threads: int,
               piece: int = 64 << 20) -> None:
    """dst[:] = the file's bytes at offset.. (os.preadv per piece, on `threads` threads of one
    pool kept for the whole run: no thread starts per layer)."""
    from concurrent.futures import ThreadPoolExecutor
    pool = _POOLS.get(threads) or _POOLS.setdefault(threads, ThreadPoolExecutor(threads))
    view = memoryview(dst.numpy())
    n = dst.numel()

    def one(a):
        b = min(a + piece, n)
        got = os.preadv(fd, [view[a:b]], offset + a)
        if got != b - a:
            raise OSError(f"short read: {got} of {b - a} bytes")
    list(pool.map(one, range(0, n, piece)))


_POOLS: dict = {}


SMOKE_OPTIONS = ("alloc", "copy-1", "thp-8", "pread-8", "bgsi-thp-8")
SWITCH_INTERVAL = 1e-4


def _busy_until(done) -> int:
    """Python work on this thread until `done` is set (a busy interpreter: imports, compiles)."""
    k = 0
    while not done.is_set():
        k += sum(i * i for i in range(2000)) & 1
    return k


def run_option(opt: str, path: Path, nbytes: int, layer: int, gpu: bool) -> dict:
    """Pin the file's bytes one way, in this process; return seconds, pinned, H2D rate."""
    src = fresh_map(path, nbytes)
    views = [src[a:a + layer] for a in range(0, nbytes, layer)]
    keep = []
    reg = []
    bg, _, rest = opt.partition("-") if opt.startswith("bg") else ("", "", opt)
    name, _, n = rest.partition("-")
    threads = int(n) if n else 1
    split = {"copy_s": 0.0, "register_s": 0.0}
    if name == "hostreg" and gpu:
        # torch's host allocator: malloc + cudaHostRegister, pages faulted by N threads
        torch._C._accelerator_setAllocatorSettings(
            f"pinned_use_cuda_host_register:True,pinned_num_register_threads:{threads}")
    t0 = time.perf_counter()
    if name == "alloc":
        held = [torch.empty(v.shape, dtype=torch.uint8, pin_memory=gpu) for v in views]
    elif name in ("copy", "hostreg"):
        held = []
        for v in views:
            d = torch.empty(v.shape, dtype=torch.uint8, pin_memory=gpu)
            parallel_copy(d, v, threads)
            held.append(d)
    elif name in ("thp", "pread"):
        held = []
        fd = os.open(path, os.O_RDONLY)

        def work():
            for i, v in enumerate(views):
                t1 = time.perf_counter()
                m, d = huge_page_buffer(v.numel())
                if name == "thp":
                    parallel_copy(d, v, threads)
                else:
                    pread_into(fd, d, i * layer, threads)
                t2 = time.perf_counter()
                if gpu:
                    reg.append(Registration(d, read_only=False))
                split["copy_s"] += t2 - t1
                split["register_s"] += time.perf_counter() - t2
                keep.append(m)
                held.append(d)
        if bg:
            import threading
            if bg == "bgsi":
                sys.setswitchinterval(SWITCH_INTERVAL)
            done = threading.Event()
            th = threading.Thread(target=lambda: (work(), done.set()))
            th.start()
            _busy_until(done)
            th.join()
        else:
            work()
        os.close(fd)
    elif name == "register":
        m, shared = shared_read_map(str(path), 0, nbytes)
        keep.append(m)
        reg.append(Registration(shared, read_only=True))
        held = [shared[a:a + layer] for a in range(0, nbytes, layer)]
    else:
        raise SystemExit(f"pin_bench: unknown option {opt}")
    dt = time.perf_counter() - t0
    out = dict(option=opt, seconds=dt, pinned=bool(gpu and all(h.is_pinned() for h in held)),
               **split)
    if name != "alloc":
        step = max(1, len(views) // 4)
        out["same_bytes"] = all(torch.equal(held[i][::4099], views[i][::4099])
                                for i in range(0, len(views), step))
        if gpu:
            out["h2d"] = h2d_rate(held, 5_222_400)
    for r in reg:
        r.close()
    return out


def measure(args, rec: bench.Recorder) -> None:
    nbytes = int(args.gib * (1 << 30))
    layer = min(int(args.layer_mb * 1e6), nbytes)
    nbytes -= nbytes % layer
    path = Path(args.path)
    t0 = time.perf_counter()
    make_file(path, nbytes)
    print(f"pin_bench: {nbytes / 1e9:.1f} GB file at {path} ({time.perf_counter() - t0:.1f} s)")
    gpu = torch.cuda.is_available()
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    thp = thp.read_text().strip() if thp.exists() else "n/a"
    print(f"pin_bench: transparent huge pages: {thp}; {os.cpu_count()} cores")
    ref_rate = one_copy_rate() if gpu else None
    if gpu:
        rec.add("H2D one 1 GiB copy", ref_rate, "GB/s", bound="PCIe 5 x16 (SPEC: 55.4 GB/s)")
    options = [o for o in OPTIONS if gpu or o not in ("hostreg-8", "register")]
    if args.smoke:   # one of each way (a process per option: seconds each)
        options = list(SMOKE_OPTIONS)
    if args.options:
        options = args.options
    for opt in options:
        # each option in a fresh process: no pinned blocks cached from the last, no map faulted
        cmd = [sys.executable, __file__, "--one", opt, "--path", str(path), "--gib", str(args.gib),
               "--layer-mb", str(args.layer_mb)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            why = (p.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"pin_bench: {opt}: failed: {why}")
            rec.add("pin rate", "failed", "GB/s", option=opt, note=why[:200])
            continue
        r = json.loads(p.stdout.strip().splitlines()[-1])
        if r.get("same_bytes") is False:
            raise bench.GateRefused(f"{opt}: the pinned bytes differ from the file")
        rate = nbytes / r["seconds"] / 1e9
        rec.add("pin rate", rate, "GB/s", option=opt, seconds=round(r["seconds"], 3),
                copy_s=round(r["copy_s"], 3), register_s=round(r["register_s"], 3),
                gib=args.gib, pinned=r["pinned"], thp=thp, cores=os.cpu_count(),
                bound="10 GB/s target (issue 17)", bound_value=10.0)
        line = (f"pin_bench: {opt:11s} {rate:6.2f} GB/s ({r['seconds']:.2f} s: copy "
                f"{r['copy_s']:.2f} register {r['register_s']:.2f}; pinned={r['pinned']})")
        if "h2d" in r:
            rec.add("H2D blob by blob", r["h2d"], "GB/s", option=opt, blob=5_222_400,
                    bound="one 1 GiB pinned H2D copy", bound_value=ref_rate)
            line += f"; H2D blob by blob {r['h2d']:.2f} GB/s (1 GiB copy {ref_rate:.2f})"
        print(line)
        rec.flush()
    if not args.keep:
        path.unlink(missing_ok=True)


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "benchmarks" / "results")
    ap.add_argument("--gib", type=float, default=16.0, help="file size in GiB (default 16)")
    ap.add_argument("--layer-mb", type=float, default=QWEN3_LAYER / 1e6,
                    help="bytes per layer in MB (default one qwen3-30b-a3b Q8_0 layer)")
    ap.add_argument("--options", nargs="+", choices=OPTIONS, help="default: all that apply")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--path", default="/dev/shm/strata_pin_bench.bin")
    ap.add_argument("--keep", action="store_true", help="keep the file for the next run")
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny file, no pinning")
    args = ap.parse_args(argv)
    if args.one:
        nbytes = int(args.gib * (1 << 30))
        layer = min(int(args.layer_mb * 1e6), nbytes)
        r = run_option(args.one, Path(args.path), nbytes - nbytes % layer, layer,
                       torch.cuda.is_available())
        print(json.dumps(r))
        return 0
    if args.smoke:
        args.gib, args.layer_mb = min(args.gib, 0.0625), 8.0
        if not os.path.isdir(os.path.dirname(args.path)):
            args.path = "/tmp/strata_pin_bench.bin"
    return bench.main(args, "pin", measure, script=__file__, argv=argv,
                      stem="pin-smoke" if args.smoke else "pin")


if __name__ == "__main__":
    sys.exit(main())
