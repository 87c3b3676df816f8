"""Dense matrices kept on the GPU as their GGUF blocks, decoded where used.

A vocabulary-sized matrix is the largest dense tensor of most models (Qwen3.5: 248,320 x 2,048
twice, 2.0 GB as bf16; DeepSeek-V3: 129,280 x 7,168 twice, 3.7 GB), yet a prompt reads a few
of its rows (the embedding of each token) or multiplies it once per chunk (the head, for the
logits asked for). Kept as the pack's blocks (Q4_K / Q6_K: about a third of bf16) the rest of
the budget goes to the expert cache. A lookup decodes the rows of the tokens asked for; the head
decodes SLICE_BYTES of rows at a time into a transient and multiplies each (the plan counts that
slice beside the blocks: block_matrix_bytes).

A layer's matrices (attention, MLA, shared experts, a leading dense FFN) are kept so too, and
decoded whole for the layer's turn, one phase at a time (decode_phase: the attention's, then
the rest's): a chunk multiplies each by all its T tokens, so one decode a chunk costs 1/T of the
product's reads, and the plan counts the largest phase's decoded matrices (decoded_bytes) once
beside every layer's blocks.

    w = BlockWeight("Q6_K", (V, D), raw_on_gpu, torch.bfloat16)
    x = w[tokens]                  # [T, D] dtype: the rows of tokens
    logits = w.matmul_t(h)         # [T, V]: h @ W.T, slice by slice
    lw = decode_phase(layer, "attn")   # a layer's weights, its attention's BlockWeights decoded

Legend: V rows (vocabulary; a layer's matrix: R), D columns (hidden; whole blocks), T tokens.
Decoded values are strata.kernels.dequant's (bit-exact fp32, then cast as torch casts), so a
lookup equals the decoded matrix's rows exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

# the decoded slice the head multiplies at a time: bounds the transient a prompt's logits need
SLICE_BYTES = 128 << 20

# the dense tensors an engine on CUDA keeps as blocks when its pack holds them so
KEPT_AS_BLOCKS = ("token_embd.weight", "output.weight")


def slice_rows(rows: int, cols: int, itemsize: int, slice_bytes: int = SLICE_BYTES) -> int:
    """Rows of the head decoded at a time: as many as fit `slice_bytes` (at least one)."""
    return max(1, min(rows, slice_bytes // max(1, cols * itemsize)))


def decoded_bytes(shape, itemsize: int) -> int:
    """Bytes of a matrix of torch `shape` decoded to a dtype of `itemsize` (what decode_layer
    allocates for it, and the plan counts)."""
    n = 1
    for v in shape:
        n *= int(v)
    return n * itemsize


def block_matrix_bytes(name: str, block_bytes: int, rows: int, cols: int, itemsize: int,
                       slice_bytes: int = SLICE_BYTES) -> int:
    """What the matrix `name` kept as blocks holds on its GPU (the plan's count): its blocks, and
    for the head ("output.weight", which a tied model's embeddings serve as) the decoded slice
    it multiplies at a time (BlockWeight.matmul_t decodes exactly that slice). A lookup decodes
    only its tokens' rows: an activation's size, not the matrix's."""
    if name != "output.weight":
        return block_bytes
    return block_bytes + slice_rows(rows, cols, itemsize, slice_bytes) * cols * itemsize


@dataclass(frozen=True)
class BlockWeight:
    fmt: str                  # a strata.formats name (Q4_K, Q6_K, Q8_0, ...)
    shape: tuple[int, int]    # (V, D)
    raw: torch.Tensor         # uint8 [V, row_bytes] on the model's device
    dtype: torch.dtype        # what it decodes to (the model's compute dtype)
    slice_bytes: int = SLICE_BYTES

    @property
    def device(self) -> torch.device:
        return self.raw.device

    @property
    def nbytes(self) -> int:
        return self.raw.numel()

    def to(self, device=None, dtype=None) -> "BlockWeight":
        """Moved to `device` (the blocks), decoding to `dtype` from then on."""
        return replace(self, raw=self.raw.to(device) if device is not None else self.raw,
                       dtype=dtype if dtype is not None else self.dtype)

    def _decode(self, raw: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        from strata.kernels.dequant import dequantize
        return dequantize(raw, self.fmt, dtype or self.dtype).reshape(raw.shape[0],
                                                                      self.shape[1])

    def __getitem__(self, rows: torch.Tensor) -> torch.Tensor:
        """The decoded rows [T, D] of row ids `rows` [T] (an embedding lookup)."""
        return self._decode(self.raw[rows])

    def matmul_t(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, D] @ W.T -> [T, V] in x's dtype, SLICE_BYTES of W decoded at a time."""
        V, D = self.shape
        step = slice_rows(V, D, self.dtype.itemsize, self.slice_bytes)
        out = torch.empty(x.shape[0], V, dtype=x.dtype, device=x.device)
        for a in range(0, V, step):
            out[:, a:a + step] = x @ self._decode(self.raw[a:a + step]).t()
        return out

    def float(self) -> torch.Tensor:
        """The whole matrix decoded, fp32 [V, D] (the reference twin's weights)."""
        return self._decode(self.raw, torch.float32)

    def decoded(self) -> torch.Tensor:
        """The whole matrix decoded, [V, D] in its dtype (decoded_bytes of it)."""
        return self._decode(self.raw)


def decode_layer(lw, only=None):
    """A layer's weights (anything with `map(fn)`) with each BlockWeight decoded whole in its
    dtype, the rest as they are; the layer itself where none is decoded. `only`: decode just
    the BlockWeights for which only(w) is true (decode_phase's split). The caller drops the
    result when it is done with it, so no more than one phase's decoded matrices live at once."""
    found = []

    def dec(t):
        if isinstance(t, BlockWeight) and (only is None or only(t)):
            found.append(t)
            return t.decoded()
        return t
    out = lw.map(dec)
    return out if found else lw


def phase_split(lw):
    """decode_phase's split of layer `lw`, made once a layer: (ids of its attention weights'
    BlockWeights, ids of those a part that `decodes_itself` holds), or None where the layer
    holds no BlockWeight (its turn then decodes nothing and costs nothing)."""
    if not any(isinstance(t, BlockWeight) for t in _leaves(lw)):
        return None
    mine = {id(t) for t in _leaves(lw.attn) if isinstance(t, BlockWeight)}
    own = {id(t) for v in vars(lw).values() if getattr(v, "decodes_itself", False)
           for t in _leaves(v)}
    return mine, own


def decode_phase(lw, phase: str, split=False):
    """Layer `lw` with the BlockWeights of one phase of its turn decoded: "attn", those of its
    attention weights (`lw.attn`: q/k/v/o, MLA's, DeltaNet's), or "ffn", every other one (the
    router...) but those of a part that `decodes_itself` (strata.models.ffn.DenseFFN: a
    leading dense FFN, shared experts), which decodes each matrix just before its product. A
    turn decodes one phase, runs it, drops it, then the other, so the larger phase bounds what
    it holds (phase_of names each tensor's phase for the plan). `split`: the layer's
    phase_split (made here when not given); None: nothing to decode, `lw` itself."""
    split = phase_split(lw) if split is False else split
    if split is None:
        return lw
    mine, own = split
    if phase == "attn":
        return decode_layer(lw, lambda t: id(t) in mine)
    return decode_layer(lw, lambda t: id(t) not in mine and id(t) not in own)


def dense(w) -> torch.Tensor:
    """A weight as a tensor: a BlockWeight decoded whole (its dtype), a tensor as it is."""
    return w.decoded() if isinstance(w, BlockWeight) else w


def phase_of(name: str) -> str:
    """The phase of a layer's dense tensor `name` (blk.N.<part>) whose turn decodes it:
    attention weights (attn_*, the DeltaNet's ssm_*; not the layer's attn_norm) "attn"; a
    dense FFN's or the shared experts' matrices (ffn_{gate,up,down}[_shexp]), decoded one at a
    time inside the FFN phase, "ffn_each"; the rest "ffn". The plan's count of a turn's
    decode (strata.planning.layer_scratch_bytes); a test holds it to what the turn decodes."""
    part = name.split(".", 2)[2] if name.startswith("blk.") else name
    if part.startswith(("attn_", "ssm_")) and not part.startswith("attn_norm"):
        return "attn"
    stem = part.removesuffix(".weight").removesuffix("_shexp")
    return "ffn_each" if stem in ("ffn_gate", "ffn_up", "ffn_down") else "ffn"


def _leaves(obj) -> list:
    seen = []
    obj.map(lambda t: seen.append(t) or t)
    return seen


def matmul_t(x: torch.Tensor, w) -> torch.Tensor:
    """x @ w.T for a plain weight or one kept as blocks."""
    return w.matmul_t(x) if isinstance(w, BlockWeight) else x @ w.t()
