"""llama.cpp's CPU arithmetic emulated in torch: its rounding of every weight product's
activations (ggml-cpu's vec_dot_type: f16, bf16, q8_0, q8_1, q8_K), strata's read of a pack
under that rounding (`read_pack` with an `Arith`), the order draws that bound it, and the search
for the roundings llama.cpp's fp32 order tipped (`tipped`). Why each piece is as it is:
tests/models/test_llama_cpp_logits.py's docstring, whose tests hold it against llama.cpp's
logits; tests/instruments/test_llama_perplexity_emulated.py feeds it to the perplexity
instruments."""
from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from tests.models.fp32_bound import rel, theta

DRAWS = 2
U16, UBF16 = 2.0 ** -11, 2.0 ** -8


# ---- llama.cpp's activation rounding (ggml-cpu), in torch -------------------------------------
def _q8(b: torch.Tensor, t: torch.Tensor, tips, eps: float, seen: list | None, slack=None):
    """The codes round(t) of a block-quantized activation, t = b x its block's 127/amax; the
    codes in `tips` (flat indices) taken to the other neighbour of t. `seen` (a list) gets the
    flat indices whose t lies within 2 eps |t| of a midpoint between two codes: fp32 order
    (eps relative on x and on amax) may round them either way, or within `slack` (code units,
    t's shape: what the order draws moved t by, doubled). (Indices past t's are _scale_f16's.)"""
    q = torch.round(t)
    if seen is not None:
        near = (0.5 - (t - q).abs()) < 2 * eps * t.abs()
        if slack is not None:
            near |= (0.5 - (t - q).abs()) < slack
        seen.extend(near.reshape(-1).nonzero().reshape(-1).tolist())
    tips = sorted(i for i in tips if i < t.numel())
    if tips:
        i = torch.tensor(tips)
        qf = q.reshape(-1)
        qf[i] += torch.sign(t.reshape(-1)[i] - qf[i])
    return q


def _scale_f16(d: torch.Tensor, base: int, tips, eps: float, seen: list | None):
    """fp16(d) of each block's scale d [B, 1] (fp32); the blocks b with base + b in `tips` take
    the other f16 neighbour of d. `seen` gets base + b for each block whose d lies within 2 eps d
    of the midpoint between its two f16 neighbours: fp32 order (on amax) may round it either
    way, which moves every value of the block by one f16 ulp of the scale."""
    d16 = d.half().float()
    other = (d16.half().view(torch.int16) + torch.where(d > d16, 1, -1).to(torch.int16)) \
        .view(torch.float16).float()
    if seen is not None:
        near = (d != d16) & ((d - (d16 + other) / 2).abs() < 2 * eps * d)
        seen.extend((base + near.reshape(-1).nonzero().reshape(-1)).tolist())
    blocks = sorted(i - base for i in tips if i >= base)
    if blocks:
        i = torch.tensor(blocks)
        d16.view(-1)[i] = other.view(-1)[i]
    return d16


def _q8_32(x: torch.Tensor, tips, eps: float, seen, moved=None):
    """q8_0's blocks of x [..., K] (ggml-cpu's quantize_row_q8_0 / _q8_1, x86): per 32,
    d = amax/127 (fp32), q = round-half-even(x * 127/amax) -> (q [B, 32], d [B, 1], fp16(d)).
    `tips` / `seen`: flat indices of the codes (_q8), then of the scales (numel + block);
    `moved` (x's shape): how far the order draws moved x (_q8's slack; ignored when another
    shape: the read routed otherwise than the draws)."""
    assert x.shape[-1] % 32 == 0, f"q8_0 rows of {x.shape[-1]}"
    b = x.reshape(-1, 32)
    amax = b.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    # a tip that routes a token otherwise changes an expert's rows: no draw moved those
    slack = None if moved is None or moved.numel() != b.numel() else \
        2 * moved.reshape(b.shape) * inv
    q = _q8(b, b * inv, tips, eps, seen, slack)
    d = amax / 127.0
    return q, d, _scale_f16(d, b.numel(), tips, eps, seen)


