"""The engine's observer hook (strata.engine.observe) and the explicit slab switch
(EngineConfig.slab): what experiments use instead of patching classes or setting env knobs."""
import pytest
import torch

from strata.engine.observe import EngineObserver
from strata.errors import AllocationError
from strata.kernels.moe.tiles import pin_tile
from tests.engine.slab_helpers import CHUNK, STREAM_K, TOKENS, make_pack, tiny_engine


class Log(EngineObserver):
    def __init__(self):
        self.events = []

    def on_plan(self, plan, chunk, ring):
        self.events.append(("plan", plan, chunk, ring))

    def on_loan(self, part, need, loan):
        self.events.append(("loan", part, need, loan.n_slots))

    def on_result(self, result):
        self.events.append(("result", result))


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_pack(tmp_path_factory.mktemp("observe") / "t.pack")


@pytest.mark.parametrize("n_parts", [1, 2])
def test_observer_sees_the_plan_each_loan_and_the_result(pack, n_parts):
    eng = tiny_engine(pack, n_parts=n_parts, kernel=False)
    log = Log()
    eng.observers.append(log)
    res = eng.run(TOKENS, logits="last")
    kinds = [e[0] for e in log.events]
    assert kinds == ["plan"] + ["loan"] * n_parts + ["result"]
    _, plan, chunk, ring = log.events[0]
    assert (plan, chunk, ring) == (res.plan, res.chunk, res.ring)
    loans = log.events[1:-1]
    assert [e[1] for e in loans] == eng.parts
    for _, part, need, n_slots in loans:
        # the loan lent exactly the slots the bytes the layout needs take from this cache
        assert need > 0 and n_slots == part.cache.layout.slots_for(need, eng.cfg.lend_cap)
    assert log.events[-1][1] is res


def test_an_observer_changes_nothing(pack):
    eng = tiny_engine(pack, kernel=False)
    before = eng.run(TOKENS, logits="all").logits
    eng.observers.append(Log())
    after = eng.run(TOKENS, logits="all").logits
    assert torch.equal(before, after)


def test_a_failed_prompt_reports_its_loans_but_no_result(pack):
    eng = tiny_engine(pack, kernel=False)
    log = Log()
    eng.observers.append(log)
    with pytest.raises(AllocationError):
        eng.run(TOKENS, fail_after_layers=1)
    assert [e[0] for e in log.events] == ["plan", "loan"]


@pytest.mark.parametrize("env,slab", [("0", True), ("1", False)])
def test_config_slab_wins_over_the_knob(pack, monkeypatch, env, slab):
    """EngineConfig.slab, when set, decides; STRATA_MMQ_SLAB only fills in when it is None.
    One chunk: its first stream-k launch already asks the slab or the ordinary pool."""
    monkeypatch.setenv("STRATA_MMQ_SLAB", env)
    eng = tiny_engine(pack)
    eng.cfg.slab = slab
    with pin_tile(**STREAM_K):
        eng.run(TOKENS[:CHUNK], logits="none")
    st = eng.parts[0].scratch.stats()
    assert (st["slab_high_water"] > 0) is slab
    assert (st["ordinary_new_buffers"] > 0) is not slab
