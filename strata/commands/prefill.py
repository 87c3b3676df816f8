"""`strata prefill PACK --tokens 1,2,3 [--chunk N] [--device cpu|cuda] [--dump-logits out.npy]`

Reads a prompt through a pack and reports tokens/s. Today every expert is resident (one arena on
the device, `ResidentProvider`); the streaming engine plugs in as another provider: `make_provider`
is the one place that chooses it, `PrefillResult` the one place that collects what is reported.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from strata.errors import StrataError
from strata.models.moe import FFN_CHOICES
from strata.units import fmt_bytes

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("prefill", help="read a prompt through a pack; print tokens/s",
                       description="Read a prompt (token ids) through a pack with every expert "
                                   "resident on the device; print tokens/s, optionally dump the "
                                   "logits of every position.")
    p.add_argument("pack", help="a pack file (strata pack / strata synth)")
    src = p.add_argument_group("prompt")
    src.add_argument("--tokens", required=True,
                     help="token ids, comma separated (e.g. 1,2,3); no tokenizer is involved")
    p.add_argument("--chunk", type=int, default=None,
                   help="tokens per chunk (default: the whole prompt in one chunk)")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    p.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                   help="dense compute dtype (auto: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--experts", choices=["auto", *FFN_CHOICES], default="auto",
                   help="expert FFN: kernel (Triton GEMM), torch (its plain-torch twin, bf16), "
                        "ref (fp32 reference); auto: kernel on cuda, ref on cpu (the Triton "
                        "interpreter is slow)")
    p.add_argument("--dump-logits", metavar="PATH", default=None,
                   help="write the logits of every position as float32 [T, vocab] .npy")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    return p


def parse_tokens(text: str) -> list[int]:
    parts = [t for t in text.replace(" ", "").split(",") if t != ""]
    if not parts:
        raise StrataError("--tokens is empty; give comma-separated token ids, e.g. --tokens 1,2,3")
    try:
        return [int(t, 10) for t in parts]
    except ValueError:
        bad = next(t for t in parts if not t.lstrip("-").isdigit())
        raise StrataError(f"--tokens: {bad!r} is not a token id; give comma-separated integers") from None


@dataclass
class PrefillResult:
    """What one prompt reports (the streaming engine adds its plan/ring/bytes fields here)."""
    pack: str
    arch: str
    device: str
    dtype: str
    experts: str                 # expert FFN implementation
    provider: str                # "resident" (streaming: the engine's name)
    n_tokens: int
    chunk: int
    n_chunks: int
    seconds: float
    tokens_per_s: float
    next_token: int              # argmax of the last position's logits
    logits_path: str | None = None
    stats: dict = field(default_factory=dict)   # the provider's stats()

    def summary(self) -> str:
        lines = [f"strata prefill: {self.n_tokens} tokens in {self.n_chunks} chunk(s) of "
                 f"{self.chunk} through {self.pack} ({self.arch})",
                 f"  device {self.device}, dtype {self.dtype}, experts via {self.experts}, "
                 f"provider {self.provider}",
                 f"  {self.seconds * 1e3:.1f} ms, {self.tokens_per_s:.1f} tokens/s, "
                 f"next token {self.next_token}"]
        lines += [f"  {k}: {fmt_bytes(v) if k.endswith('_bytes') else v}"
                  for k, v in self.stats.items()]
        if self.logits_path:
            lines.append(f"  logits float32 [{self.n_tokens}, vocab] -> {self.logits_path}")
        return "\n".join(lines)


def make_provider(args, pack, device):
    """The expert provider for this run. The streaming engine (--vram ...) will branch here."""
    from strata.models.load import resident_provider
    return "resident", resident_provider(pack, device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args) -> int:
    from strata.models.load import load_model, open_pack, resolve_device
    from strata.models.moe import expert_ffn

    tokens = parse_tokens(args.tokens)
    if args.chunk is not None and args.chunk < 1:
        raise StrataError(f"--chunk must be at least 1 token, got {args.chunk}")
    if args.dump_logits and not Path(args.dump_logits).parent.resolve().is_dir():
        raise StrataError(f"--dump-logits: directory {Path(args.dump_logits).parent} does not exist")
    pack = open_pack(args.pack)
    vocab = pack.shape.vocab
    bad = [(i, t) for i, t in enumerate(tokens) if not 0 <= t < vocab]
    if bad:
        i, t = bad[0]
        raise StrataError(f"--tokens: id {t} at position {i} is outside the vocabulary "
                          f"[0, {vocab}) of {args.pack}")
    device = resolve_device(args.device)
    dtype = (torch.bfloat16 if device.type == "cuda" else torch.float32) if args.dtype == "auto" \
        else DTYPES[args.dtype]
    ffn_name = args.experts if args.experts != "auto" else \
        ("kernel" if device.type == "cuda" else "ref")
    ffn = expert_ffn(ffn_name)
    model = load_model(pack, device=device, dtype=dtype, ffn=ffn)
    provider_name, provider = make_provider(args, pack, device)

    T = len(tokens)
    chunk = min(args.chunk or T, T)
    n_chunks = -(-T // chunk)
    bar = None
    if n_chunks > 1 and not args.json:
        from tqdm import tqdm
        bar = tqdm(total=T, unit="tok", file=sys.stderr, desc="prefill", leave=False)
    done = [0]

    def progress(n):
        if bar is not None:
            bar.update(n - done[0])
        done[0] = n

    tok = torch.tensor(tokens, dtype=torch.int64)
    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        # [T, V] only when dumped: at V = 151936 a long prompt's logits would not fit in memory
        logits = model.prefill(tok, provider, chunk=chunk, progress=progress,
                               logits="all" if args.dump_logits else "last")
    _sync(device)
    seconds = time.perf_counter() - t0
    if bar is not None:
        bar.close()

    res = PrefillResult(pack=str(args.pack), arch=pack.shape.arch, device=str(device),
                        dtype=str(dtype).replace("torch.", ""),
                        experts=ffn_name, provider=provider_name,
                        n_tokens=T, chunk=chunk, n_chunks=n_chunks, seconds=seconds,
                        tokens_per_s=T / seconds if seconds > 0 else float("inf"),
                        stats=provider.stats(),
                        next_token=int(logits[-1].argmax()))
    if args.dump_logits:
        out = np.ascontiguousarray(logits.float().cpu().numpy())   # [T, V] float32
        path = str(args.dump_logits)
        path = path if path.endswith(".npy") else path + ".npy"   # what np.save writes
        np.save(path, out)
        res.logits_path = path
    print(json.dumps(asdict(res)) if args.json else res.summary())
    return 0
