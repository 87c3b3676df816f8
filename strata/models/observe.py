"""Observers of a model forward: what a measurement sees without a second forward.

An observer passed to `Model.prefill(..., observer=)` hears, per chunk and layer:

    observer.routed(layer, topk_ids [T, K], topk_w [T, K])   # after the router
    observer.layer_done(layer, x [T, D])                     # the residual stream after the layer

`RouteRecorder` keeps every layer's top-k ids (all chunks, in token order) and the RMS of the
residual after each layer over all tokens; strata.engine.route_trace turns them into a RouteTrace.
"""
from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class ForwardObserver(Protocol):
    def routed(self, layer: int, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> None: ...

    def layer_done(self, layer: int, x: torch.Tensor) -> None: ...


class RouteRecorder:
    """Top-k ids per layer (int64 [T, K] on the CPU) and residual RMS per layer."""

    def __init__(self, n_layer: int):
        self._ids: list[list[torch.Tensor]] = [[] for _ in range(n_layer)]
        self._sq = [0.0] * n_layer      # sum of x^2 over the tokens seen (fp64)
        self._n = [0] * n_layer

    def routed(self, layer: int, topk_ids: torch.Tensor, topk_w: torch.Tensor) -> None:
        self._ids[layer].append(topk_ids.detach().to("cpu", torch.int64))

    def layer_done(self, layer: int, x: torch.Tensor) -> None:
        self._sq[layer] += float(x.detach().double().pow(2).sum())
        self._n[layer] += x.numel()

    @property
    def topk(self) -> list[torch.Tensor]:
        return [torch.cat(t) if t else torch.empty(0, 0, dtype=torch.int64) for t in self._ids]

    @property
    def resid_rms(self) -> list[float]:
        return [math.sqrt(s / n) if n else float("nan") for s, n in zip(self._sq, self._n)]
