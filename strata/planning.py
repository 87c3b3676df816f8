"""The assembler: a model shape and its kernels turned into the numbers the memory manager sizes.

strata.memory knows no model and no kernel. This module knows both and hands memory what it
needs, so `strata plan`, the prefill engine and the tests build their plans the same way:

    model_sizes(shape, kv)    Sizes: the layout's dims (TKP from the expert GEMM's BLOCK_M),
                              each layer's KV bytes resident and in host memory (the shape's own
                              count in the KV dtype, of the tokens strata.models.kv.
                              layer_kv_tokens keeps: a full layer split at the resident window,
                              a sliding one its window's last W - 1, all resident; a
                              linear-attention layer its recurrent state instead,
                              strata.models.layer_state), dense bytes
    layout_spec(ffn, kv, shape)   the prompt path's buffers for the expert FFN `ffn` (the
                              buffers its object declares: strata.models.moe.ExpertFFNs; the KV
                              staging buffer when part of the KV lives in host memory, the
                              attention's int8 expansion scratch when the KV is int8, MLA's
                              key-block scratch when the shape is MLA, the delta rule's
                              chunk scratch when it has linear-attention layers)
    prompt_layout(shape, max_blob, ...)   a PromptLayout of those
    scratch_reserve(shape, devices, ffn, slab, decoded)   the slab's bytes beyond the layout (or None)

Legend of the layout's symbols: T tokens, D hidden, E experts, K top-k, F expert width,
QD = H*hd (query width), KVD = Hkv*hd (key/value width), TK = T*K routed (token, expert) pairs,
TC = ceil(T / 64) the delta rule's chunks,
TKP = T*K + min(E, T*K)*(BM-1) routed pairs after padding each routed expert's group to a
multiple of BM rows, BM the expert GEMM's BLOCK_M for the chunk (strata.kernels.moe.tiles.
block_m_for; a launch over fewer tokens picks no larger one; a pinned taller tile is refused by the
GEMM's workspace check), E1 = E + 1 (group offsets with an end marker), G experts per streamed pass
(strata.memory.layout.pass_experts), BB bytes of one expert decoded to bf16 (decoded_blob_bytes:
strata.blob.bf16_layout's size, biases included), KS tokens of one full layer's host-held KV
(the longest prompt's tokens outside the resident window: KVPolicy.host_tokens; 0 when no
layer holds host KV, as when every layer slides),
KVB bytes of one token's keys and values in one layer (kv_token_bytes of the KV dtype),
KX rows of int8 KV expanded to bf16 per attention launch and QS fp32 values of carried softmax
state per chunk token (strata.kernels.attention.scratch: expand_rows, state_floats); MR keys and
MQ queries of MLA's blocked attention, MKD = H*hd and MVD = H*W values a key (W = Hv, or
max(hd, Hv) with the flash backend's padded values), MS fp32 values of
state a query, MLC = Lkv + R values of an int8 latent block dequantized (or, with host-held KV,
a block gathered from the staged and resident segments)
(strata.models.mla_scratch: mla_scratch_rows, mla_state_floats, mla_value_width, at the
launch in force, strata.models.mla_launch; S is the longest prompt, or T without a KV policy),
DFF2 twice a leading dense layer's FFN width (its gate and up products; 0 without such layers),
QG = 2·QD a gated attention layer's query and output gate projected together,
DN_<name> bytes of one row of the delta rule's buffer <name> (strata.kernels.deltanet.sizes
.chunk_buffers of the launch in force, in the activations' dtype beside the KV's).

To add a buffer, add a `Buf` to ACTIVATIONS (or pass a LayoutSpec of your own, with any new
symbol in `dims_for`): the carve, the scan, `strata plan` and the tests all follow.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from strata.bench.flops import attention_flops, dense_flops, linear_flops
from strata.blob import BlobLayout, bf16_layout
from strata.errors import StrataError
from strata.kernels.attention.kv_int8 import KV_DTYPES
from strata.kernels.attention.flash_prefix import flash_rows, flash_state_floats, prefix_route
from strata.kernels.attention.scratch import expand_rows, needs_state, state_floats
from strata.kernels.deltanet.launch import delta_launch
from strata.kernels.deltanet.sizes import CHUNK as DELTA_CHUNK, Buffer, chunk_buffers
from strata.kernels.moe.tiles import block_m_for, padded_rows
from strata.memory.layout import Buf, LayoutSpec, Phase, PromptLayout, pass_experts
from strata.memory.pool import SlabPool
from strata.memory.sizes import Sizes
from strata.models.block_weight import decoded_bytes, phase_of
from strata.models.kv import kv_windows, layer_kv_tokens
from strata.models.layer_state import state_bytes, state_dtype
from strata.models.mla_scratch import mla_scratch_rows, mla_state_floats, mla_value_width
from strata.models.mla_launch import block_grows, mla_launch
from strata.models.moe import DECODE_BUF, EXPERT_FFNS, ExpertFFNs
from strata.archs.names import global_specs, layer_specs
from strata.shapes import Mla, ModelShape

DENSE_BYTES = 2  # dense weights on the GPU: bf16, norms included

bf16, f32, i32, u8 = torch.bfloat16, torch.float32, torch.int32, torch.uint8

ACTIVATIONS = LayoutSpec(
    persistent=(
        Buf("x", bf16, ("T", "D"), "residual stream, the chunk embedded into it, carried from "
                                   "layer to layer"),
        Buf("xn", bf16, ("T", "D"), "RMS-normed input of the current block"),
    ),
    phases=(
        Phase("attention", (
            Buf("q", bf16, ("T", "QD"), "queries (q-norm and RoPE applied in place); a linear "
                                        "layer's conv q and k, then its gated norm"),
            Buf("k", bf16, ("T", "KVD"), "this chunk's keys, before they join the KV cache; "
                                         "MLA's x Wkva^T (its latent and rope key)"),
            Buf("v", bf16, ("T", "KVD"), "this chunk's values; MLA's normed latent c"),
            Buf("attn", bf16, ("T", "QD"), "GQA's raw q projection, then its attention output; "
                                           "a gated layer's output gate; MLA's compressed "
                                           "query and its norm, then its output; a linear "
                                           "layer's conv v"),
        )),
        Phase("moe", (
            Buf("router_logits", f32, ("T", "E"), "router logits, fp32 for a stable softmax"),
            Buf("topk_ids", i32, ("T", "K"), "chosen experts per token"),
            Buf("topk_weights", f32, ("T", "K"), "their (renormalized) routing weights"),
            Buf("sorted_token", i32, ("TKP",), "(token*K + k) ids grouped by expert, BM-padded"),
            Buf("expert_offsets", i32, ("E1",), "start of each expert's group in sorted_token"),
            Buf("h", bf16, ("TKP", "F"), "expert intermediate silu(gate x) * up x, BM-padded rows"),
            Buf("yk", f32, ("TK", "D"), "down projection per routed pair, weighted, before the "
                                       "sum over K"),
            Buf("moe_out", f32, ("T", "D"), "expert output accumulated in fp32 over the passes"),
        )),
    ),
)

# A leading dense layer's FFN (DeepSeek-V3's first three, GLM-4.5's first) computes its gate
# and up products here, silu(gate)·up in place of gate, on a read in the carve's dtype: its own
# phase, after the attention and instead of the experts, so it shares their bytes.
DENSE_FFN_BUF = Buf("dense_gu", bf16, ("T", "DFF2"),
                    "a leading dense layer's gate and up products; silu(gate) * up in place")

# Host-held KV streams back into this buffer, one layer at a time, for the attention of each
# later chunk (its keys/values and, int8, their scales: KVB bytes a token). Persistent, not in
# the attention phase: the next layer's copy lands while this layer's experts compute.
KV_STAGE_BUF = Buf("kv_stage", torch.uint8, ("KS", "KVB"),
                   "one layer's host-held KV streamed back for the attention")

# int8 KV: the attention expands the codes of up to KX prefix tokens to bf16 (exact, no scales)
# and runs its bf16 tile path; a longer prefix goes in pieces that carry the online softmax's
# state (acc, m, l) in attn_state. Live only inside one layer's attention: the attention phase.
KV_EXPAND_BUFS = (
    Buf("kv_expand_k", bf16, ("KX", "KVD"), "int8 key codes of a prefix piece, as bf16"),
    Buf("kv_expand_v", bf16, ("KX", "KVD"), "int8 value codes of a prefix piece, as bf16"),
)
ATTN_STATE_BUF = Buf("attn_state", f32, ("T", "QS"),
                     "online-softmax state between the launches of a long int8 prefix")

# bf16 KV at a head width whose prefix goes to FlashAttention-2 blocks (strata.kernels.attention.
# flash_prefix.prefix_route): a query block's merged output and log-sum-exp between the blocks.
# Live only inside one layer's attention: the attention phase.
ATTN_FLASH_BUF = Buf("attn_flash", f32, ("FQ", "FS"),
                     "a query block's merged output and log-sum-exp over flash's key blocks")

# Qwen3.5 / Qwen3-Next's gated full-attention layers project the query and the output gate in
# one GEMM (each head's q, then its gate): q is normed out of it into the carve's q, the gate
# stays until the attention's output (in attn) is gated. Live only inside one layer's
# attention: the attention phase.
GATED_Q_BUF = Buf("qg", bf16, ("T", "QG"), "a gated attention layer's query and output gate; "
                  "a linear layer's q / k / v projection, then the rule's output and gate z")

# MLA: the expanded attention decompresses a block of keys at a time into mla_k / mla_v and
# merges the blocks of a query block in mla_state (strata.models.mla_scratch). Live only inside
# one layer's attention: the attention phase.
MLA_SCRATCH_BUFS = (
    Buf("mla_k", bf16, ("MR", "MKD"), "a block of MLA keys decompressed (c Wuk^T | k_pe)"),
    Buf("mla_v", bf16, ("MR", "MVD"), "that block's values (c Wuv^T)"),
    Buf("mla_state", f32, ("MQ", "MS"), "a query block's merged output and log-sum-exp"),
)
# MLA with int8 KV: a key block's latent and rope key dequantized before the decompression;
# with a host-held window (bf16 too) a key block spanning the staged and resident keys gathered.
MLA_LATENT_BUF = Buf("mla_c", bf16, ("MR", "MLC"),
                     "a block of MLA latents: int8 dequantized, or gathered from two segments")


def deltanet_buffers(shape: ModelShape, T: int, kv: "KVPolicy | None" = None,
                     act_itemsize: int | None = None) -> tuple[Buffer, ...]:
    """The scratch one linear-attention layer's delta rule takes for a chunk of T tokens
    (strata.kernels.deltanet.sizes.chunk_buffers with the q/k L2 norm and the launch in force:
    the one count), at the activations' itemsize: `act_itemsize` (the engine's dense dtype,
    strata.engine.engine_config.dense_dtype), else the one beside `kv`'s dtype."""
    lin, L = shape.linear, delta_launch()
    if act_itemsize is None:
        act_itemsize = state_itemsize(kv.dtype if kv is not None else "bf16")
    return chunk_buffers(T, lin.n_k_head, lin.n_v_head, lin.k_head_dim, lin.v_head_dim,
                         qk_l2norm=True, split=L.split, backend=L.resolved(act_itemsize),
                         itemsize=act_itemsize)


