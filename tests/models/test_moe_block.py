"""The MoE block: the router's ids go to the provider; each pass's FFN output sums as declared."""
import pytest
import torch

from strata.errors import StrataError
from strata.models import LayerWorkspace, Pass
from strata.engine.load import resident_provider
from strata.models.moe import moe_ffn_ref
from strata.models.moe_block import moe_block
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset

SHAPE = get_preset("tiny")     # D=64, E=8, K=2
T = 9


@pytest.fixture(scope="module")
def resident(tmp_path_factory):
    p = synth_pack(tmp_path_factory.mktemp("p") / "t.pack", SHAPE, ExpertFormats.of("Q8_0"),
                   progress=False)
    return resident_provider(p, "cpu")


def router(h):
    g = torch.Generator().manual_seed(3)
    ids = torch.stack([torch.randperm(SHAPE.n_expert, generator=g)[:SHAPE.top_k]
                       for _ in range(h.shape[0])])
    return ids, torch.rand(ids.shape, generator=g)


class Halves:
    """The resident layer served in two passes (experts < E/2, then the rest)."""

    def __init__(self, resident, ws: LayerWorkspace):
        self.res, self.ws = resident, ws

    def workspace(self, layer):
        return self.ws

    def passes(self, layer, topk_ids):
        full = self.res.sets[layer]
        half = SHAPE.n_expert // 2
        for lo, hi in ((0, half), (half, SHAPE.n_expert)):
            keep = (topk_ids >= lo) & (topk_ids < hi)
            offs = full.slot_offset.clone()
            offs[:lo], offs[hi:] = -1, -1
            yield Pass(type(full)(full.arena, offs, full.layout), torch.where(keep, topk_ids, -1))


def test_passes_sum_into_the_lent_accumulator(resident):
    h = torch.randn(T, SHAPE.d_model, generator=torch.Generator().manual_seed(0))
    whole = moe_block(h, 0, router, moe_ffn_ref, resident)
    acc = torch.full((T + 3, SHAPE.d_model), float("nan"))     # more rows than T, unzeroed
    y = moe_block(h, 0, router, moe_ffn_ref, Halves(resident, LayerWorkspace(accumulator=acc)))
    assert y.data_ptr() == acc.data_ptr() and y.shape == (T, SHAPE.d_model)
    assert float((y - whole).abs().max() / whole.abs().max()) < 1e-6


def test_one_pass_promised_several_given_is_an_error(resident):
    h = torch.randn(T, SHAPE.d_model)
    with pytest.raises(StrataError, match="one pass"):
        moe_block(h, 0, router, moe_ffn_ref, Halves(resident, LayerWorkspace(accumulate=False)))


def test_observer_sees_the_routing(resident):
    got = []

    class Obs:
        def routed(self, layer, ids, w):
            got.append((layer, ids))

    h = torch.randn(T, SHAPE.d_model)
    moe_block(h, 1, router, moe_ffn_ref, resident, Obs())
    assert got[0][0] == 1 and torch.equal(got[0][1], router(h)[0])
