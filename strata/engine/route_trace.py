"""How much of each layer a chunk touches: the expert hit fraction, and a routing trace to feed it.

    expert_hit_fraction(topk_ids [T, K], E, chunk=None) -> fraction of E experts with >= 1 token
        (per chunk of `chunk` tokens when given: tensor [ceil(T / chunk)])
    route_trace(source, token_ids [T]) -> RouteTrace(topk [L] x [T, K], resid_rms [L])

`route_trace` runs the model's one forward (strata.models) over the prompt with an observer
(strata.models.observe.RouteRecorder) that records each layer's top-k ids and the RMS of the
residual after it. A pack is read as it is; a GGUF file through strata.packs.from_gguf.GGUFModel
(the same reader `strata pack` uses). The experts come one layer at a time (OnDemandProvider), so a
full-size trace holds one layer's blobs, not the model's. It is a measuring tool for synthetic
models: tiny and small shapes on the CPU, the full shape on a GPU host.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from strata.errors import StrataError


def expert_hit_fraction(topk_ids: torch.Tensor, n_expert: int, chunk: int | None = None):
    """Fraction of the layer's `n_expert` experts routed at least one of the tokens.

    topk_ids: int [T, K]. With `chunk`, one fraction per consecutive chunk of `chunk` tokens."""
    ids = torch.as_tensor(topk_ids).long()
    if ids.dim() != 2:
        raise StrataError(f"topk ids must be [T, K], got {list(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n_expert):
        raise StrataError(f"topk ids must lie in [0, {n_expert})")
    if chunk is None:
        return float(torch.bincount(ids.reshape(-1), minlength=n_expert).gt(0).sum()) / n_expert
    out = [expert_hit_fraction(ids[s:s + chunk], n_expert) for s in range(0, ids.shape[0], chunk)]
    return torch.tensor(out, dtype=torch.float64)


@dataclass
class RouteTrace:
    topk: list[torch.Tensor]     # per layer: int64 [T, K]
    resid_rms: list[float]       # per layer: RMS of the residual after it

    def hit_fractions(self, n_expert: int, chunk: int | None = None) -> list[float]:
        """Per layer: mean over chunks of the hit fraction."""
        return [float(torch.as_tensor(expert_hit_fraction(t, n_expert, chunk)).mean())
                for t in self.topk]


def open_source(src):
    """A pack-like object from a Pack/MemoryPack/GGUFModel (as is), a .gguf path or a pack path."""
    if isinstance(src, (str, Path)):
        if str(src).endswith(".gguf"):
            from strata.packs.from_gguf import GGUFModel
            return GGUFModel(src)
        from strata.packs.file import Pack
        return Pack.open(src)
    return src


@torch.no_grad()
def route_trace(src, token_ids, use_model: bool | None = None) -> RouteTrace:
    """Each layer's top-k over `token_ids` (one chunk) and the residual RMS after it.

    use_model: False — the reference: fp32 dense math and the fp32 expert FFN (moe_ffn_ref) on the
    CPU; True — the model on the default device (CUDA when present, with the Triton expert GEMM;
    on the CPU it is the reference); None — True for packs, False for GGUF files."""
    from strata.engine.load import load_model, resolve_device
    from strata.models.moe import moe_ffn_ref
    from strata.models.observe import RouteRecorder
    from strata.models.provider import OnDemandProvider
    if use_model is None:
        use_model = not str(src).endswith(".gguf")
    source = open_source(src)
    dev = resolve_device(None) if use_model else torch.device("cpu")
    model = load_model(source, device=dev, dtype=torch.float32,
                       ffn=None if dev.type == "cuda" else moe_ffn_ref)
    rec = RouteRecorder(source.shape.n_layer)
    model.prefill(torch.as_tensor(token_ids).long(), OnDemandProvider(source, dev),
                  logits="none", observer=rec)
    return RouteTrace(rec.topk, rec.resid_rms)