def deltanet_bufs(shape: ModelShape, kv: "KVPolicy | None" = None,
                  act_itemsize: int | None = None) -> tuple[Buf, ...]:
    """Those buffers in the layout as bytes: dn_<name> uint8 [rows, DN_<name>] with rows T
    (tokens), TC (chunks of 64) or none (a fixed size) as the buffer counts them, live only
    inside one layer's attention: the attention phase. The launcher views them in its own
    dtypes (strata.kernels.deltanet.chunk.take_buffer), taken from the carve
    (strata.models.layer_state.RecurrentStates.scratch). `kv` and `act_itemsize` as
    deltanet_buffers takes them: the backend they resolve to names the buffers, and dims_for
    sizes them from the same two (fla's and strata's names differ)."""
    return tuple(Buf(f"dn_{b.name}", u8,
                     (f"DN_{b.name}",) if b.rows == "1" else (b.rows, f"DN_{b.name}"),
                     "a linear-attention layer's delta-rule scratch (kernels/deltanet/sizes)")
                 for b in deltanet_buffers(shape, 1, kv, act_itemsize))


def state_itemsize(kv: str) -> int:
    """Bytes of one conv-state value beside KV dtype `kv` (strata.models.layer_state.state_dtype:
    fp32 beside fp32 KV, else bf16)."""
    return state_dtype(kv, torch.bfloat16).itemsize


