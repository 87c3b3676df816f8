"""Model shapes and the presets people plan against.

Legend: L layers, D hidden, F expert width, E experts, K top-k, H query heads, Hkv kv heads,
hd head dim, V vocabulary.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from strata.errors import StrataError



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
    # Architecture options, each off by default (Qwen3-MoE needs none of them); what an
    # architecture's wiring and tensor-name map read (docs/architectures.md).
    expert_bias: bool = False   # experts carry gate/up/down biases (in the blob, fp32)
    expert_act: str = "silu"    # "silu": silu(g)·u; "swiglu_oai": GPT-OSS's clamped SwiGLU
    swiglu_alpha: float = 1.702  # swiglu_oai: g·sigmoid(alpha·g)·(u + 1), g <= limit, |u| <= limit
    swiglu_limit: float = 7.0
    sliding_window: int = 0     # > 0: sliding layers see only the last `sliding_window` keys
    sliding_pattern: int = 2    # layer l slides when l % sliding_pattern < sliding_pattern - 1
    rope_scaling: str = ""      # "" (plain RoPE) or "yarn"
    rope_factor: float = 1.0    # yarn: context scale factor
    rope_orig_ctx: int = 0      # yarn: the pretraining context
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_truncate: bool = True  # yarn: round the correction range to whole dims (HF's default)

    def with_(self, **kw) -> "ModelShape":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelShape":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    @property
    def expert_params(self) -> int:
        """Weights of one expert (gate + up + down)."""
        return 3 * self.d_model * self.d_expert

    def layer_window(self, layer: int) -> int:
        """Keys a query of `layer` sees at most (its window), 0 for full attention."""
        p = self.sliding_pattern
        if self.sliding_window > 0 and p > 0 and layer % p < p - 1:
            return self.sliding_window
        return 0

    @property
    def expert_act_spec(self):
        """The experts' activation as the blob layout records it (strata.blob.ExpertAct)."""
        from strata.blob import ExpertAct
        if self.expert_act == "silu":
            return ExpertAct()
        return ExpertAct(self.expert_act, self.swiglu_alpha, self.swiglu_limit)

    def kv_bytes(self, n_tokens: int, kv: str = "bf16") -> int:
        """One layer's KV cache for n_tokens in the KV dtype `kv` (bf16 | int8: codes and fp32
        scales per token per kv head): the attention format's own count (kv_token_bytes). The
        one count the rig's budgets charge (strata.planning hands it to memory)."""
        from strata.kernels.attention.kv_int8 import kv_token_bytes
        return n_tokens * kv_token_bytes(kv, self.n_kv_head, self.head_dim)


PRESETS: dict[str, ModelShape] = {
    # Qwen3-30B-A3B: 48 layers, 128 experts of width 768, top-8.
    # Context as the Instruct-2507 release ships it (config.json: max_position_embeddings 262144
    # with rope_theta 1e7, native, no YaRN): the checkpoint people read 200K-token documents with.
    "qwen3-30b-a3b": ModelShape("qwen3moe", 48, 2048, 128, 8, 768, 32, 4, 128, 151936,
                                rope_theta=10_000_000.0, max_pos=262144),
    # Qwen3-235B-A22B: 94 layers, 128 experts of width 1536, top-8.
    "qwen3-235b-a22b": ModelShape("qwen3moe", 94, 4096, 128, 8, 1536, 64, 4, 128, 151936),
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
                               expert_bias=True, expert_act="swiglu_oai", sliding_window=128,
                               rope_scaling="yarn", rope_factor=32.0, rope_orig_ctx=4096,
                               yarn_truncate=False),
    "gpt-oss-20b": ModelShape("gpt-oss", 24, 2880, 32, 4, 2880, 64, 8, 64, 201088,
                              rope_theta=150_000.0, rms_eps=1e-5, max_pos=131072,
                              expert_bias=True, expert_act="swiglu_oai", sliding_window=128,
                              rope_scaling="yarn", rope_factor=32.0, rope_orig_ctx=4096,
                              yarn_truncate=False),
    # Test and demo shapes: small enough for the Triton interpreter on two cores.
    "tiny": ModelShape("qwen3moe", 2, 64, 8, 2, 32, 4, 2, 16, 256),
    "small": ModelShape("qwen3moe", 4, 256, 16, 4, 128, 4, 2, 64, 1024),
    # `strata demo`: enough experts (64 per layer) that a 16-slot ring is a small part of a layer.
    "demo": ModelShape("qwen3moe", 4, 256, 64, 4, 128, 4, 2, 64, 1024),
}


def get_preset(name: str) -> ModelShape:
    try:
        return PRESETS[name]
    except KeyError:
        raise StrataError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}") from None
