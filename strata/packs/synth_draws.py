"""The random draws of `strata synth` (strata.packs.synth: a pack; strata.packs.synth_gguf: a
GGUF): each dense tensor's and each expert matrix's distribution and bytes, and the formats a
model's experts and dense tensors are written in (ExpertFormats, Mix). See strata.packs.synth's
doc for why these distributions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.formats.table import get_format
from strata.packs.randblocks import random_matrix, random_normal
from strata.shapes import ModelShape

NORM_JITTER = 0.05
# q_norm/k_norm weights: 3 makes attention scores ~N(0, 9^2), so a token attends to a few keys as a
# trained model's heads do. With 1, attention is near-uniform: every token receives the same prefix
# mean, the shared part of the residual compounds layer by layer, and by layer ~20 routing collapses
# onto half the experts (measured: hit fraction 0.43 at T=512, E=128, K=8).
QK_NORM_SCALE = 3.0
# A of a DeltaNet layer's ssm_a = -A (-exp(A_log)), drawn U(1, 16) as transformers initializes it:
# every head's log decay g = ssm_a * softplus(.) is then < 0. A head with ssm_a > 0 grows the
# delta rule's state by e^g a token, past fp32 within a few thousand tokens (NaN rows after).
SSM_A_RANGE = (1.0, 16.0)


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


def dense_sigma(name: str, shape: ModelShape, shp=None) -> float | None:
    """Weight std of a dense tensor, or None for a norm (1 + jitter); a matrix of torch shape
    `shp` [..., in] takes 1/sqrt(in) (given none: q/k/v, router, LM head fan in D)."""
    if name.endswith("norm.weight"):
        return None
    if name.endswith(".bias"):   # q/k/v biases, the sigmoid router's correction bias: small
        return 0.02
    if name == "token_embd.weight":
        return 1.0
    if shp is not None and len(shp) >= 2:
        return 1.0 / math.sqrt(shp[-1])
    if name.endswith("attn_output.weight"):
        return 1.0 / math.sqrt(shape.n_head * shape.head_dim)
    return 1.0 / math.sqrt(shape.d_model)


def dense_dtype(name: str, dense_type: str) -> str:
    """llama.cpp keeps norms, biases, attention sinks, the routers (the shared expert's gate
    too), the DeltaNet conv and every tensor not named .weight (ssm_a) in F32 (its converter's
    rule; its CPU adds a bias only in F32); the other matrices take `dense_type`."""
    if name.endswith(("norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight",
                      "ssm_conv1d.weight", ".bias", "attn_sinks.weight")) \
            or not name.endswith(".weight"):
        return "F32"
    return dense_type


def dense_tensor(name: str, shp, shape: ModelShape, seed, dtype: str,
                 qk_norm_scale: float = QK_NORM_SCALE) -> np.ndarray:
    """Raw bytes uint8 [..., rows, row_bytes] (or [n*itemsize] for 1-D) of one random dense tensor;
    a block `dtype` (a mix's Q6_K LM head, Q4_K attention...) is drawn as random blocks; q/k
    norm weights are drawn around `qk_norm_scale`."""
    n = int(np.prod(shp))
    sigma = dense_sigma(name, shape, shp)
    if name.endswith("ssm_a"):   # -exp(A_log), A ~ U(SSM_A_RANGE), so g < 0
        g = np.random.default_rng(np.random.SeedSequence(seed))
        return (-g.uniform(*SSM_A_RANGE, n)).astype(np.float32).view(np.uint8)
    if dtype not in ("F32", "F16", "BF16"):
        return random_matrix(dtype, n // shp[-1], shp[-1], sigma, seed)
    if sigma is None:
        g = np.random.default_rng(np.random.SeedSequence(seed))
        base = qk_norm_scale if name.endswith(("attn_q_norm.weight", "attn_k_norm.weight")) else 1.0
        w = (base * (1.0 + NORM_JITTER * g.standard_normal(n))).astype(np.float32)
        raw = w.view(np.uint8) if dtype == "F32" else torch.from_numpy(w).to(
            {"BF16": torch.bfloat16, "F16": torch.float16}[dtype]).view(torch.uint8).numpy()
    else:
        raw = random_normal(seed, n, sigma, dtype)
    return raw.reshape(*shp[:-1], -1) if len(shp) >= 2 else raw


def expert_sigmas(shape: ModelShape) -> dict[str, float]:
    return {"gate": 1 / math.sqrt(shape.d_model), "up": 1 / math.sqrt(shape.d_model),
            "down": 1 / math.sqrt(shape.d_expert)}


BIAS_SIGMA = 0.1   # expert biases: small beside the O(1) pre-activations they shift


def expert_bias(shp, seed) -> np.ndarray:
    """One random fp32 expert bias tensor of torch shape `shp` ([E, F] gate/up, [E, D] down):
    N(0, BIAS_SIGMA^2) from `seed` (a GGUF's ffn_*_exps.bias as synth writes it)."""
    g = np.random.default_rng(np.random.SeedSequence(seed))
    return (BIAS_SIGMA * g.standard_normal(shp)).astype(np.float32)


def expert_biases(shape: ModelShape, seeds) -> tuple[np.ndarray, ...]:
    """Random fp32 (gate [E, F], up [E, F], down [E, D]) biases of one layer's experts, each from
    its own seed of `seeds` (three)."""
    E, D, F = shape.n_expert, shape.d_model, shape.d_expert
    return tuple(expert_bias((E, n), s) for n, s in zip((F, F, D), seeds))


def expert_matrix(which: str, fmt: str, shape: ModelShape, seed) -> np.ndarray:
    """uint8 [E, rows, row_bytes] of one layer's `which` experts (GGUF's ffn_{which}_exps bytes)."""
    E, D, F = shape.n_expert, shape.d_model, shape.d_expert
    rows, cols = (F, D) if which in ("gate", "up") else (D, F)
    m = random_matrix(fmt, E * rows, cols, expert_sigmas(shape)[which], seed)
    return m.reshape(E, rows, -1)


def _dense_type(name: str, dense_type: str, dense_types: dict | None) -> str:
    """A mix's type of the tensor (one the file stores split: dense_type), else dense_type's
    rule."""
    if dense_types and name in dense_types:
        return dense_types[name]
    return dense_dtype(name, dense_type)


def _seed(seed: int, k: int) -> list[int]:
    return [int(seed), int(k)]


def _per_layer(shape: ModelShape, fmts) -> list[ExpertFormats]:
    per_layer = list(fmts) if isinstance(fmts, (list, tuple)) else [fmts] * shape.n_layer
    if len(per_layer) != shape.n_layer:
        raise StrataError(f"{len(per_layer)} expert formats for {shape.n_layer} layers")
    return per_layer


