"""Synthetic Qwen3-MoE models: a real GGUF file (as llama.cpp lays out qwen3moe) or a pack directly.

Random weights that behave like a trained MoE where streaming cares:
  * every matrix has weight std 1/sqrt(fan_in) (so a unit-RMS input gives unit-RMS outputs), norm
    weights are 1 + N(0, 0.05^2), embeddings N(0, 1): activations stay O(1) through every layer
    (the residual grows only like sqrt(layers));
  * the router `ffn_gate_inp` [E, D] is N(0, 1/D): logits ~ N(0, 1) per expert for a unit-RMS token,
    independent across experts, so top-K of different tokens are nearly independent draws and a chunk
    of T >= 2048 tokens at K=8, E=128 hits every expert (see strata.engine.route_trace).
Expert matrices are drawn as raw block bytes (strata.packs.randblocks), never by quantizing floats.

Time and memory (full qwen3-30b-a3b, Q8_0, ~32 GB): one layer's expert tensor at a time is in RAM
(~0.7 GB); random bytes come from up to 8 threads, so it is disk- and RNG-bound: about 2-4 minutes
on a 16-core host with a fast disk. Dense weights (~2.4 GB bf16) are made one tensor at a time.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.formats.table import get_format
from strata.packs.blobs import assemble_blobs
from strata.archs.names import dense_specs
from strata.packs.randblocks import random_matrix, random_normal
from strata.shapes import ModelShape

NORM_JITTER = 0.05
# q_norm/k_norm weights: 3 makes attention scores ~N(0, 9^2), so a token attends to a few keys as a
# trained model's heads do. With 1, attention is near-uniform: every token receives the same prefix
# mean, the shared part of the residual compounds layer by layer, and by layer ~20 routing collapses
# onto half the experts (measured: hit fraction 0.43 at T=512, E=128, K=8).
QK_NORM_SCALE = 3.0


@dataclass(frozen=True)
class ExpertFormats:
    gate: str = "Q8_0"
    up: str = "Q8_0"
    down: str = "Q8_0"

    @classmethod
    def of(cls, quant: str, gate=None, up=None, down=None) -> "ExpertFormats":
        f = cls(*(get_format(q or quant).name for q in (gate, up, down)))
        return f

    def layout(self, shape: ModelShape) -> BlobLayout:
        return BlobLayout.for_shape(shape, self.gate, self.up, self.down)


@dataclass(frozen=True)
class Mix:
    """A whole model's tensor types: per-layer expert formats and every dense tensor's type
    (llama.cpp's stock mixes: `Mix.stock("Q4_K_M", shape)`, rules in strata.packs.mixes)."""
    name: str
    experts: tuple[ExpertFormats, ...]
    dense: dict

    @classmethod
    def stock(cls, mix: str, shape: ModelShape, imatrix: bool = False) -> "Mix":
        from strata.packs import mixes
        ex = tuple(ExpertFormats(*t) for t in mixes.expert_types(mix, shape, imatrix))
        return cls(mix.strip().upper(), ex, mixes.dense_types(mix, shape, imatrix))


def dense_sigma(name: str, shape: ModelShape) -> float | None:
    """Weight std of a dense tensor, or None for a norm (1 + jitter)."""
    if name.endswith("norm.weight"):
        return None
    if name.endswith(".bias"):   # q/k/v biases, the sigmoid router's correction bias: small
        return 0.02
    if name == "token_embd.weight":
        return 1.0
    if name.endswith("attn_output.weight"):
        return 1.0 / math.sqrt(shape.n_head * shape.head_dim)
    return 1.0 / math.sqrt(shape.d_model)  # q/k/v, router, LM head: fan_in D


def dense_dtype(name: str, dense_type: str) -> str:
    """llama.cpp keeps norms and the router in F32; the other matrices take `dense_type`."""
    if name.endswith("norm.weight") or name.endswith("ffn_gate_inp.weight"):
        return "F32"
    return dense_type


def dense_tensor(name: str, shp, shape: ModelShape, seed, dtype: str,
                 qk_norm_scale: float = QK_NORM_SCALE) -> np.ndarray:
    """Raw bytes uint8 [rows, row_bytes] (or [n*itemsize] for 1-D) of one random dense tensor;
    a block `dtype` (a mix's Q6_K LM head, Q4_K attention...) is drawn as random blocks; q/k
    norm weights are drawn around `qk_norm_scale`."""
    n = int(np.prod(shp))
    sigma = dense_sigma(name, shape)
    if dtype not in ("F32", "F16", "BF16"):
        return random_matrix(dtype, shp[0], shp[1], sigma, seed)
    if sigma is None:
        g = np.random.default_rng(np.random.SeedSequence(seed))
        base = qk_norm_scale if name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")) else 1.0
        w = (base * (1.0 + NORM_JITTER * g.standard_normal(n))).astype(np.float32)
        raw = w.view(np.uint8) if dtype == "F32" else torch.from_numpy(w).to(
            {"BF16": torch.bfloat16, "F16": torch.float16}[dtype]).view(torch.uint8).numpy()
    else:
        raw = random_normal(seed, n, sigma, dtype)
    return raw.reshape(shp[0], -1) if len(shp) == 2 else raw


def expert_sigmas(shape: ModelShape) -> dict[str, float]:
    return {"gate": 1 / math.sqrt(shape.d_model), "up": 1 / math.sqrt(shape.d_model),
            "down": 1 / math.sqrt(shape.d_expert)}


BIAS_SIGMA = 0.1   # expert biases: small beside the O(1) pre-activations they shift


def expert_biases(shape: ModelShape, seed) -> tuple[np.ndarray, ...]:
    """Random fp32 (gate [E, F], up [E, F], down [E, D]) biases of one layer's experts."""
    g = np.random.default_rng(np.random.SeedSequence(seed))
    E, D, F = shape.n_expert, shape.d_model, shape.d_expert
    return tuple((BIAS_SIGMA * g.standard_normal((E, n))).astype(np.float32) for n in (F, F, D))


def expert_matrix(which: str, fmt: str, shape: ModelShape, seed) -> np.ndarray:
    """uint8 [E, rows, row_bytes] of one layer's `which` experts (GGUF's ffn_{which}_exps bytes)."""
    E, D, F = shape.n_expert, shape.d_model, shape.d_expert
    rows, cols = (F, D) if which in ("gate", "up") else (D, F)
    m = random_matrix(fmt, E * rows, cols, expert_sigmas(shape)[which], seed)
    return m.reshape(E, rows, -1)


def _seed(seed: int, k: int) -> list[int]:
    return [int(seed), int(k)]


# ------------------------------------------------------------------------------------ GGUF
# The text synth's BPE merges are learned from (fixed, so every synth file has the same vocabulary).
_CORPUS = (
    "strata reads long prompts through mixture-of-experts models whose experts do not fit in GPU "
    "memory. The experts stream from host memory through a ring of slots while the kernels compute "
    "on quantized blocks; the chunk, the ring, the cache and the scratch are planned together as "
    "one byte budget. The quick brown fox jumps over the lazy dog. Tokens per second, bytes per "
    "token, the copy rate of the bus and the time the compute waits on copies are what it reports. "
    "def prefill(tokens, chunk=4096): return [t + 1 for t in tokens if t >= 0]  # 0123456789\n"
)
SYNTH_MERGES = 400   # at most this many learned merges (the rest of V: unused placeholders)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_tokens() -> list[str]:
    """GPT-2's bytes_to_unicode: byte b as one printable character, in byte order."""
    from tokenizers.pre_tokenizers import ByteLevel
    alphabet = set(ByteLevel.alphabet())
    printable = [b for b in range(256) if chr(b) in alphabet]
    spelled, n = {}, 0
    for b in range(256):
        if b in printable:
            spelled[b] = chr(b)
        else:
            spelled[b] = chr(256 + n)
            n += 1
    assert set(spelled.values()) == alphabet, "the library's byte alphabet is GPT-2's"
    return [spelled[b] for b in range(256)]


def _learned_merges(n: int) -> list[tuple[str, str]]:
    """Up to n byte-level BPE merges learned by the `tokenizers` library from _CORPUS, in order."""
    import json
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    if n <= 0:
        return []
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=256 + n, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_CORPUS] * 4, trainer)
    merges = json.loads(tok.to_str())["model"]["merges"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges][:n]


