"""MLA prefill attention: the blocked expanded form strata runs, the all-at-once expanded form
it replaced, and the absorbed form, measured.

One layer of DeepSeek-V3's attention (H 128, N 128, R 64, Hv 128, Lkv 512) for a chunk of T
tokens after P cached ones, bf16 on the GPU:
- blocked      strata.models.mla.mla_chunk_attention, the model's path at the launch in force
               (strata.models.mla_launch; default: query blocks of MLA_BLOCK tokens, keys
               decompressed a block at a time into a preallocated MLAScratch (the plan's
               carve), one memory-efficient-attention launch a block, blocks merged by
               log-sum-exp in fp32);
- blocked:BACKEND[:BLOCK[:MERGE]]   the same under pin_mla_launch(backend=, block=, merge=):
               blocked:flash is torch's flash forward on V zero-padded to the q/k width (its
               scratch's values hd wide, counted in transient_mb's bound), blocked:flash:4096
               the same at 4096-token blocks (a quarter of the launches at T 32768),
               blocked:flash:2048:fused with the merge in one Triton launch a block;
               blocked:cudnn:4096/8192 cuDNN's attention at query blocks of 4096 with the
               keys before each in launches of 8192 (MLALaunch.key_block);
               blocked:triton strata's block kernel (q/k 192 as 128 + 64, V at 128, the
               state carried through the launches), blocked:triton:4096:fused:64x64/w4s3
               the same at a pinned tile (pin_mla_tile);
- all_at_once  decompress K/V of all S = P + T keys, then torch's fused SDPA over heads of
               192 / 128 with a bottom-right causal mask (the path before: a transient of
               S·H·(hd + Hv) bf16, outside the plan);
- absorbed     Wuk folded into q (q_lat [T, H, Lkv]), SDPA in the latent space against the S
               shared keys [c | k_pe] of 576 with values c of 512 (one kv head for all 128),
               then Wuv on the output (this script's torch version of the form).
Each passes the gate first: normalized error against strata's fp64 absorbed reference < 2e-2
(bf16 q, K, V), on 4 heads and the last 512 queries. Figures: ms per call, TFLOP/s of the
form's own multiply-adds (x2; blocked is counted at the expanded form's FLOPs, its
re-decompression of the prefix once per query block being overhead), and `transient_mb`: the
peak device memory a call allocates beyond its inputs (and, blocked, its scratch and output).
Bounds: the FLOP counts in strata/models/mla.py's docstring (expanded 81,920·T·S + 33.5M·S,
absorbed 278,528·T·S + 33.5M·T).

    python benchmarks/mla_bench.py             # GPU: T 4096 at P 0, 12288, 28672
    python benchmarks/mla_bench.py --tokens 8192,32768 --prefix 0 \
        --arms blocked,blocked:flash,blocked:flash:2048:fused  # the A/B (gpu_session mlaflash)
    python benchmarks/mla_bench.py --tokens 8192,32768 --prefix 0 --arms blocked,\
        blocked:triton,blocked:triton:4096:fused:128x64/w8s2,blocked:triton:2048  # triton's
    python benchmarks/mla_bench.py --smoke     # CPU: tiny widths, checks the script
"""
from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from strata import bench
from strata.errors import StrataError
from strata.kernels.attention.tiles import AttnTile, pin_mla_tile
from strata.models.mla import _split_kvb, mla_chunk_attention, mla_chunk_attention_absorbed
from strata.models.mla_launch import MLALaunch, mla_launch, pin_mla_launch
from strata.models.mla_scratch import MLAScratch

ROOT = Path(__file__).resolve().parents[1]
REL = 2e-2
ARMS = ("blocked", "all_at_once", "absorbed")


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def absorbed(q_nope, q_pe, c, k_pe, wkvb, *, v_head_dim, scale):
    from torch.nn.attention.bias import causal_lower_right
    H, T, N = q_nope.shape
    S, L = c.shape
    w_uk, w_uv = _split_kvb(wkvb, H, N, v_head_dim)
    q = torch.cat([torch.einsum("htn,hnl->htl", q_nope, w_uk), q_pe], dim=-1)   # [H, T, L+R]
    k = torch.cat([c, k_pe], dim=-1)[None, None].expand(1, H, S, -1)            # one kv head
    v = c[None, None].expand(1, H, S, L)
    mask = None if S == T else causal_lower_right(T, S)
    o = F.scaled_dot_product_attention(q[None], k, v, attn_mask=mask, is_causal=S == T,
                                       scale=scale)[0]                          # [H, T, L]
    return torch.einsum("htl,hvl->thv", o, w_uv)


