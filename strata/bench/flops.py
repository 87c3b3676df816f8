"""The FLOPs of a prompt chunk's compute, by part, as pure arithmetic on a ModelShape: what the
compute floor (strata.bench.roofline) prices at the measured rates. Each part counts the
architecture's own work, layer by layer (ModelShape.layer_kind, layer_window, mla, linear):

    experts    2·T·K·3·D·F per MoE layer (gate, up, down; leading dense layers route none)
    attention  per softmax-attention layer, its FLOPs per query-key pair times the pairs:
               GQA 4·H·hd (QKᵀ and PV), MLA 2·H·(hd + Hv) (QKᵀ at hd = N + R, PV at Hv);
               query i of the chunk sees P + i + 1 keys, at most W on a sliding layer;
               a linear-attention layer has none
    linear     the chunked gated delta rule of each linear-attention layer (linear_flops)
    dense      every layer's projections, routers, shared experts (and their gate) and
               leading dense FFNs (dense_gemms)

Legend: T tokens of a chunk, P positions cached before it, D hidden, F expert width, E experts,
K top-k, S shared experts, H query heads, Hkv kv heads, hd head width, W a sliding layer's
window; MLA: N no-rope and R rope dims of a q/k head (hd = N + R), Hv value head dim, Lq
q_lora, Lkv kv_lora; linear attention: Hk key heads, Hv value heads, dk / dv their dims,
C = 2·Hk·dk + Hv·dv the conv channels, BT the delta rule's chunk.

Not counted anywhere: norms, RoPE, activations, gates applied elementwise, the short conv,
routing's top-k, biases and the LM head (the experiments read with logits="none").
"""
from __future__ import annotations

from collections.abc import Sequence

from strata.kernels.deltanet.sizes import CHUNK, conv_channels


def routed_flops(rows: int, D: int, F: int) -> float:
    """FLOPs of an expert FFN's three GEMMs over `rows` routed (token, expert) rows:
    2·rows·3·D·F."""
    return 2.0 * rows * 3 * D * F


def expert_flops(shape, T: int, layers: int | None = None) -> float:
    """FLOPs of the routed experts' three GEMMs for T tokens: routed_flops of T·K rows per
    layer, over `layers` MoE layers (default: every MoE layer of the shape; leading dense
    layers route none)."""
    L = len(shape.moe_layers) if layers is None else layers
    return routed_flops(T * shape.top_k, shape.d_model, shape.d_expert) * L


def _gated_hybrid(shape) -> bool:
    """The Qwen3-Next wiring (the shapes with linear-attention layers: strata.models.qwen3_next):
    its full layers gate their output by a second half of q, its shared expert sits behind a
    sigmoid gate [D -> 1]."""
    return shape.linear is not None


def _attention_gemms(shape, layer: int) -> list[tuple[int, int]]:
    """The projections of `layer`'s token mixing (see dense_gemms)."""
    D, H, hd = shape.d_model, shape.n_head, shape.head_dim
    if shape.layer_kind(layer) == "linear":
        lin = shape.linear
        Hv, vd = lin.n_v_head, lin.n_v_head * lin.v_head_dim
        C = conv_channels(lin.n_k_head, Hv, lin.k_head_dim, lin.v_head_dim)
        return [(D, C), (D, vd), (D, Hv), (D, Hv), (vd, D)]
    m = shape.mla
    if m:
        R, Lkv, Hv = m.qk_rope, m.kv_lora, m.v_head_dim
        q = [(D, m.q_lora), (m.q_lora, H * hd)] if m.q_lora else [(D, H * hd)]
        return q + [(D, Lkv + R), (Lkv, H * (hd - R + Hv)), (H * Hv, D)]
    kv = shape.n_kv_head * hd
    q = 2 * H * hd if _gated_hybrid(shape) else H * hd
    return [(D, q), (D, kv), (D, kv), (H * hd, D)]


