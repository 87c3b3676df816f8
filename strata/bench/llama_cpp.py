"""llama.cpp beside strata on one GGUF: what its GPU part holds under `-ncmoe N`, the smallest N
that keeps it within a VRAM budget, and its llama-bench output read back.

Legend: L layers, N the layers whose experts `-ncmoe N` keeps in host memory (the first N),
ctx the context llama-bench allocates (prompt + generated tokens).

The GPU part of a llama.cpp run with every layer offloaded (`-ngl 99`) and `-ncmoe N`:
    weights     every tensor but the experts of the first N layers (`blk.<l>.ffn_*_exps*`)
    KV          per layer with attention, K and V rows of ctx tokens (f16 unless -ctk/-ctv)
    compute     llama.cpp's own buffer (its size depends on -ub and the graph; read from its log)
`gpu_part` estimates the first two from the file; `buffers_from_log` reads what llama.cpp
actually allocated ("CUDA0 model buffer size = X MiB" and its KV and compute lines), which is
what a budget is judged by.
"""
from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path

from strata.errors import StrataError

_EXPS = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps(\.|$)")
_BUF = re.compile(r"(CUDA\d+|CPU|CUDA_Host)\s+(model|KV|compute|RS)\s+buffer size\s*=\s*"
                  r"([0-9.]+)\s*MiB")


@dataclass(frozen=True)
class GgufSizes:
    """Bytes of a GGUF's tensors: `experts[l]` the routed experts of layer l, `rest` all
    others; `kv_row` the K + V bytes one token takes in f16 over every layer with attention."""
    n_layer: int
    experts: tuple[int, ...]
    rest: int
    kv_row: int

    def gpu_part(self, ncmoe: int, ctx: int) -> int:
        """Weights and KV on the GPU under -ncmoe `ncmoe` at context `ctx` (compute aside)."""
        if not 0 <= ncmoe <= self.n_layer:
            raise StrataError(f"-ncmoe must be within 0..{self.n_layer}, got {ncmoe}")
        return self.rest + sum(self.experts[ncmoe:]) + self.kv_row * ctx


def _field(reader, key: str):
    f = reader.get_field(key)
    return None if f is None else f.contents()


def gguf_sizes(path: str | Path) -> GgufSizes:
    """Read the tensor sizes and the attention shape of a GGUF (gguf-py, no data read)."""
    import gguf
    try:
        r = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as e:
        raise StrataError(f"{path}: not a readable GGUF ({e}); give a GGUF file") from None
    arch = _field(r, "general.architecture")
    need = [f"{arch}.block_count", f"{arch}.embedding_length", f"{arch}.attention.head_count"]
    missing = [k for k in need if _field(r, k) is None] if arch else ["general.architecture"]
    if missing:
        raise StrataError(f"{path}: the GGUF lacks {', '.join(missing)}; give a model GGUF as "
                          f"llama.cpp's converter writes it")
    L = int(_field(r, f"{arch}.block_count"))
    experts = [0] * L
    rest = 0
    for t in r.tensors:
        m = _EXPS.match(t.name)
        if m:
            experts[int(m.group(1))] += int(t.n_bytes)
        else:
            rest += int(t.n_bytes)
    heads = _field(r, f"{arch}.attention.head_count")
    kv_heads = _field(r, f"{arch}.attention.head_count_kv")
    kv_heads = heads if kv_heads is None else kv_heads
    d = int(_field(r, f"{arch}.embedding_length"))
    per_layer = kv_heads if isinstance(kv_heads, list) else [kv_heads] * L
    per_head = heads[0] if isinstance(heads, list) else heads
    k_len = _field(r, f"{arch}.attention.key_length") or d // int(per_head)
    v_len = _field(r, f"{arch}.attention.value_length") or d // int(per_head)
    lora = _field(r, f"{arch}.attention.kv_lora_rank")
    if lora:        # MLA: llama.cpp caches the latent and the rope key per token (one "head")
        rope = _field(r, f"{arch}.rope.dimension_count") or 64
        row = L * (int(lora) + int(rope)) * 2
    else:
        row = sum(int(h) * (int(k_len) + int(v_len)) * 2 for h in per_layer if int(h) > 0)
    return GgufSizes(L, tuple(experts), rest, row)