def _vocab(V: int) -> tuple[list[str], list[int], list[str], int]:
    """A byte-level BPE vocabulary of exactly V tokens (tokens, ggml token types, merges, eos):
    the 256 byte tokens in byte order, merges learned by `tokenizers` from _CORPUS (each merge's
    token after them, in merge order), unused placeholders, then Qwen's three control tokens.
    Below 256 + 3 tokens: the first V byte tokens only (text with other bytes cannot be encoded)."""
    byte_tok = _byte_tokens()
    if V < 256 + len(SPECIALS):
        return byte_tok[:V], [1] * min(V, 256), [], V - 1
    n_free = V - 256 - len(SPECIALS)
    pairs = _learned_merges(min(n_free, SYNTH_MERGES))
    merged = [a + b for a, b in pairs]
    fill = [f"<|synth_{i}|>" for i in range(n_free - len(merged))]
    tokens = byte_tok + merged + fill + SPECIALS
    # placeholders NORMAL (no merge makes them, so text never maps to one), specials CONTROL
    types = [1] * (256 + len(merged) + len(fill)) + [3] * len(SPECIALS)
    return tokens, types, [f"{a} {b}" for a, b in pairs], V - len(SPECIALS)


def synth_tokenizer(V: int) -> dict | None:
    """synth's tokenizer as a pack entry: the GGUF metadata synth_gguf writes, rebuilt by the
    same transformers path a GGUF import takes (so synth_pack and synth_gguf -> pack agree)."""
    from strata.tokenize import ggml_tokenizer
    tokens, types, merges, _ = _vocab(V)
    try:
        import transformers.integrations.gguf as hf_gguf
        hf_gguf.convert_gguf_tokenizer      # transformers >= 5.24 (strata[text])
    except (ImportError, AttributeError):
        # the weights do not need it: a pack without a tokenizer reads --tokens prompts
        print("note: transformers >= 5.24 (pip install 'strata[text]') is not installed: the "
              "synthetic pack carries no tokenizer and reads --tokens prompts", file=sys.stderr)
        return None
    return ggml_tokenizer("qwen3moe", {"tokenizer_type": "gpt2", "pre_tokenizer_type": "qwen2",
                                       "tokens": tokens, "token_type": types, "merges": merges},
                          bos=None, source="synth")


