"""The presets of the models people offload match their published parameter counts, the plan runs
for each under 24 GiB, and every architecture has its tiny preset."""
from __future__ import annotations

import math

import pytest

from strata.archs.registry import ARCHS
from strata.planning import model_sizes
from strata.shapes import PRESETS

# published total weights (model cards; the MTP / NextN layers, which strata does not run, left
# out), and the active weights per token where the card gives them
PUBLISHED = {
    "gpt-oss-120b": (116.83e9, 5.13e9),     # OpenAI's card: 116.8B total, 5.1B active
    "qwen3-235b-a22b": (235e9, 22e9),       # Qwen3-235B-A22B
    "glm-4.5-air": (106e9, 12e9),           # zai-org/GLM-4.5-Air: 106B total, 12B active
    "deepseek-v3": (671e9, 37e9),           # DeepSeek-V3: 671B (+14B MTP), 37B active
    "kimi-k2": (1.03e12, 32e9),             # Kimi-K2: 1.03T (HF's count), 32B active
}


def _counts(name: str) -> tuple[float, float]:
    """(total, active) weights of the preset: its dense tensors (read from the record, as the
    plan counts them) and its routed experts."""
    s = PRESETS[name]
    z = model_sizes(s)
    from strata.planning import DENSE_BYTES
    dense = (z.dense_first + z.dense_last + sum(z.dense_layers)) / DENSE_BYTES
    routed = len(s.moe_layers) * s.expert_params
    return dense + routed * s.n_expert, dense + routed * s.top_k


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_matches_published_total(name):
    total, _ = _counts(name)
    assert math.isclose(total, PUBLISHED[name][0], rel_tol=0.015), f"{total / 1e9:.1f}B"


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_active_weights_near_published(name):
    """Active weights (the embedding counted once, as the cards do not all say): within 10%."""
    s = PRESETS[name]
    _, active = _counts(name)
    active -= s.vocab * s.d_model          # one of the embedding / LM head
    assert math.isclose(active, PUBLISHED[name][1], rel_tol=0.1), f"{active / 1e9:.2f}B"


# DeepSeek-V3's and Kimi-K2's dense weights (bf16: ~34 GB, ~20 GB with the KV and scratch a
# chunk needs) pass 24 GiB with every layer: the plan takes the first layers that fit (--layers)
FIRST_LAYERS = {"deepseek-v3": 19, "kimi-k2": 19}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_plan_runs_under_24gib(name, capsys):
    from strata.cli import main
    layers = ["--layers", str(FIRST_LAYERS[name])] if name in FIRST_LAYERS else []
    assert main(["plan", "--preset", name, "--vram", "24GiB", *layers]) == 0
    assert "chunk" in capsys.readouterr().out
    if layers:   # every layer: refused in one line
        assert main(["plan", "--preset", name, "--vram", "24GiB"]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_every_architecture_has_its_tiny_preset():
    for a in ARCHS:
        s = PRESETS[f"tiny-{a.name}"]
        assert s.arch == a.name and f"tiny-{a.name}" in a.presets
    assert PRESETS["tiny-qwen3moe"] is PRESETS["tiny"]


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_a_131k_prompt_plans_under_24gib(name, capsys):
    """Issue 37 reads every one of these models at 131,072 tokens under 24 GiB: each preset's
    context admits it (the Qwen3 presets are the 2507 releases' 262,144; DeepSeek's and Kimi's
    first layers) and the plan fits, the KV spilled where it must."""
    from strata.cli import main
    layers = ["--layers", str(FIRST_LAYERS[name])] if name in FIRST_LAYERS else []
    assert main(["plan", "--preset", name, "--vram", "24GiB", "--prompt-tokens", "131072",
                 *layers]) == 0
    assert "131,072 tokens" in capsys.readouterr().out
