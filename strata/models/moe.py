"""The expert FFNs a model's MoE block can run (strata.models.moe_block routes, then calls one).

Legend: T tokens of the chunk, D hidden, F expert width, E experts, K top-k.

    y[t] = sum_k w[t, k] * down_e(silu(gate_e x_t) * up_e x_t),   e = ids[t, k]

Each is an object of the registry below (EXPERT_FFNS; `ffn_named` reads a CLI or EngineConfig
name once, at the edge), which declares what the planner and the engine give it, so no one else
tests its name: the layout buffers it adds (`buffers`), whether its launches ask the stream-k
slab for fixup scratch (`fixup_scratch`), its landing (`landing(layouts)`: the re-layout each blob
gets as it lands, or None) and the callable that runs it (`forward()`).

The callables: `(x, topk_ids, topk_w, experts, *, out=None, scratch_alloc=None, workspace=None)
-> y` with y in x's dtype, or added into `out` (fp32) when given (scratch_alloc and workspace:
what the provider lends, strata.models.provider.LayerWorkspace):
- "kernel": the Triton expert GEMM `strata.kernels.moe_ffn` (bf16 in, fp32 accumulate, bf16 h and y)
- "decoded": decode the pass's experts once, then the same GEMM on BF16 (strata.kernels.moe.decoded;
            biased experts' fp32 biases are copied into the BF16 blobs, so the epilogue is the same)
- "auto":   "kernel" or "decoded", whichever the measured table (strata.kernels.moe.choices,
            ffn_table.json) says is faster for the pass's formats and rows per expert, for plain
            and biased (GPT-OSS) experts alike
- "plane":  the plane-layout GEMM `strata.kernels.moe.plane.plane_ffn` (Q8_0/Q4_0/Q4_K experts whose
            blobs were re-laid into code and scale planes as they landed: the engine's
            strata.planes.Landing; it takes PlaneSets, an ExpertSet is a StrataError)
- "int8":   the int8 GEMM `strata.kernels.moe.int8.moe_ffn_int8` (activations quantized to q8_1
            per token, the weights' int8 codes, as llama.cpp's MMQ; opt-in): its q8_1 rows of x
            and h borrow the bytes of the layout's bf16 h (fresh tensors where they do not fit)
- "plane-int8": the int8 GEMM over plane-layout Q8_0 / Q4_0 / Q4_K experts (a Q6_K down left in
            ggml's layout, Q4_K_M's) `strata.kernels.moe.plane_int8.moe_ffn_plane_int8` ("int8"'s
            numbers bit for bit, the weights' codes read as plain int8 tiles; blobs re-laid as
            they land, as "plane"'s; opt-in)
- "torch":  the fused GEMM's plain-torch twin `strata.kernels.moe_ffn_torch` (same bf16 contract)
- "ref":    `moe_ffn_ref` below: every product in fp32, x not rounded (the reference forward)
Block decoding is the kernels' own (`dequantize_matrix`).
"""
from __future__ import annotations

from typing import Callable

import torch

from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.kernels.moe.ffn import expert_forward
from strata.memory.layout import Buf

ExpertFFN = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, ExpertSet], torch.Tensor]

# The "decoded" expert FFN's buffer: one pass's experts decoded to bf16 (G x BB bytes, the
# layout's symbols: strata.planning; BB = strata.blob.bf16_layout's size, the bias slot
# included). The FFNs that may decode a pass declare it.
DECODE_BUF = Buf("wdec", torch.uint8, ("G", "BB"), "a pass's experts decoded to bf16 blobs")