def _per_layer(shape: ModelShape, fmts) -> list[ExpertFormats]:
    per_layer = list(fmts) if isinstance(fmts, (list, tuple)) else [fmts] * shape.n_layer
    if len(per_layer) != shape.n_layer:
        raise StrataError(f"{len(per_layer)} expert formats for {shape.n_layer} layers")
    return per_layer


def _dense_type(name: str, dense_type: str, dense_types: dict | None) -> str:
    return dense_types[name] if dense_types else dense_dtype(name, dense_type)


def _gguf_plan(shape: ModelShape, fmts, dense_type: str, dense_types: dict | None = None):
    """[(name, ggml type name, byte shape, maker(seed) -> uint8 array)] in llama.cpp's order.
    `fmts`: one ExpertFormats or one per layer; `dense_types`: name -> type (a mix) or None."""
    specs = dense_specs(shape)
    per_layer = _per_layer(shape, fmts)
    plan = []

    def dense(name):
        shp = specs[name]
        dt = _dense_type(name, dense_type, dense_types)
        if len(shp) == 2:
            bshape = (shp[0], get_format(dt).row_bytes(shp[1]))
        else:
            bshape = (shp[0] * get_format(dt).block_bytes,)
        plan.append((name, dt, bshape, lambda s, name=name, shp=shp, dt=dt:
                     dense_tensor(name, shp, shape, s, dt)))

    dense("token_embd.weight")
    for i in range(shape.n_layer):
        for n in specs:
            if n.startswith(f"blk.{i}."):
                dense(n)
        for which in ("gate", "up", "down"):
            fmt = get_format(getattr(per_layer[i], which))
            rows, cols = (shape.d_expert, shape.d_model) if which != "down" else \
                (shape.d_model, shape.d_expert)
            plan.append((f"blk.{i}.ffn_{which}_exps.weight", fmt.name,
                         (shape.n_expert, rows, fmt.row_bytes(cols)),
                         lambda s, which=which, fmt=fmt.name: expert_matrix(which, fmt, shape, s)))
    dense("output_norm.weight")
    dense("output.weight")
    return plan


