"""Models: the wirings' forwards over chunks, their shared layers, expert providers.

    layers.py     RMSNorm, RoPE (shared by every wiring)
    kv.py         KVCache, PromptKV: keys/values of the tokens read so far, per layer (a
                  sliding layer only its window's); layer_kv_tokens: the one per-layer count
    attention.py  causal GQA attention of a chunk against the cache (optional q/k norms)
    moe.py        the expert FFNs (Triton kernel, decoded, torch twin, fp32 reference)
    moe_block.py  a layer's MoE block: router, then the FFN over each pass the provider yields
    provider.py   the expert provider protocol (passes, their workspace) and ResidentProvider
    observe.py    observers of a forward (routing, residual) and RouteRecorder
    decoder.py    the chunk loop every wiring shares
    moe_decoder.py  MoeDecoder, the base every wiring composes: embeddings, the layer loop,
                  the cache, the head; GqaLayer, the GQA layer's weights
    qwen3moe.py   Qwen3-MoE: the base's defaults
    mixtral.py    Mixtral: GQA layers without q/k norms
    gpt_oss.py    GPT-OSS: biased router, attention biases + sinks + sliding layers, YaRN
    minimax_m2.py MiniMax-M2: whole-projection q/k norms, partial RoPE, the sigmoid router
                  with a correction bias over Mixtral-style experts
    qwen3_next.py Qwen3-Next and Qwen3.5-MoE: Gated DeltaNet linear layers (their recurrent
                  state: layer_state.py) beside gated attention, a sigmoid-gated shared expert
    family.py     the DeepSeek / GLM-4.5 layer body: leading dense layers, shared experts
                  (ffn.py), grouped sigmoid routing (routers.py); glm4moe.py (GQA with bias,
                  partial RoPE) and deepseek.py (MLA attention, mla.py) wire it
                  (adding an architecture: docs/architectures.md; each wiring is named by
                  its architecture's record, strata.archs, which models never import)
"""
from strata.models.provider import ExpertProvider, LayerWorkspace, Pass, ResidentProvider

__all__ = ["ExpertProvider", "LayerWorkspace", "Pass", "ResidentProvider"]