def _q8_0(x: torch.Tensor, tips=(), eps: float = 0.0, seen=None, moved=None) -> torch.Tensor:
    """x [..., K] as ggml-cpu's quantize_row_q8_0 (x86) leaves it: _q8_32's codes and scale;
    the dot product reads fp16(d) * q."""
    q, _, d16 = _q8_32(x, tips, eps, seen, moved)
    return (q * d16).reshape(x.shape)


def _q8_k(x: torch.Tensor, tips=(), eps: float = 0.0, seen=None, moved=None) -> torch.Tensor:
    """x [..., K] as quantize_row_q8_K_ref: per 256, max = the value of largest |x| (signed),
    iscale = -127/max, q = min(127, nearest(iscale x)), value (1/iscale) q in fp32."""
    assert x.shape[-1] % 256 == 0, f"q8_K rows of {x.shape[-1]}"
    b = x.reshape(-1, 256)
    mx = b.gather(-1, b.abs().argmax(-1, keepdim=True))
    iscale = torch.where(mx != 0, -127.0 / mx, torch.zeros_like(mx))
    d = torch.where(mx != 0, 1.0 / iscale, torch.zeros_like(mx))
    slack = None if moved is None or moved.numel() != b.numel() else \
        2 * moved.reshape(b.shape) * iscale.abs()
    return (_q8(b, iscale * b, tips, eps, seen, slack).clamp(max=127) * d).reshape(x.shape)


def _q8_1(x: torch.Tensor, tips=(), eps: float = 0.0, seen=None, moved=None):
    """x [..., K] as ggml-cpu's quantize_row_q8_1 (x86) leaves it: q8_0's codes q and fp16
    scale, and per block s = fp16(d * sum(q)) with d = amax/127 in fp32, which a Q4_1 / Q5_1 dot
    product reads for the weight's minimum term (m * s, ggml_vec_dot_q{4,5}_1_q8_1) where a
    product with the dequantized weight reads fp16(d) * sum(q).
    -> (values [..., K], ds [..., K/32] = s - fp16(d) sum(q): what the minimum term adds)."""
    q, d, d16 = _q8_32(x, tips, eps, seen, moved)
    n = q.sum(-1, keepdim=True)
    ds = (d * n).half().float() - d16 * n
    return (q * d16).reshape(x.shape), ds.reshape(*x.shape[:-1], -1)


def _signs(shape, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, tuple(shape), generator=gen).float() * 2 - 1


def _block_noise(x: torch.Tensor, block: int, gen, scale_u: float) -> torch.Tensor:
    """x moved by +-amax/254 per element (amax over each block), and by a factor 1 +- scale_u
    per block (the scale's own rounding)."""
    b = x.reshape(-1, block)
    amax = b.abs().amax(-1, keepdim=True)
    y = b + _signs(b.shape, gen) * amax / 254.0
    if scale_u:
        y = y * (1 + _signs(amax.shape, gen) * scale_u)
    return y.reshape(x.shape)


def _q8_1_noise(x: torch.Tensor, gen):
    """q8_0's noise, and each block's sum s moved by the f16 rounding's largest error
    (+-2^-11 |sum(x)|): (values, ds) as _q8_1 returns them."""
    s = x.reshape(-1, 32).sum(-1, keepdim=True)
    ds = _signs(s.shape, gen) * s.abs() * U16
    return _block_noise(x, 32, gen, U16), ds.reshape(*x.shape[:-1], -1)


# vec_dot_type of each weight type ggml-cpu reads (ggml-cpu.c's type_traits_cpu)
_ACT = {"F32": None, "F16": "f16", "BF16": "bf16", "Q4_1": "q8_1", "Q5_1": "q8_1",
        **{t: "q8_K" for t in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS",
                                "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS", "IQ1_S", "IQ1_M")}}
BLOCK_ROUND = {"q8_0": _q8_0, "q8_K": _q8_k, "q8_1": _q8_1}
FLOAT_ROUND = {"f16": lambda x: x.half().float(), "bf16": lambda x: x.bfloat16().float()}
NOISE = {"f16": lambda x, g: x * (1 + _signs(x.shape, g) * U16),
         "bf16": lambda x, g: x * (1 + _signs(x.shape, g) * UBF16),
         "q8_0": lambda x, g: _block_noise(x, 32, g, U16), "q8_1": _q8_1_noise,
         "q8_K": lambda x, g: _block_noise(x, 256, g, 0.0)}