def synth_gguf(path, shape: ModelShape, fmts: ExpertFormats | list[ExpertFormats] | Mix =
               ExpertFormats(), seed: int = 0, dense_type: str = "BF16",
               progress: bool = True) -> Path:
    """Write a qwen3moe GGUF with random weights; tensors are made and written one at a time.
    `fmts`: expert formats for all layers, one per layer, or a whole Mix (dense types too)."""
    import gguf
    if shape.arch != "qwen3moe":
        raise StrataError(f"strata synth writes qwen3moe GGUF files, not {shape.arch}; write "
                          f"a {shape.arch} model as a pack (strata synth --pack)")
    mix = fmts if isinstance(fmts, Mix) else None
    per_layer = _per_layer(shape, mix.experts if mix else fmts)
    for f in per_layer:
        for which in ("gate", "up", "down"):
            name = get_format(getattr(f, which)).name
            if name not in gguf.GGMLQuantizationType.__members__:
                raise StrataError(f"{name} has no GGUF type in gguf-py; write a pack directly "
                                  f"with synth_pack (strata synth --pack)")
    path = Path(path)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    arch = "qwen3moe"
    f0 = per_layer[0]
    w.add_name(f"strata-synth {shape.n_layer}L E{shape.n_expert} "
               + (mix.name if mix else f"{f0.gate}/{f0.up}/{f0.down}"))
    if mix:
        ftype = int(gguf.LlamaFileType[f"MOSTLY_{mix.name}"])
    else:
        ftype = {"Q8_0": 7, "Q4_0": 2, "Q5_0": 8, "Q4_K": 15, "Q6_K": 18, "BF16": 32, "F16": 1,
                 "F32": 0}.get(f0.gate, 7)
    w.add_file_type(ftype)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(shape.max_pos)
    w.add_embedding_length(shape.d_model)
    w.add_feed_forward_length(shape.d_expert * shape.top_k)  # dense width; qwen3moe does not use it
    w.add_block_count(shape.n_layer)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_kv_head)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_expert_count(shape.n_expert)
    w.add_expert_used_count(shape.top_k)
    w.add_expert_feed_forward_length(shape.d_expert)
    tokens, types, merges, eos = _vocab(shape.vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(eos)
    w.add_pad_token_id(eos)
    w.add_bos_token_id(eos)
    w.add_add_bos_token(False)
    w.add_string(f"strata.synth.seed", str(seed))

    plan = _gguf_plan(shape, per_layer, dense_type, mix.dense if mix else None)
    for name, tname, bshape, _ in plan:
        w.add_tensor_info(name, bshape, np.dtype(np.uint8), int(np.prod(bshape)),
                          raw_dtype=gguf.GGMLQuantizationType[tname])
    tmp = path.with_name(path.name + ".partial")
    w.write_header_to_file(tmp)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=sum(int(np.prod(p[2])) for p in plan), unit="B", unit_scale=True,
                   desc=f"synth {path.name}", file=sys.stderr)
    try:
        for k, (name, _, bshape, make) in enumerate(plan):
            arr = make(_seed(seed, k))
            w.write_tensor_data(np.ascontiguousarray(arr).reshape(bshape))
            if bar is not None:
                bar.update(int(np.prod(bshape)))
        w.close()
        tmp.replace(path)
    except BaseException:
        w.close()
        if tmp.exists():
            tmp.unlink()
        raise
    finally:
        if bar is not None:
            bar.close()
    return path


# ------------------------------------------------------------------------------------ pack
def synth_dense(shape: ModelShape, seed: int = 0, dense_type: str = "BF16",
                dense_types: dict | None = None, qk_norm_scale: float = QK_NORM_SCALE
                ) -> dict[str, torch.Tensor]:
    """The random dense weights as torch tensors (same draws as synth_gguf's for the same seed);
    block-format tensors of a mix decoded to F32, as a GGUF -> pack import keeps them."""
    from strata.formats.codec import dequantize
    out = {}
    k = {name: i for i, (name, *_) in enumerate(_gguf_plan(shape, ExpertFormats(), dense_type))}
    tdt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    for name, shp in dense_specs(shape).items():
        dt = _dense_type(name, dense_type, dense_types)
        raw = dense_tensor(name, shp, shape, _seed(seed, k[name]), dt, qk_norm_scale)
        if dt in tdt:
            out[name] = torch.from_numpy(np.ascontiguousarray(raw).reshape(-1)).view(tdt[dt]).view(shp)
        else:
            out[name] = dequantize(raw, dt).reshape(shp)
    return out


def synth_pack(path, shape: ModelShape,
               fmts: ExpertFormats | list[ExpertFormats] | Mix = ExpertFormats(),
               seed: int = 0, dense_type: str = "BF16", progress: bool = True,
               qk_norm_scale: float = QK_NORM_SCALE) -> Path:
    """Write a pack with random weights directly (no GGUF); `fmts` one for all layers, one per
    layer, or a Mix (whose dense tensors are drawn in its types and stored decoded, F32).
    Any format of the table, Q2_0 included; `qk_norm_scale`: see QK_NORM_SCALE. Blobs of one
    layer are in RAM at a time (qwen3-30b-a3b Q8_0: 128 x 5,222,400 B = 0.67 GB); the ~32 GB
    pack takes minutes (see module doc).
    Native: the blobs keep GGUF block layouts."""
    from strata.packs.writer import write_pack
    mix = fmts if isinstance(fmts, Mix) else None
    per_layer = _per_layer(shape, mix.experts if mix else fmts)
    layouts = [f.layout(shape) for f in per_layer]

    def layer(i):
        def make():
            f = per_layer[i]
            mats = [expert_matrix(w, getattr(f, w), shape, _seed(seed, 1_000_000 + 3 * i + j))
                    for j, w in enumerate(("gate", "up", "down"))]
            bias = (expert_biases(shape, _seed(seed, 2_000_000 + i))
                    if layouts[i].bias is not None else None)
            return assemble_blobs(layouts[i], *mats, shape.n_expert, bias=bias)
        return make
    return write_pack(path, shape, synth_dense(shape, seed, dense_type, mix.dense if mix else None,
                                               qk_norm_scale=qk_norm_scale),
                      [layer(i) for i in range(shape.n_layer)], layouts, native=True,
                      source=f"synth seed={seed}", progress=progress,
                      tokenizer=synth_tokenizer(shape.vocab))