@dataclass(frozen=True)
class KVPolicy:
    """How a prompt's KV is kept: dtype (bf16 | int8) and the resident window (tokens per layer
    in VRAM; None: all), for prompts up to `max_prompt` tokens."""
    dtype: str = "bf16"
    resident: int | None = None
    max_prompt: int = 0

    def __post_init__(self):
        if self.dtype not in KV_DTYPES:
            raise StrataError(f"--kv must be one of {', '.join(KV_DTYPES)}, got {self.dtype!r}")
        if self.resident is not None and self.resident < 1:
            raise StrataError(f"--kv-resident must be at least 1 token, got {self.resident}")

    def resident_tokens(self, n_tokens: int, window: int = 0) -> int:
        """Tokens of a prompt of n_tokens whose KV a layer with this sliding `window` (0: full)
        keeps in VRAM (strata.models.kv.layer_kv_tokens, the count PromptKV allocates)."""
        return layer_kv_tokens(n_tokens, window, self.resident)[0]

    def host_tokens(self, n_tokens: int, window: int = 0) -> int:
        """Tokens of a prompt of n_tokens whose KV such a layer keeps in host memory (a full
        layer's oldest ones; none of a sliding layer's)."""
        return layer_kv_tokens(n_tokens, window, self.resident)[1]

    @property
    def streams(self) -> bool:
        return self.host_tokens(self.max_prompt) > 0

    @property
    def expands(self) -> bool:
        """int8 KV: the attention's expansion scratch is part of the layout."""
        return self.dtype == "int8" and self.max_prompt > 0


