"""Model shapes and the presets people plan against.

Legend: L layers, D hidden, F expert width, E experts, K top-k, H query heads, Hkv kv heads,
hd head dim, V vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from strata.errors import StrataError


@dataclass(frozen=True)
class GptOssOptions:
    """GPT-OSS's experts: each blob carries fp32 gate/up/down biases (strata.blob.BiasSlot), and
    the activation is the clamped SwiGLU h = min(g, limit)·sigmoid(alpha·min(g, limit)) ·
    (clamp(u, ±limit) + 1) (strata.blob.ExpertAct "swiglu_oai")."""
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0


@dataclass(frozen=True)
class Window:
    """Sliding-window attention (GPT-OSS): layer l sees only the last `size` keys when
    l % pattern < pattern - 1 (llama.cpp's set_swa_pattern; 2: the even layers), else all."""
    size: int = 0
    pattern: int = 2


@dataclass(frozen=True)
class Yarn:
    """YaRN's RoPE (GPT-OSS, DeepSeek-V3, Kimi-K2; strata.models.layers.yarn_cos_sin): the
    context scale `factor` over the pretraining context `orig_ctx`, the correction range's
    betas (rounded to whole dims when `truncate`, HF's default), the cos/sin multiplier `attn`
    (0: YaRN's own 0.1 ln(factor) + 1; DeepSeek: mscale / mscale_all_dim,
    strata.rope_scaling.deepseek_yarn) and `kq`, the multiplier of the softmax scale 1/sqrt(hd)
    (DeepSeek: mscale_all_dim's temperature squared)."""
    factor: float = 1.0
    orig_ctx: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attn: float = 0.0
    kq: float = 1.0


@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention (DeepSeek-V3, Kimi-K2; strata.models.mla): head_dim =
    qk_nope + qk_rope, n_kv_head = n_head."""
    q_lora: int = 0             # q's low-rank width (0: a full Wq)
    kv_lora: int = 0            # the cached latent's width
    qk_rope: int = 0            # rope dims of q/k per head (the key's shared rope part)
    v_head_dim: int = 0         # value head dim


@dataclass(frozen=True)
class DenseFfn:
    """The dense FFNs beside the routed experts (the DeepSeek / GLM-4.5 family; the defaults:
    none, every layer routed): the first `lead` layers have one dense FFN of width `d_ff` and
    no routed experts; each MoE layer adds `shared` shared experts (one dense FFN of shared * F)."""
    lead: int = 0
    d_ff: int = 0
    shared: int = 0


@dataclass(frozen=True)
class Router:
    """How a MoE layer picks its experts (strata.models.routers): `kind` softmax (the default)
    or sigmoid (grouped, steered by e_score_correction_bias: DeepSeek, GLM-4.5, MiniMax-M2),
    which keeps the best `topk_group` of `n_group` expert groups; the routed weights are
    scaled by `scale` (routed_scaling_factor, once)."""
    kind: str = "softmax"
    n_group: int = 1
    topk_group: int = 1
    scale: float = 1.0


@dataclass(frozen=True)
class Attn:
    """Details of the attention block (the defaults: Qwen3's)."""
    qk_norm: bool = True        # per-head q/k RMSNorm (Qwen3); GLM-4.5 has none
    bias: bool = False          # q/k/v projection biases (GLM-4.5)
    rope_dim: int = 0           # rotary dims of a head (0: all of head_dim; GLM-4.5: half)


@dataclass(frozen=True)
class LinearAttention:
    """Linear-attention layers (Gated DeltaNet: Qwen3-Next, Qwen3.5-MoE) beside full ones.

    A linear layer keeps no KV: a short causal conv over q, k, v (kernel `conv_kernel`, its last
    K-1 inputs carried) and the recurrent state S [Hv, dk, dv] (strata.kernels.deltanet). Which
    layers are linear: `layer_types` when given (one "linear" | "full" a layer), else every
    layer but each `full_interval`-th ((l + 1) % full_interval == 0 is full attention)."""
    conv_kernel: int = 4        # K
    n_k_head: int = 16          # Hk key heads (q and k)
    n_v_head: int = 32          # Hv value heads (a multiple of Hk)
    k_head_dim: int = 128       # dk
    v_head_dim: int = 128       # dv
    full_interval: int = 4
    layer_types: tuple[str, ...] = ()

    def kind(self, layer: int) -> str:
        """"linear" or "full" (see the class doc)."""
        if self.layer_types:
            return self.layer_types[layer]
        return "full" if (layer + 1) % self.full_interval == 0 else "linear"


LAYER_KINDS = ("full", "linear")


# The option groups inside ModelShape, by field name (an architecture's record names the types
# its shapes set: strata.archs.record.Arch.options). Window, Yarn, Mla and GptOssOptions are
# None where the model has none; the others hold their defaults.
OPTION_GROUPS: dict[str, type] = {"opts": GptOssOptions, "window": Window, "yarn": Yarn,
                                  "dense": DenseFfn, "router": Router, "attn": Attn, "mla": Mla,
                                  "linear": LinearAttention}

# The flat keys a shape's dict (a pack's header) has always carried, in their order: to_dict
# writes them and from_dict reads them, so packs written before and after read alike. Each
# group's keys (header key -> field; a group the shape lacks writes its defaults), and the keys
# that say whether a None-able group is there (key -> its value when there, when not).
_HEADER_KEYS: dict[str, dict[str, str]] = {
    "opts": {"swiglu_alpha": "swiglu_alpha", "swiglu_limit": "swiglu_limit"},
    "window": {"sliding_window": "size", "sliding_pattern": "pattern"},
    "yarn": {"rope_factor": "factor", "rope_orig_ctx": "orig_ctx",
             "yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow",
             "yarn_truncate": "truncate", "yarn_attn": "attn", "yarn_kq": "kq"},
    "dense": {"n_dense_lead": "lead", "d_ff": "d_ff", "n_shared": "shared"},
    "router": {"router": "kind", "n_group": "n_group", "topk_group": "topk_group",
               "routed_scale": "scale"},
    "attn": {"qk_norm": "qk_norm", "attn_bias": "bias", "rope_dim": "rope_dim"},
    "mla": {"q_lora": "q_lora", "kv_lora": "kv_lora", "qk_rope": "qk_rope",
            "v_head_dim": "v_head_dim"},
}
_THERE_KEYS: dict[str, dict[str, tuple]] = {
    "opts": {"expert_bias": (True, False), "expert_act": ("swiglu_oai", "silu")},
    "yarn": {"rope_scaling": ("yarn", "")},
}


def _there(name: str, g, d: dict) -> bool:
    """Whether header `d` holds option group `name` (its keys read as `g`): GPT-OSS's options
    when its experts are biased or not silu (as packs have always been read), YaRN when
    rope_scaling says "yarn", a window of positive size, MLA with a latent; the others always."""
    if name == "opts":      # any activation but silu, or biased experts
        return d.get("expert_act", "silu") != "silu" or bool(d.get("expert_bias"))
    if name == "yarn":
        return d.get("rope_scaling") == "yarn"
    if name == "window":
        return g.size > 0
    if name == "mla":
        return g.kv_lora > 0
    return True


@dataclass(frozen=True)
class ModelShape:
    arch: str = "qwen3moe"
    n_layer: int = 2            # L
    d_model: int = 64           # D
    n_expert: int = 8           # E
    top_k: int = 2              # K
    d_expert: int = 32          # F
    n_head: int = 4             # H
    n_kv_head: int = 2          # Hkv
    head_dim: int = 16          # hd
    vocab: int = 256            # V
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    norm_topk_prob: bool = True
    max_pos: int = 40960        # the longest prompt strata accepts (the model's context)
    # The architecture options (OPTION_GROUPS), each a small dataclass, off or at its default
    # unless the architecture's record declares it (Qwen3-MoE needs none of them); what an
    # architecture's wiring and tensor-name map read (docs/architectures.md).
    opts: GptOssOptions | None = None   # GPT-OSS's biased experts and clamped SwiGLU
    window: Window | None = None
    yarn: Yarn | None = None            # None: plain RoPE
    dense: DenseFfn = DenseFfn()
    router: Router = Router()
    attn: Attn = Attn()
    mla: Mla | None = None
    # Linear-attention layers beside the full ones (Qwen3-Next, Qwen3.5-MoE); None: none.
    linear: LinearAttention | None = None

    def __post_init__(self):
        lin = self.linear
        if lin is None:
            return
        if lin.layer_types and (len(lin.layer_types) != self.n_layer
                                or set(lin.layer_types) - set(LAYER_KINDS)):
            raise StrataError(f"linear.layer_types must name {self.n_layer} layers, each one of "
                              f"{LAYER_KINDS}; got {list(lin.layer_types)}")
        if not lin.layer_types and lin.full_interval < 1:
            raise StrataError(f"linear.full_interval must be >= 1, got {lin.full_interval}")
        if lin.n_k_head < 1 or lin.n_v_head % lin.n_k_head:
            raise StrataError(f"linear.n_v_head ({lin.n_v_head}) must be a multiple of "
                              f"linear.n_k_head ({lin.n_k_head})")

    def layer_kind(self, layer: int) -> str:
        """"full" (softmax attention over KV) or "linear" (a recurrent state, no KV)."""
        return "full" if self.linear is None else self.linear.kind(layer)

    def option_groups(self) -> list:
        """The option groups the shape sets (those other than the field's default: not None, or
        not the default instance)."""
        return [g for f in fields(self)
                if f.name in OPTION_GROUPS and (g := getattr(self, f.name)) != f.default]

    def is_moe_layer(self, layer: int) -> bool:
        """True when `layer` routes to experts (False: a leading dense layer, no blobs)."""
        return layer >= self.dense.lead

    @property
    def moe_layers(self) -> list[int]:
        return [l for l in range(self.n_layer) if self.is_moe_layer(l)]

    @property
    def rot_dim(self) -> int:
        """Rotary dims per head: qk_rope (MLA), rope_dim (partial RoPE) or all of head_dim."""
        return self.mla.qk_rope if self.mla else (self.attn.rope_dim or self.head_dim)

    def with_(self, **kw) -> "ModelShape":
        """A copy with fields changed; "<group>.<name>" (e.g. "window.size") changes a field of
        an option group the shape has."""
        nested: dict[str, dict] = {}
        for k in [k for k in kw if "." in k]:
            group, name = k.split(".", 1)
            nested.setdefault(group, {})[name] = kw.pop(k)
        for group, changes in nested.items():
            base = kw.get(group, getattr(self, group))
            if base is None:
                raise StrataError(f"{self.arch} has no {group} options to change "
                                  f"({', '.join(changes)})")
            kw[group] = replace(base, **changes)
        return replace(self, **kw)

    def field(self, name: str):
        """A field's value by name; "<group>.<name>" reads an option group's field (a group the
        shape lacks reads as its defaults, the values its header keys carry)."""
        group, _, name_in = name.partition(".")
        if not name_in:
            return getattr(self, name)
        return getattr(getattr(self, group) or OPTION_GROUPS[group](), name_in)

    def to_dict(self) -> dict:
        """The fields as a flat dict (a pack's header): the plain fields in field order, then
        each option group as the flat keys packs have always carried (_HEADER_KEYS)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in OPTION_GROUPS}
        for name, keys in _HEADER_KEYS.items():
            g = getattr(self, name)
            out |= {k: on if g is not None else off
                    for k, (on, off) in _THERE_KEYS.get(name, {}).items()}
            g = g or OPTION_GROUPS[name]()
            out |= {k: getattr(g, f) for k, f in keys.items()}
        if self.linear is not None:   # a nested dict, only when set: other headers unchanged
            out["linear"] = {f.name: (list(v) if isinstance(v, tuple) else v)
                             for f in fields(self.linear) for v in (getattr(self.linear, f.name),)}
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "ModelShape":
        """The shape of a dict to_dict wrote, or of a header written before (its absent keys
        read as the defaults)."""
        known = {k: v for k, v in d.items()
                 if k in cls.__dataclass_fields__ and k not in OPTION_GROUPS}
        for name, keys in _HEADER_KEYS.items():
            g = OPTION_GROUPS[name](**{f: d[k] for k, f in keys.items() if k in d})
            known[name] = g if _there(name, g, d) else None
        if d.get("linear") is not None:
            lin = dict(d["linear"])
            lin["layer_types"] = tuple(lin.get("layer_types", ()))
            known["linear"] = LinearAttention(**lin)
        return cls(**known)

    @property
    def expert_bias(self) -> bool:
        """The experts carry gate/up/down biases (in the blob, fp32)."""
        return isinstance(self.opts, GptOssOptions)

    @property
    def expert_params(self) -> int:
        """Weights of one expert (gate + up + down)."""
        return 3 * self.d_model * self.d_expert

    def layer_window(self, layer: int) -> int:
        """Keys a query of `layer` sees at most (its window), 0 for full attention."""
        w = self.window
        if w is not None and w.size > 0 and w.pattern > 0 and layer % w.pattern < w.pattern - 1:
            return w.size
        return 0

    @property
    def expert_act_spec(self):
        """The experts' activation as the blob layout records it (strata.blob.ExpertAct)."""
        from strata.blob import ExpertAct
        if not isinstance(self.opts, GptOssOptions):
            return ExpertAct()
        return ExpertAct("swiglu_oai", self.opts.swiglu_alpha, self.opts.swiglu_limit)

    @property
    def kv_heads(self) -> tuple[int, int, int]:
        """(heads, key width, value width) of one token's cached KV in one layer, in the KV
        format's terms (strata.kernels.attention.kv_int8.kv_token_parts): GQA Hkv heads of hd
        and hd; MLA one "head" whose key is the normed latent (kv_lora) and whose value is the
        rotated rope key (qk_rope: strata.models.mla). The plan counts these bytes and the
        caches (strata.models.kv.PromptKV, strata.models.mla.MLACache) allocate them."""
        if self.mla:
            return 1, self.mla.kv_lora, self.mla.qk_rope
        return self.n_kv_head, self.head_dim, self.head_dim

    def kv_bytes(self, n_tokens: int, kv: str = "bf16") -> int:
        """One layer's KV cache for n_tokens in the KV dtype `kv` (bf16 | int8: codes and fp32
        scales per token per kv head): the attention format's own count (kv_token_bytes) of
        `kv_heads`. The one count the rig's budgets charge (strata.planning hands it to memory)."""
        from strata.kernels.attention.kv_int8 import kv_token_bytes
        return n_tokens * kv_token_bytes(kv, *self.kv_heads)


def mla_token_bytes(shape: "ModelShape", kv: str = "bf16") -> int:
    """One token's MLA KV in one layer: the latent (kv_lora) and the rope key (qk_rope), in
    bf16, or int8 with one fp32 scale each (strata.kernels.attention.kv_int8's per-token-per-head
    format, the latent and the rope key one "head": ModelShape.kv_heads)."""
    if not shape.mla:
        raise StrataError(f"{shape.arch} is not MLA (kv_lora 0)")
    return shape.kv_bytes(1, kv)


def _ds_yarn(factor: float, orig: int, beta_fast: float, beta_slow: float) -> Yarn:
    """DeepSeek's YaRN for mscale = mscale_all_dim = 1 (strata.rope_scaling.deepseek_yarn:
    cos/sin x 1, the softmax scale x mscale(factor)^2)."""
    from strata.rope_scaling import deepseek_yarn
    attn, kq = deepseek_yarn(factor, 1.0, 1.0)
    return Yarn(factor, orig, beta_fast, beta_slow, attn=attn, kq=kq)


_TINY_QWEN3MOE = ModelShape("qwen3moe", 2, 64, 8, 2, 32, 4, 2, 16, 256)
# GPT-OSS's YaRN: x32 over 4096, the correction range not truncated (the release's config)
_GPT_OSS_YARN = Yarn(32.0, 4096, truncate=False)
# GLM-4.5's attention: q/k/v biases, no q/k norms, RoPE on half of each head's 128 dims
_GLM_ATTN = Attn(qk_norm=False, bias=True, rope_dim=64)

PRESETS: dict[str, ModelShape] = {
    # Qwen3-30B-A3B: 48 layers, 128 experts of width 768, top-8.
    # Context as the Instruct-2507 release ships it (config.json: max_position_embeddings 262144
    # with rope_theta 1e7, native, no YaRN): the checkpoint people read 200K-token documents with.
    "qwen3-30b-a3b": ModelShape("qwen3moe", 48, 2048, 128, 8, 768, 32, 4, 128, 151936,
                                rope_theta=10_000_000.0, max_pos=262144),
    # Qwen3-235B-A22B: 94 layers, 128 experts of width 1536, top-8. Context as the 2507 releases
    # ship it (Instruct-2507 / Thinking-2507 config.json: max_position_embeddings 262144 with
    # rope_theta 5e6, native, no YaRN), as for qwen3-30b-a3b: the first release's 40,960
    # (theta 1e6) would refuse the 131K prompts people read through it.
    "qwen3-235b-a22b": ModelShape("qwen3moe", 94, 4096, 128, 8, 1536, 64, 4, 128, 151936,
                                  rope_theta=5_000_000.0, max_pos=262144),
    # The seeds' rig shape: 512 experts, hidden 2560, expert width 640 (Q2_0 blob = 1,382,400 B).
    "seed-512e": ModelShape("qwen3moe", 30, 2560, 512, 10, 640, 16, 4, 256, 262144),
    # Mixtral 8x7B (mistralai/Mixtral-8x7B-v0.1 config.json): 32 layers, 8 experts of width
    # 14336, top-2, GQA 32/8, no QK-norm, theta 1e6, 32K context.
    "mixtral-8x7b": ModelShape("mixtral", 32, 4096, 8, 2, 14336, 32, 8, 128, 32000,
                               rope_theta=1_000_000.0, rms_eps=1e-5, max_pos=32768),
    # gpt-oss-120b / 20b (openai/gpt-oss-* config.json): 36 / 24 layers, 128 / 32 experts of
    # width 2880 with biases and the clamped SwiGLU, top-4; attention 64 heads of 64 over 8 kv
    # heads with biases and sinks, even layers sliding (window 128); YaRN x32 over 4096
    # (truncate false), theta 150000; 131072 context.
    "gpt-oss-120b": ModelShape("gpt-oss", 36, 2880, 128, 4, 2880, 64, 8, 64, 201088,
                               rope_theta=150_000.0, rms_eps=1e-5, max_pos=131072,
                               opts=GptOssOptions(), window=Window(128), yarn=_GPT_OSS_YARN),
    "gpt-oss-20b": ModelShape("gpt-oss", 24, 2880, 32, 4, 2880, 64, 8, 64, 201088,
                              rope_theta=150_000.0, rms_eps=1e-5, max_pos=131072,
                              opts=GptOssOptions(), window=Window(128), yarn=_GPT_OSS_YARN),
    # GLM-4.5 (355B-A32B): 92 layers (the NextN layer not read), the first 3 dense (FFN 12288),
    # 160 experts of width 1536, top-8, one shared expert, sigmoid routing in one group, scale
    # 2.5; GQA 96 / 8 heads of 128 with qkv bias, RoPE on half of each head, no q/k norm.
    "glm-4.5": ModelShape("glm4moe", 92, 5120, 160, 8, 1536, 96, 8, 128, 151552,
                          rms_eps=1e-5, max_pos=131072, dense=DenseFfn(3, 12288, 1),
                          router=Router("sigmoid", scale=2.5), attn=_GLM_ATTN),
    # DeepSeek-V3 / R1 (671B-A37B): 61 layers, the first 3 dense (FFN 18432), 256 experts of
    # width 2048, top-8 from the best 4 of 8 groups, one shared expert, scale 2.5; MLA with
    # 128 heads, q_lora 1536, kv_lora 512 + a 64-wide rope key (1,152 B of KV a token a layer).
    # Context as the config says (163840); strata runs its RoPE without the YaRN scaling.
    # DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json): 61 layers, first 3 dense (18432 wide),
    # D 7168, 128 heads of 192 (128 + 64 rope) / v 128, q_lora 1536, kv_lora 512, 256 experts
    # of 2048 top-8 + 1 shared, 8 groups top-4, routed scale 2.5, vocab 129280, rope 10000 with
    # YaRN factor 40 over 4096 (mscale = mscale_all_dim = 1: softmax scale x 1.369^2).
    # 671B weights (the MTP layer's 14B not run).
    "deepseek-v3": ModelShape("deepseek2", 61, 7168, 256, 8, 2048, 128, 128, 192, 129280,
                              rope_theta=10000.0, max_pos=163840, dense=DenseFfn(3, 18432, 1),
                              router=Router("sigmoid", 8, 4, 2.5), mla=Mla(1536, 512, 64, 128),
                              yarn=_ds_yarn(40.0, 4096, 32.0, 1.0)),
    # Kimi-K2 (moonshotai/Kimi-K2-Instruct config.json): DeepSeek-V3's layout with 384 experts,
    # 64 heads, first 1 layer dense, one group, routed scale 2.827, vocab 163840, rope 50000
    # with YaRN factor 32 over 4096 (betas 1 / 1, mscale = mscale_all_dim = 1). ~1.03T weights.
    "kimi-k2": ModelShape("deepseek2", 61, 7168, 384, 8, 2048, 64, 64, 192, 163840,
                          rope_theta=50000.0, max_pos=131072, dense=DenseFfn(1, 18432, 1),
                          router=Router("sigmoid", scale=2.827), mla=Mla(1536, 512, 64, 128),
                          yarn=_ds_yarn(32.0, 4096, 1.0, 1.0)),
    # GLM-4.5-Air (zai-org/GLM-4.5-Air config.json, transformers' Glm4MoeConfig): 46 layers, the
    # first dense (intermediate_size 10944), D 4096, 96 heads / 8 kv of 128, partial rotary 0.5
    # (64 dims), attention biases, no q/k norm, 128 experts of 1408 top-8 + 1 shared, sigmoid
    # router (n_group 1), routed scale 1.0, vocab 151552, rope 1e6, eps 1e-5, 131072 context.
    # 106B weights, 12B active (the MTP layer not run).
    "glm-4.5-air": ModelShape("glm4moe", 46, 4096, 128, 8, 1408, 96, 8, 128, 151552,
                              rms_eps=1e-5, max_pos=131072, dense=DenseFfn(1, 10944, 1),
                              router=Router("sigmoid"), attn=_GLM_ATTN),
    "tiny": _TINY_QWEN3MOE,
    # one tiny model per architecture (tests; llama.cpp reads their synth GGUFs: every matrix row
    # a whole number of 32-weight blocks, V = 256: 248 bytes and 8 merges)
    "tiny-qwen3moe": _TINY_QWEN3MOE,
    "tiny-mixtral": ModelShape("mixtral", 2, 64, 8, 2, 32, 4, 2, 16, 256, rope_theta=1e6,
                               rms_eps=1e-5, max_pos=512),
    "tiny-gpt-oss": ModelShape("gpt-oss", 2, 64, 4, 2, 32, 4, 2, 16, 256, rope_theta=150_000.0,
                               rms_eps=1e-5, max_pos=131072, opts=GptOssOptions(),
                               window=Window(4), yarn=_GPT_OSS_YARN),
    "tiny-deepseek2": ModelShape("deepseek2", 3, 64, 8, 2, 32, 4, 4, 40, 256, rope_theta=10000.0,
                                 max_pos=512, dense=DenseFfn(1, 96, 1),
                                 router=Router("sigmoid", 4, 2, 2.5), mla=Mla(32, 32, 8, 16)),
    "tiny-glm4moe": ModelShape("glm4moe", 3, 64, 8, 2, 32, 4, 2, 16, 256, rms_eps=1e-5,
                               max_pos=512, dense=DenseFfn(1, 96, 1),
                               router=Router("sigmoid", scale=2.5),
                               attn=Attn(qk_norm=False, bias=True, rope_dim=8)),
    # MiniMax-M2 (230B-A10B; MiniMaxAI/MiniMax-M2 config.json, transformers' MiniMaxM2Config
    # defaults): 62 layers, 256 experts of width 1536, top-8 by sigmoid scores steered by a
    # correction bias, no shared expert; GQA 48 / 8 heads of 128 with q/k norms over the whole
    # projection, RoPE on 64 of each head's 128 dims, theta 5e6; 196608 context.
    "minimax-m2": ModelShape("minimax-m2", 62, 3072, 256, 8, 1536, 48, 8, 128, 200064,
                             rope_theta=5_000_000.0, rms_eps=1e-6, max_pos=196608,
                             router=Router("sigmoid"), attn=Attn(rope_dim=64)),
    "tiny-minimax-m2": ModelShape("minimax-m2", 2, 64, 8, 2, 32, 4, 2, 16, 256,
                                  rope_theta=5_000_000.0, max_pos=4096, router=Router("sigmoid"),
                                  attn=Attn(rope_dim=8)),
    # Qwen3-Next-80B-A3B (Qwen/Qwen3-Next-80B-A3B-Instruct config.json; transformers'
    # Qwen3NextConfig defaults): 48 layers, 3 of every 4 Gated DeltaNet (16 key / 32 value heads
    # of 128, conv 4), the 4th gated attention 16 / 2 heads of 256 with RoPE on 64 dims (theta
    # 1e7); 512 experts of width 512, top-10, plus a shared expert of 512 behind a sigmoid gate.
    "qwen3-next-80b-a3b": ModelShape("qwen3next", 48, 2048, 512, 10, 512, 16, 2, 256, 151936,
                                     rope_theta=10_000_000.0, max_pos=262144,
                                     dense=DenseFfn(shared=1), attn=Attn(rope_dim=64),
                                     linear=LinearAttention(4, 16, 32, 128, 128)),
    # Qwen3.5-35B-A3B (Qwen/Qwen3.5-35B-A3B's text_config, transformers' Qwen3_5MoeTextConfig
    # defaults): 40 layers, the same 3-in-4 DeltaNet layout and attention, 256 experts of 512,
    # top-8, a shared expert of 512; vocab 248320.
    "qwen3.5-35b-a3b": ModelShape("qwen35moe", 40, 2048, 256, 8, 512, 16, 2, 256, 248320,
                                  rope_theta=10_000_000.0, max_pos=262144,
                                  dense=DenseFfn(shared=1), attn=Attn(rope_dim=64),
                                  linear=LinearAttention(4, 16, 32, 128, 128)),
    # Qwen3.5-397B-A17B from its model card's architecture table (its config.json was not at
    # hand): 60 layers, 15 x (3 DeltaNet + 1 gated attention), 512 experts of 1024, top-10 + a
    # shared expert (its width taken as the routed experts'), attention 32 / 2 heads of 256,
    # DeltaNet 16 key / 64 value heads of 128; theta and partial rotary as the 35B's. 396.3B
    # weights (the MTP layer not read), a token reads 16.3B beside its embedding row.
    "qwen3.5-397b-a17b": ModelShape("qwen35moe", 60, 4096, 512, 10, 1024, 32, 2, 256, 248320,
                                    rope_theta=10_000_000.0, max_pos=262144,
                                    dense=DenseFfn(shared=1), attn=Attn(rope_dim=64),
                                    linear=LinearAttention(4, 16, 64, 128, 128)),
    # the hybrids' tiny models: layers 0-2 linear, 3 full; 2 key / 4 value heads of 16
    "tiny-qwen3next": ModelShape("qwen3next", 4, 64, 8, 2, 32, 4, 2, 16, 256,
                                 rope_theta=10_000_000.0, max_pos=4096,
                                 dense=DenseFfn(shared=1), attn=Attn(rope_dim=4),
                                 linear=LinearAttention(4, 2, 4, 16, 16)),
    "tiny-qwen35moe": ModelShape("qwen35moe", 4, 64, 8, 2, 32, 4, 2, 16, 256,
                                 rope_theta=10_000_000.0, max_pos=4096,
                                 dense=DenseFfn(shared=1), attn=Attn(rope_dim=4),
                                 linear=LinearAttention(4, 2, 4, 16, 16)),
    "small": ModelShape("qwen3moe", 4, 256, 16, 4, 128, 4, 2, 64, 1024),
    # `strata demo`: enough experts (64 per layer) that a 16-slot ring is a small part of a layer.
    "demo": ModelShape("qwen3moe", 4, 256, 64, 4, 128, 4, 2, 64, 1024),
}


def get_preset(name: str) -> ModelShape:
    try:
        return PRESETS[name]
    except KeyError:
        raise StrataError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}") from None