def pinned_host(sizes: GgufSizes, ncmoe: int) -> int:
    """Bytes llama.cpp copies into pinned host memory under `-lm none` at -ncmoe `ncmoe`: the
    experts of the first `ncmoe` layers (with the file mapped they stay in the mapping)."""
    return sum(sizes.experts[:ncmoe])


def ncmoe_for_budget(sizes: GgufSizes, budget: int, ctx: int, compute: int) -> int:
    """The smallest N whose weights + KV at `ctx` + `compute` bytes fit `budget` (L when even
    no expert fits: then the dense part alone must, else one line says so)."""
    for n in range(sizes.n_layer + 1):
        if sizes.gpu_part(n, ctx) + compute <= budget:
            return n
    need = sizes.gpu_part(sizes.n_layer, ctx) + compute
    raise StrataError(f"llama.cpp's dense part, KV at {ctx} tokens and compute buffer take "
                      f"{need / 2**30:.2f} GiB, over the {budget / 2**30:.2f} GiB budget; give "
                      f"a larger budget or a shorter prompt")


def ncmoe_after(sizes: GgufSizes, ncmoe: int, seen: int, budget: int, ctx: int) -> int:
    """The next -ncmoe to try after a run at `ncmoe` allocated `seen` bytes on the GPU, over
    `budget`: the smallest M > ncmoe whose GPU weights are lighter than ncmoe's by at least the
    excess, by the file's sizes (the KV and compute buffers llama.cpp logged do not depend on
    M). Where no M covers it by the sizes (the log and the file disagree), ncmoe + 1. Each run
    over the budget loads the model once, so the jump saves a load per layer (qwen3-30b-a3b
    Q8_0 at -ub 8192: 37 to 42 in one step, not five)."""
    excess = seen - budget
    have = sizes.gpu_part(ncmoe, ctx)
    for m in range(ncmoe + 1, sizes.n_layer + 1):
        if have - sizes.gpu_part(m, ctx) >= excess:
            return m
    return ncmoe + 1


def fit_ncmoe(sizes: GgufSizes, start: int, run_at, budget: int, ctx: int) -> int | None:
    """-ncmoe from `start` until llama.cpp's logged GPU bytes fit `budget`. `run_at(n)` runs it
    and gives those bytes (None: the run failed, and the search stops). After a run over the
    budget the next N is ncmoe_after's; a fit reached by a jump is tried one lower while its
    logged bytes say that one would fit too (where the log and the file's sizes disagree), so
    llama.cpp keeps every expert layer the budget holds. The smallest fitting N run, or None."""
    n, over, fit = start, start - 1, None
    while over < n <= sizes.n_layer:
        seen = run_at(n)
        if seen is None:
            return fit
        if seen > budget:
            if fit is not None:         # the lower try did not fit: the jump's landing stands
                return fit
            over, n = n, ncmoe_after(sizes, n, seen, budget, ctx)
            continue
        fit = n
        lower = sizes.gpu_part(n - 1, ctx) - sizes.gpu_part(n, ctx) if n > 0 else 0
        if n - 1 > over and seen + lower <= budget:
            n -= 1
            continue
        return fit
    return fit


def buffers_from_log(log: str) -> dict[str, float]:
    """{"CUDA0 model": MiB, "CUDA0 KV": MiB, ...} from llama.cpp's log lines (-v); a buffer
    named twice (llama-bench builds a context per test) keeps its largest size."""
    out: dict[str, float] = {}
    for dev, kind, mib in _BUF.findall(log):
        key = f"{dev} {kind}"
        out[key] = max(out.get(key, 0.0), float(mib))
    return out


def gpu_mib(buffers: dict[str, float]) -> float:
    """MiB llama.cpp allocated on the GPUs (host-side buffers aside)."""
    return sum(v for k, v in buffers.items() if k.startswith("CUDA") and
               not k.startswith("CUDA_Host"))


def bench_rows(text: str) -> list[dict]:
    """llama-bench -o csv's rows: n_prompt, n_gen, avg_ts, stddev_ts and the rest as strings."""
    rows = list(csv.DictReader(io.StringIO(text.strip())))
    if not rows or "avg_ts" not in rows[0]:
        raise StrataError("llama-bench gave no CSV rows (run it with -o csv)")
    return rows