def layout_spec(ffn: ExpertFFNs = EXPERT_FFNS["kernel"], kv: KVPolicy | None = None,
                shape: ModelShape | None = None, act: torch.dtype | None = None) -> LayoutSpec:
    """The prompt path's buffers when the experts run through `ffn` (the buffers it declares, in
    the "moe" phase) and the KV is kept as `kv` says (a staging buffer when some of it lives in
    host memory), with MLA's attention scratch when `shape` is MLA; `act` the dtype the engine
    computes in (model_sizes' own: the delta rule's buffers follow it)."""
    spec = ACTIVATIONS
    for b in ffn.buffers:
        spec = spec.with_buffer(b, "moe")
    mla = shape is not None and shape.mla
    if mla:   # MLA's own int8 path dequantizes a key block into mla_c (no per-head expansion);
        # a host-held window gathers a block spanning the staged and resident keys there
        latent = kv is not None and (kv.dtype == "int8" or kv.streams)
        for b in MLA_SCRATCH_BUFS + ((MLA_LATENT_BUF,) if latent else ()):
            spec = spec.with_buffer(b, "attention")
    if kv is not None and kv.expands and not mla:
        for b in KV_EXPAND_BUFS:
            spec = spec.with_buffer(b, "attention")
        if needs_state(kv.max_prompt):
            spec = spec.with_buffer(ATTN_STATE_BUF, "attention")
    # only where the engine's own KV attends (a resident window: PromptKV); the model's own
    # cache attends all its keys through torch's flash op (prompt_plan.prefix_path)
    if (kv is not None and not mla and shape is not None and kv.max_prompt > 0
            and kv.resident is not None and prefix_route(shape.head_dim, kv.dtype) != "triton"):
        spec = spec.with_buffer(ATTN_FLASH_BUF, "attention")
    if shape is not None and shape.linear is not None:
        for b in deltanet_bufs(shape, kv, act.itemsize if act is not None else None):
            spec = spec.with_buffer(b, "attention")
        spec = spec.with_buffer(GATED_Q_BUF, "attention")
    if shape is not None and shape.dense.lead:
        spec = spec.with_buffer(DENSE_FFN_BUF, "dense")
    return spec.with_buffer(KV_STAGE_BUF) if kv is not None and kv.streams else spec


def decoded_blob_bytes(shape: ModelShape) -> int:
    """BB: one of `shape`'s experts decoded to BF16 (the decode buffer's slot), from the same
    bf16_layout the decoded FFN carves its buffer by (bias slot included for biased experts);
    the source formats do not change it."""
    return bf16_layout(BlobLayout.for_shape(shape, "BF16")).size