def all_at_once(q_nope, q_pe, c, k_pe, wkvb, *, v_head_dim, scale):
    """The expanded form before the blocks: every key's K/V decompressed, one fused SDPA."""
    from torch.nn.attention.bias import causal_lower_right
    H, T, N = q_nope.shape
    S = c.shape[0]
    w_uk, w_uv = _split_kvb(wkvb, H, N, v_head_dim)
    k = torch.cat([torch.einsum("sl,hnl->hsn", c, w_uk), k_pe[None].expand(H, S, -1)], dim=-1)
    v = torch.einsum("sl,hvl->hsv", c, w_uv)                                   # [H, S, Hv]
    q = torch.cat([q_nope, q_pe], dim=-1)                                       # [H, T, hd]
    mask = None if S == T else causal_lower_right(T, S)
    o = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask,
                                       is_causal=S == T, scale=scale)[0]        # [H, T, Hv]
    return o.transpose(0, 1)


def launch_of(arm: str) -> MLALaunch | None:
    """blocked:BACKEND[:BLOCK[/KEYS][:MERGE[:TILE]]] -> its MLALaunch (the one in force for the
    rest; KEYS the cudnn backend's key_block); other arms None."""
    if not arm.startswith("blocked:"):
        return None
    backend, block, merge = (arm[len("blocked:"):].split(":") + ["", ""])[:3]
    block, _, keys = block.partition("/")
    try:
        block = int(block) if block else mla_launch().block
        keys = int(keys) if keys else None
    except ValueError:
        raise StrataError(f"mla_bench: arm {arm!r}: the block and keys must be ints") from None
    return MLALaunch(backend, block, merge or mla_launch().merge, keys)


def tile_of(arm: str) -> AttnTile | None:
    """The TILE field of blocked:triton:BLOCK:MERGE:TILE (BMxBN/wWsS, e.g. 128x64/w8s3): the
    block kernel's tile pinned for the arm (strata.kernels.attention.tiles.pin_mla_tile)."""
    fields = arm.split(":")
    if len(fields) < 5:
        return None
    m = re.fullmatch(r"(\d+)x(\d+)/w(\d+)s(\d+)", fields[4])
    if not m or fields[1] != "triton":
        raise StrataError(f"mla_bench: arm {arm!r}: a tile is blocked:triton:BLOCK:MERGE:"
                          f"BMxBN/wWsS (e.g. 128x64/w8s3)")
    return AttnTile(*map(int, m.groups()))


def blocked_arm(ins, kw, arm: str, T: int, S: int, dev, dt):
    """(call, its scratch) of the blocked path under the arm's launch and tile (none: those in
    force)."""
    launch, tile = launch_of(arm), tile_of(arm)

    def pins():
        stack = contextlib.ExitStack()
        if launch:
            stack.enter_context(pin_mla_launch(launch))
        if tile:
            stack.enter_context(pin_mla_tile(tile))
        return stack
    with pins():
        H, N, Hv = ins[0].shape[0], ins[0].shape[-1], kw["v_head_dim"]
        scratch = MLAScratch.of(H, N + ins[1].shape[-1], Hv, T, S, dev, dtype=dt)
    out = torch.empty(T, H, Hv, dtype=dt, device=dev)

    def call():
        with pins():
            return mla_chunk_attention(*ins, sdpa=True, scratch=scratch, out=out, **kw)
    return call, scratch