def moe_ffn_ref(x: torch.Tensor, topk_ids: torch.Tensor, topk_w: torch.Tensor,
                experts: ExpertSet, *, out: torch.Tensor | None = None, **_) -> torch.Tensor:
    """fp32 reference expert FFN: x [T, D] (any float dtype), topk [T, K] -> y [T, D] in x's
    dtype. Decodes only the experts with tokens; an absent routed expert is a StrataError; an id of
    -1 skips that assignment (it belongs to another pass over the layer's experts).
    `scratch_alloc` is accepted and ignored (no stream-k here)."""
    T, D = x.shape
    y = torch.zeros(T, D, dtype=torch.float32, device=x.device)
    xf = x.float()
    for e in torch.unique(topk_ids).tolist():
        if e < 0:  # an assignment outside this pass of experts (the streaming engine's batches)
            continue
        tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)      # [n], [n]
        ye = expert_forward(xf[tok], experts, e)                     # [n, D] (biases, act)
        y.index_add_(0, tok, ye * topk_w[tok, slot].float()[:, None])
    if out is not None:   # a pass of the streaming engine: add into the fp32 accumulator
        return out.add_(y)
    return y.to(x.dtype)


def _bf16(fn) -> ExpertFFN:
    """Adapt a bf16-contract expert FFN to any activation dtype (bf16 in, y back in x's dtype)."""
    def ffn(x, topk_ids, topk_w, experts, **kw):
        y = fn(x.to(torch.bfloat16), topk_ids, topk_w, experts, **kw)
        return y if kw.get("out") is not None else y.to(x.dtype)
    ffn.__name__ = fn.__name__
    return ffn


# FLOP shares of an expert's matrices: gate and up (D -> F each) and down (F -> D)
_SHARES = {"gate": 1 / 3, "up": 1 / 3, "down": 1 / 3}


def auto_path(experts: ExpertSet, rows: float, device: torch.device) -> str:
    """"kernel" or "decoded": the faster for a pass of `rows` rows per expert by the measured
    table (strata.kernels.moe.choices), by the matrices' formats. Experts with biases or another
    activation (GPT-OSS's) are chosen the same way: both paths run the same Triton GEMM with the
    same bias and activation epilogue (the decoded BF16 blobs carry the biases), so the table's
    kernel-against-decoded rate for the formats holds for them too."""
    from strata.kernels.moe.choices import device_name, table
    mats = [(m.fmt.name, _SHARES[n]) for n, m in zip(("gate", "up", "down"),
                                                    experts.layout.matrices)]
    return table().choose(device_name(device.index or 0), mats, rows)


def _auto(x, topk_ids, topk_w, experts, **kw):
    from strata.kernels.moe.decoded import moe_ffn_decoded
    from strata.kernels.moe.ffn import moe_ffn
    rows = topk_ids.numel() / max(1, experts.n_expert)
    fn = moe_ffn_decoded if auto_path(experts, rows, x.device) == "decoded" else moe_ffn
    return fn(x, topk_ids, topk_w, experts, **kw)   # moe_ffn ignores wdec


class ExpertFFNs:
    """One expert FFN's declaration (the base: no buffers, no slab scratch, no landing)."""
    name = ""
    acts = "bf16"                   # what the expert GEMMs multiply the weights with
    buffers: tuple[Buf, ...] = ()   # added to the layout's "moe" phase
    fixup_scratch = False           # stream-k launches take fixup scratch from the slab
    lands = False                   # blobs are re-laid as they land: the streaming engine only

    def landing(self, layouts):
        """The strata.planes.Landing each blob gets as it lands in a cache slot, or None."""
        return None

    def forward(self) -> ExpertFFN:
        """The callable that runs it (imports the kernels' modules)."""
        raise NotImplementedError

    def on(self, device_type: str) -> "ExpertFFNs":
        """The FFN this one runs as on `device_type` (itself but for "auto")."""
        return self

    def __repr__(self) -> str:
        return f"<expert FFN {self.name}>"


class KernelFFN(ExpertFFNs):
    """The fused Triton expert GEMM on the blocks; its stream-k launches take fixup scratch."""
    name = "kernel"
    fixup_scratch = True

    def forward(self):
        from strata.kernels.moe.ffn import moe_ffn
        return _bf16(moe_ffn)


class DecodedFFN(ExpertFFNs):
    """Decode a pass's experts once into wdec, then the BF16 GEMM."""
    name = "decoded"
    buffers = (DECODE_BUF,)

    def forward(self):
        from strata.kernels.moe.decoded import moe_ffn_decoded
        return _bf16(moe_ffn_decoded)