def mla_dims(T: int, kv: KVPolicy | None, block: int | None = None) -> dict[str, int]:
    """MLA's scratch rows for a chunk of T tokens at attention block `block` (the launch's in
    force when None): MR key rows, MQ query rows (strata.models.mla_scratch.mla_scratch_rows)
    over the longest prompt's keys, and MB the block itself, which the engine's attention runs
    at (strata.models.mla_scratch.MLAScratch.of_carve)."""
    block = mla_launch().block if block is None else block
    mr, mq = mla_scratch_rows(T, max(T, kv.max_prompt if kv is not None else 0), block)
    return {"MR": mr, "MQ": mq, "MB": block}


def mla_wider(shape: ModelShape, kv: KVPolicy | None, dims: Mapping[str, int]
              ) -> dict[str, int] | None:
    """Sizes.wider for MLA: dims at twice their attention block, while the block is short of the
    chunk and no launch is pinned (strata.models.mla_launch.block_grows); else None. A block as
    long as the chunk launches once a key block and merges nothing (on the H100 at ee7fbd7, five
    DeepSeek-V3 layers read resident at T 32,768: 851.8 ms at B 4096, 767.7 at 32,768)."""
    if not shape.mla or dims["MB"] >= dims["T"] or not block_grows():
        return None
    return {**dims, **mla_dims(dims["T"], kv, 2 * dims["MB"])}