def transient_bytes(fn, dev) -> int:
    """Peak device memory one call of fn allocates beyond what was allocated before it."""
    if dev.type != "cuda":
        return 0
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def measure(args, rec: bench.Recorder) -> None:
    dev = rec.device
    if args.smoke:
        H, N, R, Hv, L, Ts, Ps = 4, 8, 4, 8, 16, [16], [0, 32]
    else:
        H, N, R, Hv, L, Ts, Ps = 128, 128, 64, 128, 512, args.tokens, args.prefix
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    scale = (N + R) ** -0.5
    for T, P in ((T, P) for T in Ts for P in Ps):
        S = P + T
        g = torch.Generator().manual_seed(P)
        q_nope, q_pe = torch.randn(H, T, N, generator=g), torch.randn(H, T, R, generator=g)
        c, k_pe = torch.randn(S, L, generator=g), torch.randn(S, R, generator=g)
        wkvb = torch.randn(H * (N + Hv), L, generator=g) / L ** 0.5
        ins = [t.to(dev, dt) for t in (q_nope, q_pe, c, k_pe, wkvb)]
        kw = dict(v_head_dim=Hv, scale=scale)
        # the gate's reference: 4 heads, the last min(T, 512) queries (fp64 scores of every
        # head and query at S = 32K would take 137 GB)
        h, tq = min(H, 4), min(T, 512)
        wsub = ins[4].view(H, N + Hv, L)[:h].reshape(h * (N + Hv), L)
        ref = mla_chunk_attention_absorbed(ins[0][:h, -tq:], ins[1][:h, -tq:], ins[2], ins[3],
                                           wsub, **kw).float()
        scratches, fns = {}, {"all_at_once": lambda: all_at_once(*ins, **kw),
                              "absorbed": lambda: absorbed(*ins, **kw)}
        for arm in (a for a in args.arms if a.startswith("blocked")):
            fns[arm], scratches[arm] = blocked_arm(ins, kw, arm, T, S, dev, dt)
        arms = {a: fns[a] for a in args.arms}
        expanded = 2.0 * T * S * H * (N + R + Hv) + 2.0 * S * L * H * (N + Hv)
        absorbed_flops = 2.0 * T * S * H * (2 * L + R) + 4.0 * T * H * N * L
        flops = {a: absorbed_flops if a == "absorbed" else expanded for a in arms}
        ms = {}
        for arm, fn in arms.items():
            def check(fn=fn):
                got = fn().float()[-tq:, :h]
                err = float((got - ref).abs().max() / ref.abs().max())
                return None if err < REL else f"normalized error {err:.3e}"
            t = rec.timed(fn, check=check, what=f"{arm} P={P}")
            ms[arm] = t.median_s * 1e3
            rec.add("ms", ms[arm], "ms", timer=t.timer, gate=f"vs fp64 absorbed < {REL:g}",
                    arm=arm, T=T, P=P, H=H)
            rec.add("tflops", flops[arm] / t.median_s / 1e12, "TFLOP/s", timer=t.timer,
                    bound=f"{flops[arm] / 1e12:.3f} TFLOP a call", arm=arm, T=T, P=P, H=H)
            sc = scratches.get(arm)
            rec.add("transient_mb", transient_bytes(fn, dev) / 1e6, "MB", arm=arm, T=T, P=P, H=H,
                    bound="beyond the inputs" + ("" if sc is None else
                                                 f", its scratch ({sc.nbytes / 1e6:.0f} MB) "
                                                 "and output"))
        ratios(rec, ms, flops, T=T, P=P, H=H)
        print(f"P={P} T={T}: " + ", ".join(f"{a} {v:.2f} ms" for a, v in ms.items()), flush=True)
        rec.flush()


def ratios(rec: bench.Recorder, ms: dict, flops: dict, **tags) -> None:
    """The comparisons among the arms measured: absorbed and all-at-once against blocked, and
    each pinned blocked arm against blocked."""
    if "blocked" not in ms:
        return
    if "absorbed" in ms:
        rec.add("absorbed_over_expanded", ms["absorbed"] / ms["blocked"], "ratio",
                bound="FLOP ratio", bound_value=flops["absorbed"] / flops["blocked"], **tags)
    if "all_at_once" in ms:
        rec.add("blocked_over_all_at_once", ms["blocked"] / ms["all_at_once"], "ratio",
                bound="same kernel, same FLOPs: 1 + the blocks' overhead", **tags)
    for arm in (a for a in ms if a.startswith("blocked:")):
        rec.add("over_blocked", ms[arm] / ms["blocked"], "ratio", arm=arm,
                bound="same FLOPs counted (flash's PV runs hd wide: +20% of the attention's)",
                **tags)


def main(argv=None) -> int:
    ap = bench.parser(__doc__, out=ROOT / "benchmarks" / "results", warmup=3, repeats=10)
    ap.add_argument("--smoke", action="store_true", help="tiny widths on the CPU")
    ap.add_argument("--tokens", type=ints, default=[4096],
                    help="chunk tokens T, comma-separated (default 4096)")
    ap.add_argument("--prefix", type=ints, default=[0, 12288, 28672],
                    help="cached tokens P before the chunk, comma-separated")
    ap.add_argument("--arms", type=lambda s: s.split(","), default=list(ARMS),
                    help="comma-separated: blocked, all_at_once, absorbed, "
                         "blocked:BACKEND[:BLOCK[:MERGE]], blocked:triton:BLOCK:MERGE:BMxBN/wWsS "
                         "(default: the first three)")
    args = ap.parse_args(argv)
    try:
        for arm in args.arms:
            if arm not in ARMS:
                launch_of(arm) or ap.error(f"unknown arm {arm!r}")
                tile_of(arm)
    except StrataError as e:
        ap.error(str(e))
    if args.smoke:
        args.warmup, args.repeats = 0, 1
    tag = "smoke" if args.smoke else bench.gpu_name().replace(" ", "_")
    return bench.main(args, "mla_bench", measure, script=__file__, argv=argv,
                      stem=f"mla_bench-{tag}")


if __name__ == "__main__":
    sys.exit(main())