class AutoFFN(ExpertFFNs):
    """"kernel" or "decoded" by the measured table, pass by pass (it may decode: wdec); the CLI
    runs the reference on the CPU (the Triton interpreter would take minutes)."""
    name = "auto"
    buffers = (DECODE_BUF,)

    def forward(self):
        return _bf16(_auto)

    def on(self, device_type):
        return self if device_type == "cuda" else EXPERT_FFNS["ref"]


class PlaneFFN(ExpertFFNs):
    """The plane-layout GEMM on experts re-laid into code and scale planes as they land."""
    name = "plane"
    lands = True

    def landing(self, layouts):
        """A StrataError names a layer the plane GEMM cannot read."""
        from strata.kernels.moe.plane import KERNEL_FORMATS
        from strata.planes import Landing
        return Landing(layouts, KERNEL_FORMATS)

    def forward(self):
        from strata.kernels.moe.plane import plane_ffn
        return _bf16(plane_ffn)


class Int8FFN(ExpertFFNs):
    """The int8 GEMM on q8_1 activations (data-parallel: no slab scratch); its q8_1 rows live in
    the layout's h buffer where they fit (x's and h's together: 1.125 (T D + Mpad F) bytes
    against h's 2 Mpad F), else in fresh tensors outside the plan."""
    name = "int8"
    acts = "q8_1"

    def forward(self):
        from strata.kernels.moe.int8 import moe_ffn_int8
        return _bf16(moe_ffn_int8)


class PlaneInt8FFN(Int8FFN):
    """The int8 GEMM over Q8_0 / Q4_0 / Q4_K experts re-laid into code and scale planes as they
    land (a Q6_K down left as it is): int8's q8_1 rows in the layout's h buffer, plane's
    landing."""
    name = "plane-int8"
    lands = True

    def landing(self, layouts):
        """A StrataError names a layer with other than Q8_0 / Q4_0 / Q4_K matrices (or a Q6_K
        down), or with gate and up in two formats."""
        from strata.kernels.moe.plane_int8 import FORMATS, KEPT, check_gate_up
        from strata.planes import Landing
        land = Landing(layouts, FORMATS, keep=KEPT)
        for layer, lay in enumerate(layouts):
            if lay is not None:
                check_gate_up(lay, f"layer {layer}")
        return land

    def forward(self):
        from strata.kernels.moe.plane_int8 import moe_ffn_plane_int8
        return _bf16(moe_ffn_plane_int8)


class TorchFFN(ExpertFFNs):
    """The fused GEMM's plain-torch twin (same bf16 contract)."""
    name = "torch"

    def forward(self):
        from strata.kernels.moe.ffn import moe_ffn_torch
        return _bf16(moe_ffn_torch)


class RefFFN(ExpertFFNs):
    """The fp32 reference (moe_ffn_ref)."""
    name = "ref"
    acts = "fp32"

    def forward(self):
        return moe_ffn_ref


EXPERT_FFNS: dict[str, ExpertFFNs] = {c.name: c() for c in (AutoFFN, KernelFFN, DecodedFFN,
                                                             PlaneFFN, Int8FFN, PlaneInt8FFN,
                                                             TorchFFN, RefFFN)}
FFN_CHOICES = tuple(EXPERT_FFNS)


def ffn_named(ffn: "str | ExpertFFNs") -> ExpertFFNs:
    """The expert FFN called `ffn` (one of FFN_CHOICES; an ExpertFFNs is itself)."""
    if isinstance(ffn, ExpertFFNs):
        return ffn
    if ffn not in EXPERT_FFNS:
        raise StrataError(f"unknown expert FFN {ffn!r}; choose one of {', '.join(FFN_CHOICES)}")
    return EXPERT_FFNS[ffn]


def expert_ffn(ffn: "str | ExpertFFNs" = "kernel") -> ExpertFFN:
    """The callable of the expert FFN `ffn` (a name of FFN_CHOICES or its object)."""
    return ffn_named(ffn).forward()