def activation_format(ggml_type: str) -> str | None:
    """What ggml-cpu rounds the activations to before a product with a weight of this type
    (None: fp32); Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4 read q8_0, Q4_1 / Q5_1 q8_1 (q8_0's values
    and a block sum rounded to f16 for the minimum term: _q8_1)."""
    return _ACT.get(ggml_type, "q8_0")


@dataclass
class Arith:
    """How a read treats the input x of each product with a weight of ggml type t:
    mode "plain": as it is; "emulate": llama.cpp's rounding; "noise": moved by the rounding's
    largest error with random signs (NOISE).
    `order` (a seed): x perturbed by fp32's backward error theta(max(n, tokens)), random signs:
    before an f16 / bf16 rounding (the draws tip those roundings as another summation order
    does: they are many and each small), after a q8 one, whose codes and scales are then the
    read `frozen`'s (its `out`): fp32 order moves what lies between two q8 roundings, and the
    q8 roundings it tips (rare, each a whole step) are searched for instead: `near` gets, per
    rounding call, the flat indices within fp32 error of a midpoint, `tips` {call: indices}
    takes them the other way. `formats` maps a type to another activation format (the tests
    that must fail)."""
    mode: str = "plain"
    order: int | None = None
    noise: int | None = None
    tips: dict = field(default_factory=dict)
    formats: dict = field(default_factory=dict)
    frozen: dict | None = None
    frozen_in: dict | None = None
    window: dict = field(default_factory=dict)
    tokens: int = 1

    def __post_init__(self):
        self.gen = torch.Generator().manual_seed(
            1_000_003 * (self.order or 0) + (self.noise or 0))
        self.hits: set[str] = set()
        self.near: dict[int, list[int]] = {}
        self.out: dict[int, torch.Tensor] = {}
        self.calls, self._last = 0, None
        self.offset = 0                          # the chunk's first position
        self.row_tok: torch.Tensor | None = None  # the chunk rows an expert's input holds
        self.near_tok: dict[int, list[int]] = {}  # the prompt position of each near index
        self.inp: dict[int, torch.Tensor] = {}    # each q8 rounding's input (`frozen_in`)
        self.moved: dict[int, torch.Tensor] = {}  # |input - frozen_in's| (`window`)

    @property
    def active(self) -> bool:
        return self.mode != "plain" or self.order is not None

    def input_fn(self, ggml_type: str, name: str):
        """x -> x as this read gives it to a product with a weight of `ggml_type` (None: as it
        is)."""
        fmt = self.formats.get(ggml_type, activation_format(ggml_type))
        if self.mode == "plain":
            fmt = None
        if fmt is None and self.order is None:
            return None

        def perturb(x):
            return x * (1 + theta(max(x.shape[-1], self.tokens)) * _signs(x.shape, self.gen))

        def fn(x: torch.Tensor) -> torch.Tensor:
            self.hits.add(name)
            if fmt is None:
                return perturb(x)
            if self.mode == "noise":
                return NOISE[fmt](x, self.gen)
            if fmt in FLOAT_ROUND:
                return FLOAT_ROUND[fmt](x if self.order is None else perturb(x))
            # one rounding per distinct input: ggml quantizes it once per product, and the
            # products of one input (q, k, v; gate, up; a DeltaNet's qkv, z, beta, alpha, which
            # may reach here as copies) read the same codes, so a tip tips them all
            last = self._last
            if last is None or fmt != last[1] or not (x is last[0] or (
                    x.shape == last[0].shape and torch.equal(x, last[0]))):
                self._last, self.calls = (x, fmt), self.calls + 1
            c = self.calls - 1
            if self.frozen is not None:
                y = self.frozen[c]
                assert (y[0] if isinstance(y, tuple) else y).shape == x.shape, \
                    "the frozen read took another path"
                if self.frozen_in is not None:
                    self.moved[c] = (x - self.frozen_in[c]).abs()
            elif c in self.out:
                y = self.out[c]
            else:
                seen = self.near.setdefault(c, [])
                self.inp[c] = x
                y = self.out[c] = BLOCK_ROUND[fmt](x, self.tips.get(c, ()),
                                                   theta(max(x.shape[-1], self.tokens)), seen,
                                                   self.window.get(c))
                i = torch.tensor(seen, dtype=torch.long)   # a scale's (past x): its block's
                i = torch.where(i >= x.numel(), (i - x.numel()) * 32, i)
                rows = i // x.shape[-1] % x.shape[-2]
                if self.row_tok is not None:
                    rows = self.row_tok[rows]
                self.near_tok[c] = (self.offset + rows).tolist()
            if self.order is None:
                return y
            return (perturb(y[0]), y[1]) if isinstance(y, tuple) else perturb(y)
        return fn


_MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm,
            torch.Tensor.mm, torch.bmm, torch.Tensor.bmm}
_VIEWS = {torch.Tensor.t, torch.Tensor.transpose, torch.Tensor.view, torch.Tensor.reshape,
          torch.Tensor.to, torch.Tensor.float, torch.Tensor.contiguous, torch.Tensor.detach,
          torch.Tensor.clone, torch.Tensor.__getitem__}


class Rounding(torch.Tensor):
    """A dense weight whose products hand the other operand (the activations) through `rnd`
    along the contraction first (Arith.input_fn; `in_file_order`'s, which may return
    (values, add): the product of the values, plus add). Its views and dtype moves keep it;
    every other op returns plain tensors (a row lookup, the embedding, is not a product)."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, rnd):
        t = torch.Tensor._make_subclass(cls, data)
        t.rnd = rnd
        return t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            if func in _MATMULS or func is torch.Tensor.__rmatmul__:
                a, b = (args[1], args[0]) if func is torch.Tensor.__rmatmul__ else args[:2]
                if isinstance(b, Rounding) and not isinstance(a, Rounding):   # x @ W^T
                    x = b.rnd(a.contiguous())
                    if isinstance(x, tuple):
                        return torch.matmul(x[0], b) + x[1]
                    return torch.matmul(x, b)
                if isinstance(a, Rounding) and not isinstance(b, Rounding):  # W @ x
                    x = a.rnd(b.transpose(-1, -2).contiguous())
                    if isinstance(x, tuple):
                        raise NotImplementedError("a minimum term in a W @ x product")
                    return torch.matmul(a, x.transpose(-1, -2))
                raise NotImplementedError("a product of two rounding weights")
            if func in (torch.nn.functional.linear, torch.einsum, torch.addmm, torch.baddbmm):
                raise NotImplementedError(f"{func.__name__} on a rounding weight")
            out = func(*args, **kwargs)
            w = next(a for a in args if isinstance(a, Rounding))
            keep = func in _VIEWS and not (func is torch.Tensor.__getitem__ and any(
                isinstance(i, torch.Tensor) for i in (args[1] if isinstance(args[1], tuple)
                                                      else (args[1],))))
            if keep and isinstance(out, torch.Tensor):
                return Rounding(out, w.rnd)
            return out


def _expert_ffn(arith: Arith):
    """strata.models.moe.moe_ffn_ref with each expert matrix's input given as `arith` says for
    its format (llama.cpp's mul_mat_id of ffn_{gate,up,down}_exps reads them so)."""
    from strata.kernels.moe.ffn import dequantize_matrix, expert_biases, glu

    def expert(xe, experts, e):
        lay = experts.layout

        def mm(x, name):
            fn = arith.input_fn(getattr(lay, name).fmt.name, f"experts.{name}")
            x = x if fn is None else fn(x)
            if isinstance(x, tuple):   # no fixture holds Q4_1 / Q5_1 experts
                raise NotImplementedError(f"the minimum term of {name} experts")
            return x @ dequantize_matrix(experts, e, name).T
        b = expert_biases(experts, e)
        g, u = mm(xe, "gate"), mm(xe, "up")
        if b is not None:
            g, u = g + b[0], u + b[1]
        y = mm(glu(g, u, lay.act), "down")
        return y + b[2] if b is not None else y

    def ffn(x, topk_ids, topk_w, experts, *, out=None, **_):
        y = torch.zeros(x.shape, dtype=torch.float32)
        for e in torch.unique(topk_ids).tolist():
            if e < 0:
                continue
            tok, slot = torch.nonzero(topk_ids == e, as_tuple=True)
            arith.row_tok = tok
            ye = expert(x.float()[tok], experts, e)
            arith.row_tok = None
            y.index_add_(0, tok, ye * topk_w[tok, slot].float()[:, None])
        return out.add_(y) if out is not None else y.to(x.dtype)
    return ffn


def _mla(q_nope, q_pe, c, k_pe, wkvb, *, v_head_dim, scale, prefix=(), c_scale=None,
         k_pe_scale=None, **_):
    """llama.cpp's MLA (absorbed: attn_k_b into the query, attn_v_b after the attention over the
    latent), fp32, q_nope handed through attn_k_b's input function and the latent output
    through attn_v_b's."""
    assert not prefix and c_scale is None
    rk, rv = wkvb.rnd
    H, T, N = q_nope.shape
    with torch._C.DisableTorchFunctionSubclass():
        w = wkvb.float().view(H, N + v_head_dim, -1)
        w_uk, w_uv = w[:, :N], w[:, N:]                                   # [H, N|Hv, Lkv]
        q_lat = (q_nope if rk is None else rk(q_nope.contiguous())) @ w_uk  # [H, T, Lkv]
        S = c.shape[0]
        sc = (q_lat @ c.float().t() + q_pe.float() @ k_pe.float().t()) * scale
        hide = torch.arange(S)[None, :] > (S - T + torch.arange(T))[:, None]
        p = torch.softmax(sc.masked_fill(hide, float("-inf")), dim=-1)
        o_lat = p @ c.float()                                             # [H, T, Lkv]
        o = (o_lat if rv is None else rv(o_lat.contiguous())) @ w_uv.transpose(1, 2)
    return o.transpose(0, 1).to(q_nope.dtype)                             # [T, H, Hv]


def _delta_rule(arith: Arith):
    """The torch delta rule (the CPU path of strata.models.qwen3_next) with its inputs moved by
    fp32's backward error, as `order` moves a product's: llama.cpp's gated delta net sums the same
    dot products (over dk, and the decays over the tokens) in its own order, which no weight
    product of the read covers."""
    from strata.kernels.deltanet import chunk_gated_delta_rule_torch as rule

    def run(q, k, v, g, beta, *args, **kw):
        def p(x, n):
            return x * (1 + theta(max(n, arith.tokens)) * _signs(x.shape, arith.gen))
        d = q.shape[-1]
        return rule(p(q, d), p(k, d), p(v, d), p(g, arith.tokens), beta, *args, **kw)
    return run


def llama_cpp_shape(shape):
    """The shape with llama.cpp's conventions where strata reads a GGUF otherwise: YaRN's
    correction range rounded to whole dims (ggml_rope_yarn_corr_dims floors / ceils it; strata
    reads gpt-oss as transformers and the release do, truncate false)."""
    return shape.with_(**{"yarn.truncate": True}) if shape.yarn is not None else shape


def gguf_types(src) -> dict[str, str]:
    import gguf
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(src)).tensors}


