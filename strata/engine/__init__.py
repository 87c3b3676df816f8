"""The streaming prefill engine: expert cache + loan + ring, copies overlapped with compute.

    engine_config.py  EngineConfig and what it resolves to (dense dtype, KV dtype, RingPolicy)
    prompt_plan.py    plan_inputs / plan_prompt: a prompt's plan from the config
    host.py           HostExperts: every expert blob in host memory, pinned when possible
    device.py         Lane: the compute/copy streams and events of one device (no-ops on the CPU)
    provider.py       StreamingProvider: a layer's experts from cache slots and ring slots
    session.py        PromptSession: borrow and carve, the KV, the slab, the provider; refill
    prompt_kv.py      which KV a prompt keeps (the engine's PromptKV or the model's cache)
    prefill.py        PrefillEngine: plan, read the prompt chunk by chunk in a PromptSession
    warm.py           the warm-up's dry pass (a layer subset, WarmKV's attention probes)
    distributed.py    StageEngine: one rank of the layer split; handoff.py its wire
    stats.py          PrefillStats: what a prompt cost (bytes streamed, H2D rate, waits, hits)
"""
