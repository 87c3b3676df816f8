"""The FLOPs of a prompt chunk's compute, by part, as pure arithmetic on a ModelShape: what the
compute floor (strata.bench.roofline) prices at the measured rates.

Legend: T tokens of a chunk, P positions cached before it, D hidden, F expert width, E experts,
K top-k, S shared experts, H query heads, Hkv kv heads, hd head width.
"""
from __future__ import annotations

from collections.abc import Sequence


def expert_flops(shape, T: int, layers: int | None = None) -> float:
    """FLOPs of the routed experts' three GEMMs for T tokens: 2·T·K·3·D·F per layer, over
    `layers` MoE layers (default: every MoE layer of the shape; leading dense layers route
    none)."""
    L = len(shape.moe_layers) if layers is None else layers
    return 2.0 * T * shape.top_k * 3 * shape.d_model * shape.d_expert * L


def dense_gemms(shape, layer: int) -> list[tuple[int, int]]:
    """The dense GEMMs of `layer` as (in, out) widths, each run over the chunk's T rows (what
    the model's wiring multiplies; strata.models.attention, mla, ffn, the routers):
    - attention: q [D -> H·hd], k and v [D -> Hkv·hd], o [H·hd -> D]; MLA instead q
      [D -> H·hd] (or through q_lora: [D -> Lq], [Lq -> H·hd]), the latent and rope key
      [D -> Lkv + R], the decompression [Lkv -> H·(N + Hv)] of the chunk's own tokens once,
      o [H·Hv -> D];
    - a MoE layer: the router [D -> E] and, with S shared experts, one SwiGLU FFN of width
      S·F (gate and up [D -> S·F], down [S·F -> D]);
    - a leading dense layer: its SwiGLU FFN of width dense.d_ff (no router, no experts).
    Not here: the routed experts (expert_flops), attention's QKᵀ and PV (attention_flops), and
    MLA's re-decompression of earlier keys per query block (an engine choice, not the model's
    floor)."""
    D, H, hd = shape.d_model, shape.n_head, shape.head_dim
    m, dense = shape.mla, shape.dense
    if m:
        R, Lkv, Hv = m.qk_rope, m.kv_lora, m.v_head_dim
        q = [(D, m.q_lora), (m.q_lora, H * hd)] if m.q_lora else [(D, H * hd)]
        g = q + [(D, Lkv + R), (Lkv, H * (hd - R + Hv)), (H * Hv, D)]
    else:
        kv = shape.n_kv_head * hd
        g = [(D, H * hd), (D, kv), (D, kv), (H * hd, D)]
    if not shape.is_moe_layer(layer):
        return g + [(D, dense.d_ff), (D, dense.d_ff), (dense.d_ff, D)]
    g.append((D, shape.n_expert))
    if dense.shared:
        Fs = dense.shared * shape.d_expert
        g += [(D, Fs), (D, Fs), (Fs, D)]
    return g


def _layer_ids(shape, layers) -> list[int]:
    """None: every layer; an int n: n MoE layers (as expert_flops counts them); else the ids."""
    if layers is None:
        return list(range(shape.n_layer))
    if isinstance(layers, int):
        return [shape.moe_layers[0]] * layers if layers else []
    return list(layers)


def dense_flops(shape, T: int, layers: int | Sequence[int] | None = None) -> float:
    """FLOPs of the dense layers for T tokens: 2·T·in·out over each of `dense_gemms`, over
    `layers` (default: every layer of the shape; an int n: n MoE layers, as expert_flops counts
    them; a sequence: those layer ids). A plain GQA MoE layer (Qwen3, Mixtral, GPT-OSS):
    2·T·(D·(H·hd + 2·Hkv·hd) + H·hd·D + D·E)."""
    return 2.0 * T * sum(i * o for l in _layer_ids(shape, layers)
                         for i, o in dense_gemms(shape, l))


def attention_flops(shape, P: int, T: int, layers: int | None = None) -> float:
    """Causal attention FLOPs of a T-token chunk after P cached positions: query i sees
    P + i + 1 keys, 4·H·hd FLOPs per query-key pair, over `layers` layers (default: all)."""
    L = shape.n_layer if layers is None else layers
    return 4.0 * shape.n_head * shape.head_dim * (T * P + T * (T + 1) / 2) * L