def dense_gemms(shape, layer: int) -> list[tuple[int, int]]:
    """The dense GEMMs of `layer` as (in, out) widths, each run over the chunk's T rows (what
    the model's wiring multiplies: strata.models.attention, mla, qwen3_next, ffn, the routers;
    tests/test_roofline.py holds them against each architecture's tensors, layer_specs):
    - GQA attention: q [D -> H·hd], k and v [D -> Hkv·hd], o [H·hd -> D]; the hybrids' gated
      full layers q [D -> 2·H·hd] (query and gate);
    - MLA: q [D -> H·hd] (or through q_lora: [D -> Lq], [Lq -> H·hd]), the latent and rope key
      [D -> Lkv + R], the decompression [Lkv -> H·(N + Hv)] of the chunk's own tokens once,
      o [H·Hv -> D];
    - a linear-attention layer (Gated DeltaNet): qkv [D -> C], z [D -> Hv·dv], b and a
      [D -> Hv] each (Qwen3-Next fuses them into one [D -> 2·Hv], the same FLOPs), out
      [Hv·dv -> D];
    - a MoE layer: the router [D -> E] and, with S shared experts, one SwiGLU FFN of width
      S·F (gate and up [D -> S·F], down [S·F -> D]), behind its gate [D -> 1] on the hybrids;
    - a leading dense layer: its SwiGLU FFN of width dense.d_ff (no router, no experts).
    Not here: the routed experts (expert_flops), attention's QKᵀ and PV (attention_flops), the
    delta rule (linear_flops), and MLA's re-decompression of earlier keys per query block (an
    engine choice, not the model's floor)."""
    D, dense = shape.d_model, shape.dense
    g = _attention_gemms(shape, layer)
    if not shape.is_moe_layer(layer):
        return g + [(D, dense.d_ff), (D, dense.d_ff), (dense.d_ff, D)]
    g.append((D, shape.n_expert))
    if dense.shared:
        Fs = dense.shared * shape.d_expert
        g += [(D, Fs), (D, Fs), (Fs, D)]
        if _gated_hybrid(shape):
            g.append((D, 1))
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
    them; a sequence: those layer ids). A plain GQA MoE layer (Qwen3, Mixtral, GPT-OSS,
    MiniMax-M2): 2·T·(D·(H·hd + 2·Hkv·hd) + H·hd·D + D·E)."""
    return 2.0 * T * sum(i * o for l in _layer_ids(shape, layers)
                         for i, o in dense_gemms(shape, l))



def dense_kinds(shape) -> list[tuple[int, int]]:
    """(a layer, how many layers have its dense_gemms) for each distinct list of them, in
    layer order: what dense_rate times once each."""
    kinds: dict[tuple, list[int]] = {}
    for l in range(shape.n_layer):
        kinds.setdefault(tuple(dense_gemms(shape, l)), [l, 0])[1] += 1
    return [(l, n) for l, n in kinds.values()]

# -- attention ----------------------------------------------------------------------------------
def attention_pairs(P: int, T: int, W: int = 0) -> int:
    """Query-key pairs of a T-token chunk after P cached positions: query i sees P + i + 1
    keys, at most W of them on a sliding layer (W > 0). In closed form, exact: the queries
    that see n = P+1 .. P+T keys, those with n <= W counted as the arithmetic series of n,
    the others as W each."""
    if W <= 0:
        return T * P + T * (T + 1) // 2
    first, last = P + 1, P + T
    hi = min(last, W)
    inside = (first + hi) * (hi - first + 1) // 2 if hi >= first else 0
    return inside + W * max(0, last - max(first - 1, W))


def pair_flops(shape, layer: int) -> int:
    """FLOPs per query-key pair of `layer`: GQA 4·H·hd (QKᵀ and PV at hd), MLA as the model
    runs it (expanded: strata.models.mla) 2·H·(N + R) for QKᵀ plus 2·H·Hv for PV, a
    linear-attention layer 0 (no softmax attention: linear_flops counts its work)."""
    if shape.layer_kind(layer) == "linear":
        return 0
    H, hd = shape.n_head, shape.head_dim
    if shape.mla:
        return 2 * H * (hd + shape.mla.v_head_dim)
    return 4 * H * hd


def _attention_ids(shape, layers) -> list[int]:
    """None: every layer; an int n: n layers like the shape's first full-attention layer (no
    window: what a timed full-attention call turns into a rate); else the ids."""
    if layers is None:
        return list(range(shape.n_layer))
    if isinstance(layers, int):
        full = [l for l in range(shape.n_layer)
                if shape.layer_kind(l) == "full" and not shape.layer_window(l)]
        return full[:1] * layers
    return list(layers)


def attention_flops(shape, P: int, T: int, layers: int | Sequence[int] | None = None) -> float:
    """Softmax attention FLOPs of a T-token chunk after P cached positions, layer by layer:
    pair_flops(layer) × attention_pairs(P, T, layer_window(layer)) (a full layer: query i sees
    P + i + 1 keys; a sliding one at most W), over `layers` (default: every layer; an int n:
    n layers like the first full-attention one; a sequence: those layer ids).

    GPT-OSS's sinks are not counted: a sink adds one logit per head per query to the softmax
    row (an exponential and an add, no product), against the row's min(P + i + 1, W) keys at
    4·hd FLOPs each: 1/(4·hd·W) of a full window's work (GPT-OSS: 1/32768)."""
    return float(sum(pair_flops(shape, l) * attention_pairs(P, T, shape.layer_window(l))
                     for l in _attention_ids(shape, layers)))


