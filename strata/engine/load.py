"""Load a model from a pack: dense weights onto a device, experts behind a provider.

    model = load_model(pack, device="cuda")              # dense weights only
    provider = ResidentProvider.from_pack(pack, device)  # or the streaming engine's provider
"""
from __future__ import annotations

import time

import torch

from strata.errors import StrataError
from strata.models.block_weight import KEPT_AS_BLOCKS, BlockWeight, block_matrix_bytes
from strata.models.moe import ExpertFFN
from strata.models.provider import ResidentProvider
from strata.archs.registry import get_arch
from strata.packs import Pack
from strata.packs.qdense import QuantDense, as_float


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
        raise StrataError(f"device {name} asked for, but this machine has no CUDA device; "
                          f"use cpu")
    if dev.type == "cuda" and dev.index is None:   # one name per GPU: "cuda" is cuda:<current>
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type == "cuda" and dev.index >= torch.cuda.device_count():
        raise StrataError(f"{dev} asked for, but this machine has {torch.cuda.device_count()} "
                          f"CUDA device(s) (cuda:0..); name one of them")
    return dev


def load_model(pack, *, device=None, dtype: torch.dtype = torch.float32,
               ffn: ExpertFFN | None = None, device_map=None, timings: dict | None = None,
               layer_blocks: bool = False):
    """The pack's model (its architecture's record by `shape.arch`: strata.archs) with dense
    weights on `device` (or, with `device_map`, each layer's on its own device: a layer split
    over GPUs). `layer_blocks`: a layer's matrices the pack holds as blocks stay blocks on a
    CUDA device, decoded for the layer's turn (dense_on_devices). `timings`: gets
    `dense_upload_s` (the weights onto the devices) and `model_build_s`."""
    pack = open_pack(pack)
    arch = get_arch(pack.shape.arch)
    dev = resolve_device(device)
    t0 = time.perf_counter()
    stored = getattr(pack, "dense_stored", pack.dense)   # blocks stay blocks until placed
    tensors = dense_on_devices({n: stored(n) for n in pack.dense_names()}, dtype,
                               dev if device_map is None else list(device_map),
                               layer_blocks=layer_blocks)
    t1 = time.perf_counter()
    model = arch.build(pack.shape, tensors, device=dev, dtype=dtype, ffn=ffn,
                             device_map=device_map)
    if timings is not None:
        timings["dense_upload_s"] = t1 - t0
        timings["model_build_s"] = time.perf_counter() - t1
    return model


def tensor_device(name: str, devices: list[torch.device]) -> torch.device:
    """Where a layer split puts a dense tensor (as the wirings do): a layer's own tensors on its
    device, the embeddings with the first layer, the output norm and head with the last."""
    if name.startswith("blk."):
        return devices[int(name.split(".")[1])]
    return devices[0] if name == "token_embd.weight" else devices[-1]


def dense_on_devices(tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                     device, *, layer_blocks: bool = False) -> dict[str, torch.Tensor]:
    """The dense tensors as `dtype` on their CUDA devices, each device's in one bulk upload
    through pinned staging (strata.engine.pinning.upload); a matrix held as blocks (QuantDense)
    copied as its blocks and kept so (a BlockWeight, decoded where used) if it is the
    embeddings or head (KEPT_AS_BLOCKS) or, with `layer_blocks`, a layer's, else decoded there
    once; host tensors for a CPU model pass through (from_tensors converts them; blocks decoded,
    fp32). `device`: one device, or one per layer. A tensor the placement puts elsewhere than
    the wiring wants is still right: from_tensors moves it."""
    devices = [torch.device(d) for d in (device if isinstance(device, list) else [device])]
    blocks = {n: t for n, t in tensors.items() if isinstance(t, QuantDense)}
    plain = {n: t for n, t in tensors.items() if n not in blocks}
    if not any(d.type == "cuda" for d in devices) or any(t.device.type != "cpu"
                                                        for t in plain.values()):
        return {n: as_float(t) for n, t in tensors.items()} if blocks else tensors
    from strata.engine.pinning import upload
    where = (lambda n: tensor_device(n, devices)) if len(devices) > 1 else (lambda n: devices[0])
    per: dict[torch.device, dict[str, torch.Tensor]] = {}
    for name, t in plain.items():
        per.setdefault(where(name), {})[name] = t
    out = {}
    for d, group in per.items():
        out.update(upload(group, d, dtype) if d.type == "cuda" else group)
    for name, q in blocks.items():
        d = where(name)
        out[name] = (torch.empty(q.shape, dtype=dtype, device=d) if d.type == "meta"  # unread
                     else q.decode() if d.type != "cuda" else
                     BlockWeight(q.fmt, q.shape, q.raw.to(d), dtype)
                     if kept_as_blocks(name, layer_blocks) else blocks_on_device(q, d, dtype))
    return {n: out[n] for n in tensors}


def kept_as_blocks(name: str, layer_blocks: bool) -> bool:
    """Whether a CUDA load keeps dense matrix `name` as blocks when its pack holds it so: the
    embeddings and head always, a layer's (blk.N.*) with `layer_blocks`."""
    return name in KEPT_AS_BLOCKS or (layer_blocks and name.startswith("blk."))


def kept_bytes(pack, device_type: str, dtype: torch.dtype, *,
               layer_blocks: bool = False) -> dict[str, int]:
    """The bytes each dense matrix a CUDA engine keeps as blocks (kept_as_blocks, where the pack
    holds it as blocks) takes on its GPU, by name: what dense_on_devices places, counted by
    block_matrix_bytes (the head's decode slice included; a tied pack's head is its
    embeddings, counted again, as the plan counts a head untied). The plan takes these
    (strata.planning.model_sizes' `kept`, which adds the most a layer's turn decodes at once);
    empty on the CPU, which decodes every matrix."""
    if device_type != "cuda" or not hasattr(pack, "dense_stored"):
        return {}
    names = list(pack.dense_names())
    if getattr(pack, "tied", False) and "output.weight" not in names:
        names.append("output.weight")
    out = {}
    for n in names:
        if not kept_as_blocks(n, layer_blocks):
            continue
        q = pack.dense_stored(n)      # a tied pack's head: its embeddings
        if isinstance(q, QuantDense):
            out[n] = block_matrix_bytes(n, q.nbytes, *q.shape, dtype.itemsize)
    return out


def blocks_on_device(q: QuantDense, device, dtype: torch.dtype) -> torch.Tensor:
    """A matrix kept as blocks as `dtype` [R, C] on `device`: the blocks copied there and decoded
    there by strata.kernels.dequant (every block format has its Triton decoder; fp32 exact,
    bf16/fp16 the fp32 values rounded as torch's cast rounds them)."""
    from strata.kernels.dequant import dequantize
    return dequantize(q.raw.to(device), q.fmt, dtype).reshape(q.shape)


def resident_provider(pack, device=None) -> ResidentProvider:
    """Every expert of every layer of the pack in one arena on `device`."""
    pack = open_pack(pack)
    return ResidentProvider([pack.experts(i) for i in range(pack.shape.n_layer)],
                            [pl.layout for pl in pack.layers], resolve_device(device))