def block_mins(src) -> dict[str, torch.Tensor]:
    """Each 2-D Q4_1 / Q5_1 tensor's per-block minimum m, fp32 [N, K/32] in the file's order
    (a block: fp16 d, fp16 m, then the codes)."""
    import gguf
    out = {}
    for t in gguf.GGUFReader(str(src)).tensors:
        if t.tensor_type.name in ("Q4_1", "Q5_1") and len(t.shape) == 2:
            nbytes = gguf.GGML_QUANT_SIZES[t.tensor_type][1]
            raw = np.asarray(t.data).view(np.uint8).reshape(-1, nbytes)
            m = raw[:, 2:4].copy().view(np.float16).astype(np.float32)
            out[t.name] = torch.from_numpy(m).reshape(int(t.shape[1]), -1)
    return out


def file_order(name: str, t: torch.Tensor, shape) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(R, C): strata's dense weight t [N, K] is the file's tensor with rows R and columns C
    (t[i, j] = file[R[i], C[j]]: the record's gguf_dense moves rows for RoPE's order and, for
    Qwen3.5, the value heads back from the converter's tiled order); None where both are the
    file's own. gguf_dense must be such a permutation (checked)."""
    from strata.archs.registry import get_arch
    dense = get_arch(shape.arch).gguf_dense
    N, K = t.shape
    i = torch.arange(N, dtype=torch.float64)[:, None].expand(N, K).contiguous()
    j = torch.arange(K, dtype=torch.float64)[None, :].expand(N, K).contiguous()
    R, C = dense(name, i, shape)[:, 0].long(), dense(name, j, shape)[0].long()
    assert torch.equal(dense(name, i * K + j, shape), (R[:, None] * K + C[None, :]).double()), \
        f"{name}: gguf_dense is not a permutation of rows and columns"
    if torch.equal(R, torch.arange(N)) and torch.equal(C, torch.arange(K)):
        return None
    return R, C


def in_file_order(fn, order, mins: torch.Tensor | None):
    """An Arith input function `fn` as a product with a weight of file_order `order` and block
    minimums `mins` (block_mins, file order) sees it: x handed to fn in the file's column order
    (llama.cpp's activations come in the order the file's columns are, so a q8 block holds the
    file's 32 neighbours, not strata's), the values back in strata's; a q8_1 rounding's block
    sums (fn -> (values, ds)) turned into what the minimum term adds, ds @ m^T."""
    if fn is None or order is None and mins is None:
        return fn
    R, C = order if order is not None else (None, None)

    def g(x):
        if C is not None:
            xf = torch.empty_like(x)
            xf[..., C] = x
            x = xf
        y = fn(x)
        vals, ds = y if isinstance(y, tuple) else (y, None)
        vals = vals if C is None else vals[..., C]
        if ds is None:
            return vals
        assert mins is not None, "a q8_1 rounding without the weight's minimums"
        return vals, ds @ (mins if R is None else mins[R]).t()
    return g


@dataclass
class Read:
    logits: np.ndarray                 # [T, V]
    topk: list[torch.Tensor]           # per MoE layer, the chosen ids [T, K] (sorted per row)
    near: list = field(default_factory=list)   # q8 roundings near a midpoint: (call, i, pos)


def read_pack(pack, src=None, *, tokens, arith: Arith | None = None, shape=None,
              chunk: int = 4) -> Read:
    """strata's fp32 reference on the pack (experts "ref", chunks of `chunk`), with each
    product's input as `arith` says for the types of the GGUF `src` the pack was made from
    (Arith(): as `strata prefill --device cpu --experts ref` reads it). `shape` overrides the
    pack's. Every weight `arith` treats must be met by a product (else the read missed one)."""
    from strata.models import mla, moe
    from strata.engine.load import resident_provider
    from strata.models.observe import RouteRecorder
    from strata.archs.registry import get_arch
    from strata.packs import Pack
    p = Pack.open(pack)
    shape = shape or p.shape
    arith = arith or Arith()
    arith.tokens = len(tokens)
    tensors = {n: p.dense(n) for n in p.dense_names()}
    types = gguf_types(src) if arith.active else {}
    mins = block_mins(src) if arith.active else {}
    wrapped = set()
    for n, t in tensors.items():
        if not arith.active or t.dim() != 2 or n == "token_embd.weight" and \
                "output.weight" in tensors:
            continue
        if n.endswith("ssm_conv1d.weight"):   # a DeltaNet conv's taps, not a product's weight:
            continue                          # llama.cpp's ssm_conv reads its F32 input as is
        if n.endswith("attn_kv_b.weight") and n not in types:   # joined from k_b / v_b
            pre = n[:-len("attn_kv_b.weight")]
            fns = tuple(arith.input_fn(types[f"{pre}attn_{k}_b.weight"], f"{pre}attn_{k}_b")
                        for k in ("k", "v"))
            tensors[n] = Rounding(t, fns)
            wrapped |= {f"{pre}attn_{k}_b" for k, f in zip("kv", fns) if f is not None}
            continue
        fn = in_file_order(arith.input_fn(types[n], n), file_order(n, t, p.shape), mins.get(n))
        if fn is not None:
            tensors[n] = Rounding(t, fn)
            wrapped.add(n)
    patches = contextlib.ExitStack()
    try:
        if arith.active:
            patches.enter_context(mock.patch.object(mla, "mla_chunk_attention", _mla))
        if arith.order is not None:   # a hybrid's linear-attention layers (Qwen3-Next, Qwen3.5)
            # the CPU's delta rule, as strata.kernels.deltanet.chunk.delta_rule_on looks it up
            from strata.kernels.deltanet import naive
            patches.enter_context(mock.patch.object(naive, "chunk_gated_delta_rule_torch",
                                                    _delta_rule(arith)))
    except BaseException:             # a patch that cannot be made leaves none behind
        patches.close()
        raise

    provider = resident_provider(p, "cpu")
    begin_chunk = provider.begin_chunk

    def chunk_at(start: int, n_tokens: int) -> None:
        # the chunk's first position, set before its first product: the LM head's roundings
        # come after the last layer and are the chunk's rows too
        arith.offset = start
        begin_chunk(start, n_tokens)
    provider.begin_chunk = chunk_at
    rec = RouteRecorder(shape.n_layer)
    with patches:
        ffn = _expert_ffn(arith) if arith.active else moe.moe_ffn_ref
        model = get_arch(p.shape.arch).build(shape, tensors, device="cpu",
                                                    dtype=torch.float32, ffn=ffn)
        with torch.no_grad():
            out = model.prefill(tokens, provider, chunk=chunk, observer=rec).numpy()
    missed = wrapped - arith.hits
    assert not missed, f"the read never multiplied {sorted(missed)}"
    return Read(out, [t.sort(-1).values for t in rec.topk if t.numel()],
                [(c, i, tk) for c in sorted(arith.near)
                 for i, tk in zip(arith.near[c], arith.near_tok.get(c, []))])


def decided(base: Read, others: list[Read]) -> int:
    """The rows before the first token any of `others` routes differently from `base` in any
    MoE layer (all rows when none does)."""
    T = base.logits.shape[0]
    first = T
    for o in others:
        for a, b in zip(base.topk, o.topk):
            bad = (a != b).any(-1).nonzero()
            if bad.numel():
                first = min(first, int(bad[0]))
    return first


def spread(base: Read, draws: list[Read], rows: int | None = None) -> float:
    """2 x the largest rel(draw, base) over the draws (over the first `rows` rows)."""
    r = slice(None, rows)
    return 2 * max(rel(d.logits[r], base.logits[r]) for d in draws)


# the most roundings near a midpoint at one position the search takes (2^n reads at worst;
# the combinations are tried fewest tips first)
TIPS_AT_ONE_POSITION = 8


def tipped(read, base: Read, want: np.ndarray, bound: float
           ) -> tuple[Read, list[tuple[int, int]]]:
    """The q8 roundings llama.cpp's fp32 order tipped, among those that lie within fp32 error
    of a midpoint (`base.near`): row by row, at the first row off `want` by `bound` or more,
    the combination of that position's roundings whose read brings it within (each read as it
    is; a tip moves its own row and the later ones only). `read(tips)` -> Read."""
    scale = np.abs(want).max()
    cur, tips = base, {}
    done = -1
    while True:
        off = np.abs(cur.logits - want).max(-1) / scale >= bound
        off[:done + 1] = False
        if not off.any():
            return cur, sorted((c, i) for c, v in tips.items() for i in v)
        r = int(np.flatnonzero(off)[0])
        here = [(c, i) for c, i, tk in cur.near if tk == r]
        assert len(here) <= TIPS_AT_ONE_POSITION, f"{len(here)} q8 roundings near at {r}"
        fixed = None
        for m in sorted(range(1, 2 ** len(here)), key=lambda m: (m.bit_count(), m)):
            t = {c: list(v) for c, v in tips.items()}
            for j, (c, i) in enumerate(here):
                if m >> j & 1:
                    t.setdefault(c, []).append(i)
            got = read(t)
            if np.abs(got.logits[r] - want[r]).max() / scale < bound:
                fixed = (got, t)
                break
        if fixed is None:       # no tipping explains the row: the comparison says so
            return cur, sorted((c, i) for c, v in tips.items() for i in v)
        (cur, tips), done = fixed, r


def _pack(src: Path, d: Path) -> Path:
    from strata.cli import main
    out = d / (src.stem + ".pack")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["pack", str(src), "-o", str(out)]) == 0
    return out