# -- linear attention ---------------------------------------------------------------------------
def delta_rule_flops_per_token(Hv: int, dk: int, dv: int, BT: int = CHUNK) -> int:
    """FLOPs per token of one Gated DeltaNet layer's chunked delta rule (linear_flops)."""
    return Hv * (6 * dk * dv + 2 * BT * (3 * dk + 2 * dv + BT - 2))


def linear_flops(shape, T: int, layers: int | Sequence[int] | None = None) -> float:
    """FLOPs of the chunked gated delta rule over T tokens in each linear-attention layer, as
    strata's chunked form computes it (strata.kernels.deltanet._chunk_kernel; its torch twin
    .naive), over `layers` (default: every linear layer; an int n: n linear layers; a
    sequence: those layer ids, the full ones counting 0). Products only, each a multiply-add
    = 2 FLOPs; the gating exponentials, masks, the L2 norms of q and k and the output norm are
    not counted (as norms are not elsewhere).

    Per chunk of BT = 64 tokens and per value head (q and k are its key head's), every product
    on the chunk's whole [BT, .] tiles, as the kernels multiply them:
        A = (β k) kᵀ                                  [BT, dk]·[dk, BT]   2·BT²·dk
        (I + A)⁻¹ by forward substitution: rows 2 .. BT-1, each [BT]·[BT, BT]
                                                                          2·BT²·(BT - 2)
        w = (I + A)⁻¹ (β e^G k)                       [BT, BT]·[BT, dk]   2·BT²·dk
        u = (I + A)⁻¹ (β v)                           [BT, BT]·[BT, dv]   2·BT²·dv
        v_new = u - w S                               [BT, dk]·[dk, dv]   2·BT·dk·dv
        o = (q e^G) S                                 [BT, dk]·[dk, dv]   2·BT·dk·dv
          + tril(q kᵀ ⊙ decay) v_new                  q kᵀ: 2·BT²·dk, ·v_new: 2·BT²·dv
        S <- S e^(G_last) + (k e^(G_last - G))ᵀ v_new [dk, BT]·[BT, dv]   2·BT·dk·dv
    per chunk:  6·BT·dk·dv + 2·BT²·(3·dk + 2·dv + BT - 2)
    per token:  6·dk·dv + 2·BT·(3·dk + 2·dv + BT - 2), times Hv heads
                (delta_rule_flops_per_token; Qwen3-Next, Hv 32, dk = dv = 128: 6.02M FLOPs
                a token a layer)
    T tokens count T times the per-token figure: a last chunk shorter than BT is counted by
    its tokens, not by the padded tile the kernel runs."""
    lin = shape.linear
    if lin is None:
        return 0.0
    if layers is None:
        n = sum(shape.layer_kind(l) == "linear" for l in range(shape.n_layer))
    elif isinstance(layers, int):
        n = layers
    else:
        n = sum(shape.layer_kind(l) == "linear" for l in layers)
    return float(T * n * delta_rule_flops_per_token(lin.n_v_head, lin.k_head_dim,
                                                    lin.v_head_dim))