def dims_for(shape: ModelShape, T: int, block_m: int | None = None, ring: int = 0,
             batch: int | None = None, kv: KVPolicy | None = None,
             act_itemsize: int | None = None) -> dict[str, int]:
    """Values of the layout's symbols for a chunk of T tokens. TKP pads each of the (at most
    min(E, T*K)) routed experts' groups to `block_m` rows (default: the expert GEMM's BLOCK_M
    for this chunk); monotone in T, as BLOCK_M only grows with T. MLA's rows at the launch's
    block (mla_dims; the carve may widen it: mla_wider)."""
    E, K = shape.n_expert, shape.top_k
    bm = block_m if block_m is not None else block_m_for(T, K, E)
    qd, kvd = shape.n_head * shape.head_dim, shape.n_kv_head * shape.head_dim
    if shape.mla:   # the chunk's query and output at the wider of its head widths; k and v
        # hold the latent projection x Wkva^T and its normed latent (strata.models.mla: the
        # blocked attention decompresses keys into mla_k / mla_v, never the whole chunk's)
        qd = shape.n_head * max(shape.head_dim, shape.mla.v_head_dim)
        kvd = shape.mla.kv_lora + shape.mla.qk_rope
    m = shape.mla or Mla()   # no MLA: its scratch symbols are 0
    dn = ({f"DN_{b.name}": b.row_bytes for b in deltanet_buffers(shape, 1, kv, act_itemsize)}
          if shape.linear is not None else {})
    return dn | {"T": T, "D": shape.d_model, "E": E, "E1": E + 1, "K": K, "F": shape.d_expert,
            "QD": qd, "KVD": kvd, "QG": 2 * qd,
            "TK": T * K, "TKP": padded_rows(T, K, E, bm), "TC": -(-T // DELTA_CHUNK),
            "G": pass_experts(ring, batch), "BB": decoded_blob_bytes(shape),
            "KS": max((kv.host_tokens(kv.max_prompt, w) for w in kv_windows(shape)), default=0)
            if kv is not None else 0,
            "KVB": shape.kv_bytes(1, kv.dtype if kv is not None else "bf16"),
            "KX": expand_rows(kv.max_prompt) if kv is not None else 0,
            "QS": state_floats(shape.n_head, shape.head_dim),
            # a prompt of one chunk has no prefix: no flash state
            "FQ": flash_rows(T) if kv is not None and kv.max_prompt > T else 0,
            "FS": flash_state_floats(shape.n_head, shape.head_dim),
            **mla_dims(T, kv), "MKD": shape.n_head * shape.head_dim,
            "MVD": shape.n_head * mla_value_width(shape.head_dim, m.v_head_dim)
            if shape.mla else 0,
            "MLC": m.kv_lora + m.qk_rope,
            "DFF2": 2 * shape.dense.d_ff if shape.dense.lead else 0,
            "MS": mla_state_floats(shape.n_head, m.v_head_dim)}


def _weights(specs: dict) -> int:
    return sum(math.prod(shp) for shp in specs.values())


def layer_dense_bytes(shape: ModelShape, layer: int = 0,
                      kept: Mapping[str, int] | None = None) -> int:
    """One layer's dense weights (attention q/k/v/o, q/k norms, two RMS norms, router; a leading
    dense layer's FFN; the shared experts, which stay resident: strata.models.ffn), read from the
    one description of the dense tensors (strata.archs.names): a matrix kept as blocks at its
    `kept` bytes (strata.engine.load.kept_bytes), the rest at DENSE_BYTES a weight."""
    kept = kept or {}
    return sum(kept[n] if n in kept else math.prod(shp) * DENSE_BYTES
               for n, shp in layer_specs(shape, layer).items())


def layer_scratch_bytes(shape: ModelShape, layer: int, kept: Mapping[str, int],
                        itemsize: int) -> int:
    """The most layer `layer`'s matrices kept as blocks hold decoded at once in its turn: the
    larger of its two phases (strata.models.block_weight.decode_phase, phase_of: each matrix
    whole, in the dtype of `itemsize`), the FFN phase's own matrices plus the largest of those
    its dense FFNs decode one at a time."""
    per = {"attn": 0, "ffn": 0}
    each = [0]
    for n, shp in layer_specs(shape, layer).items():
        if n in kept:
            ph = phase_of(n)
            if ph == "ffn_each":
                each.append(decoded_bytes(shp, itemsize))
            else:
                per[ph] += decoded_bytes(shp, itemsize)
    return max(per["attn"], per["ffn"] + max(each))


def model_sizes(shape: ModelShape, *, block_m: int | None = None,
                kv: KVPolicy | None = None, act: torch.dtype | None = None,
                kept: Mapping[str, int] | None = None) -> Sizes:
    """What memory sizes from this model: layout dims, KV and dense bytes (see the module doc).
    The output norm and LM head are counted untied (the worst case). `act`: the dtype the engine
    computes in (the delta rule's buffers take it, and a layer's matrices kept as blocks decode
    to it; None: the one beside the KV). `kv`: the KV dtype and resident window (default bf16,
    all resident); each layer's KV by its window (kv_windows). `kept`: the bytes of the dense
    matrices an engine keeps as blocks (strata.engine.load.kept_bytes, which counts a tied
    pack's head), by name; the others at DENSE_BYTES a weight."""
    g = global_specs(shape)
    kept = kept or {}
    embd, head = (kept.get(n, _weights({n: g[n]}) * DENSE_BYTES)
                  for n in ("token_embd.weight", "output.weight"))
    kv = kv or KVPolicy()
    win = kv_windows(shape)
    state = (state_bytes(shape, state_itemsize(kv.dtype)) if shape.linear is not None else 0)
    item = act.itemsize if act is not None else DENSE_BYTES
    layers = range(shape.n_layer)

    def kv_kept(n, l):   # a linear layer keeps its recurrent state, whatever the prompt's length
        if shape.layer_kind(l) == "linear":
            return state
        return shape.kv_bytes(kv.resident_tokens(n, win[l]), kv.dtype)
    return Sizes(
        n_layer=shape.n_layer, n_expert=shape.n_expert, top_k=shape.top_k,
        dims=lambda T, ring, batch: dims_for(shape, T, block_m, ring, batch, kv,
                                             act.itemsize if act is not None else None),
        kv_bytes=kv_kept,
        kv_host=lambda n, l: shape.kv_bytes(kv.host_tokens(n, win[l]), kv.dtype),
        dense_layer=layer_dense_bytes(shape, 0, kept),
        dense_layers=tuple(layer_dense_bytes(shape, l, kept) for l in layers),
        dense_scratch=tuple(layer_scratch_bytes(shape, l, kept, item) for l in layers),
        dense_first=embd,
        dense_last=_weights({"output_norm.weight": g["output_norm.weight"]}) * DENSE_BYTES
        + head,
        layer_work=lambda T: layer_work(shape, T),
        wider=lambda dims: mla_wider(shape, kv, dims))


def layer_work(shape: ModelShape, T: int) -> float:
    """FLOPs of the heaviest streamed (MoE) layer's work outside its experts for a chunk of T
    tokens with nothing cached: its attention (or delta rule) and dense GEMMs, as the compute
    floor counts them (strata.bench.flops). The copies the ring can run ahead of the next
    layer's passes are bounded by this work's time (strata.memory.scan's run-ahead rule)."""
    return max((dense_flops(shape, T, [l]) + attention_flops(shape, 0, T, [l])
                + (linear_flops(shape, T, [l]) if shape.linear is not None else 0.0)
                for l in shape.moe_layers), default=0.0)


def prompt_layout(shape: ModelShape, max_blob: int, *, spec: LayoutSpec | None = None,
                  block_m: int | None = None, batch: int | None = None,
                  sizes: Sizes | None = None) -> PromptLayout:
    """The prompt path's layout for this model and ring slot size (spec: ACTIVATIONS)."""
    return PromptLayout(sizes or model_sizes(shape, block_m=block_m), max_blob,
                        spec if spec is not None else ACTIVATIONS, batch)


def scratch_reserve(shape: ModelShape, devices: dict[str, torch.device], ffn: ExpertFFNs,
                    slab: bool, layouts: Sequence) -> Callable[[str, int, int], int] | None:
    """The slab's reserve for plan_prefill: (participant, n_tokens, chunk) -> bytes its stream-k
    launches ask for beyond the layout (slab_reserve below, by the kernel's own
    launch plan on that participant's device, for each kind of layer among `layouts`: the tile
    depends on whether the layer's weights are decoded). None unless the slab is on and `ffn`
    declares fixup scratch (the fused expert GEMM: it runs stream-k)."""
    if not slab or not ffn.fixup_scratch:
        return None
    from strata.kernels.moe.ffn import decoded_weights
    decoded = {decoded_weights(lay) for lay in layouts if lay is not None}   # None: dense layer
    return lambda name, n_tokens, chunk: slab_reserve(shape, n_tokens, chunk, devices[name],
                                                      decoded=decoded)


def default_devices(names: Sequence[str]) -> dict[str, torch.device]:
    """`strata plan`'s devices for the slab's tile choice: CUDAi is cuda:i where visible, else
    the CPU (the interpreter's SM count)."""
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {name: torch.device("cuda", i) if i < n else torch.device("cpu")
            for i, name in enumerate(names)}


__all__ = ["ACTIVATIONS", "ATTN_FLASH_BUF", "ATTN_STATE_BUF", "DECODE_BUF", "DENSE_BYTES",
           "DENSE_FFN_BUF", "GATED_Q_BUF",
           "KV_EXPAND_BUFS", "deltanet_buffers", "deltanet_bufs", "state_itemsize", "KV_STAGE_BUF",
           "KVPolicy", "MLA_LATENT_BUF", "MLA_SCRATCH_BUFS", "dims_for", "layer_dense_bytes",
           "layer_scratch_bytes",
           "layout_spec", "model_sizes", "prompt_layout", "scratch_reserve"]


def scratch_bytes_for(shape, n_tokens: int, device, *, decoded: bool) -> int:
    """The fixup scratch one expert-GEMM launch over n_tokens asks for: the kernel's own launch
    plan (strata.kernels.moe.tiles.plan_launch, honouring an active pin_tile), so no second count.
    decoded: the layer's weights are in a block format (strata.kernels.moe.ffn.decoded_weights of
    its layout); the tile, hence the scratch, depends on it."""
    from strata.kernels.moe.tiles import plan_launch
    return plan_launch(n_tokens, shape.top_k, shape.n_expert, shape.d_model, shape.d_expert,
                       decoded=decoded, device=torch.device(device)).scratch_bytes


def slab_reserve(shape, n_tokens: int, chunk: int, device, *, decoded) -> int:
    """Tail bytes the slab needs for a prompt of n_tokens read in chunks of `chunk`: what a dry
    SlabPool (strata.memory.pool: the pool's own classes and bump, no memory) reaches over the
    requests of its launches (the full chunks and the last partial one, for each kind of layer:
    `decoded` is a bool or the set of decoded_weights over the layers), one launch's scratch at
    a time as ParticipantScratch hands them out. 0 when no launch runs stream-k."""
    kinds = {bool(decoded)} if isinstance(decoded, bool) else {bool(d) for d in decoded}
    sizes = [chunk] + ([n_tokens % chunk] if n_tokens % chunk else [])
    pool = SlabPool.dry()
    for t in sizes:
        for d in sorted(kinds):
            if (b := scratch_bytes_for(shape, t, device, decoded=d)) > 0:
                pool.release(pool.alloc(b))
    return pool.high_water