@dataclass
class FileReads:
    """The reads of one fixture file and its bounds."""
    want: np.ndarray           # llama.cpp's logits
    emulated: Read             # llama.cpp's rounding emulated (with the tips found, if any)
    plain: Read                # strata's own read
    emulated_bound: float      # EMULATED
    plain_bound: float         # PLAIN
    rows: int                  # the rows PLAIN holds (routed alike under the rounding)
    routed_alike: int          # the rows before an order draw of the emulated read routes apart
    tips: list                 # the q8 roundings taken the other way (call, index)
    near: int                  # how many lay within fp32 of a midpoint


@dataclass
class Emulated:
    """A file's emulated read (with the tips found, if any) and its bound."""
    read: Read
    bound: float               # EMULATED
    draws: list                # the order draws' reads (frozen codes)
    tips: list                 # the q8 roundings taken the other way (call, index)
    near: int                  # how many lay within fp32 of a midpoint


def emulated_read(pack: Path, src: Path, tokens: list[int], want: np.ndarray | None,
                  shape=None, **arith) -> Emulated:
    """llama.cpp's rounding emulated on one prompt, EMULATED from the order draws, and (when
    `want` and the read is off it by EMULATED) the q8 roundings llama.cpp's order tipped."""
    from strata.packs import Pack
    shape = shape or llama_cpp_shape(Pack.open(pack).shape)

    def rd(**kw):
        return read_pack(pack, src, tokens=tokens, shape=shape, arith=Arith(**{**arith, **kw}))
    a = Arith(mode="emulate", **arith)
    emu = read_pack(pack, src, tokens=tokens, shape=shape, arith=a)
    draws = [Arith(mode="emulate", order=i + 1, frozen=a.out, frozen_in=a.inp, **arith)
             for i in range(DRAWS)]
    emu_d = [read_pack(pack, src, tokens=tokens, shape=shape, arith=d) for d in draws]
    eb = spread(emu, emu_d)
    tips, near = [], len(emu.near)
    if want is not None and rel(emu.logits, want) >= eb:
        # the roundings near a midpoint: within fp32 error of it, or within what the draws
        # moved the rounding's input by (upstream fp32 order, which a chain of DeltaNet
        # layers carries further than one product's error)
        window = {c: torch.stack([d.moved[c] for d in draws]).amax(0) for c in draws[0].moved}
        emu = rd(mode="emulate", window=window)
        near = len(emu.near)
        emu, tips = tipped(lambda t: rd(mode="emulate", tips=t, window=window), emu, want, eb)
    return Emulated(emu, eb, emu_d, tips, near)


def file_reads(pack: Path, src: Path, tokens: list[int], want: np.ndarray | None,
               **arith) -> FileReads:
    """Every read and bound of one file (`arith`: Arith fields every read takes: a deliberate
    error; `want` None: no llama.cpp logits yet, no tips looked for: the maker's prompt pick)."""
    from strata.packs import Pack
    shape = llama_cpp_shape(Pack.open(pack).shape)

    def rd(**kw):
        return read_pack(pack, src, tokens=tokens, shape=shape, arith=Arith(**{**arith, **kw}))
    e = emulated_read(pack, src, tokens, want, shape, **arith)
    plain = rd()
    noise_d = [rd(mode="noise", noise=i + 1) for i in range(DRAWS)]
    rows = decided(plain, [e.read, *noise_d])
    return FileReads(want, e.read, plain, e.bound, spread(plain, noise_d, rows) + e.bound, rows,
                     decided(e.read, e.draws), e.tips, e.near)
