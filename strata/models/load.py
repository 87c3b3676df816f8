"""Load a model from a pack: dense weights onto a device, experts behind a provider.

    model = load_model(pack, device="cuda")              # dense weights only
    provider = ResidentProvider.from_pack(pack, device)  # or the streaming engine's provider
"""
from __future__ import annotations

import torch

from strata.errors import StrataError
from strata.models.moe import ExpertFFN
from strata.models.provider import ResidentProvider
from strata.models.registry import get_arch
from strata.packs import Pack


def open_pack(pack) -> Pack:
    """A Pack from a path; a pack object (Pack, MemoryPack) passes through."""
    if isinstance(pack, (str, __import__("os").PathLike)):
        return Pack.open(pack)
    return pack


def resolve_device(name: str | torch.device | None) -> torch.device:
    """'cpu', 'cuda', 'cuda:1' or None (cuda when available); a clear error without CUDA."""
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise StrataError(f"unknown device {name!r}; use cpu or cuda[:N]") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise StrataError("--device cuda asked for, but this machine has no CUDA device; "
                          "use --device cpu")
    if dev.type == "cuda" and dev.index is None:   # one name per GPU: "cuda" is cuda:<current>
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def load_model(pack, *, device=None, dtype: torch.dtype = torch.float32,
               ffn: ExpertFFN | None = None, device_map=None):
    """The pack's model (class from the registry by `shape.arch`) with dense weights on `device`
    (or, with `device_map`, each layer's on its own device: a layer split over GPUs)."""
    pack = open_pack(pack)
    cls = get_arch(pack.shape.arch)
    tensors = {n: pack.dense(n) for n in pack.dense_names()}
    return cls.from_tensors(pack.shape, tensors, device=resolve_device(device), dtype=dtype, ffn=ffn,
                            device_map=device_map)


def resident_provider(pack, device=None) -> ResidentProvider:
    """Every expert of every layer of the pack in one arena on `device`."""
    pack = open_pack(pack)
    return ResidentProvider([pack.experts(i) for i in range(pack.shape.n_layer)],
                            [pl.layout for pl in pack.layers], resolve_device(device))
