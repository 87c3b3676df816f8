"""moe_ffn_decoded (decode the pass's experts once, then the BF16 GEMM) == moe_ffn's meaning.

Cases: mixed formats (each matrix its own decoder), a pass with skipped ids (the engine's
batches), an absent routed expert (a clear error, as moe_ffn), a decode buffer too small.
"""
import pytest
import torch

from strata.errors import StrataError
from strata.kernels import moe_ffn, moe_ffn_torch
from strata.kernels.moe.decoded import bf16_layout, decode_experts, moe_ffn_decoded
from strata.kernels.moe.random_experts import random_expert_set
from strata.kernels.moe.ffn import dequantize_matrix

DECODED_REL = 1.5e-2   # the GEMM's bound for decoded formats (tests/kernels/test_moe_ffn.py)


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_decode_experts_is_exact():
    experts = random_expert_set(5, 64, 64, "Q8_0", up="Q4_0", down="Q2_0",
                                seed=1)
    bb = bf16_layout(experts.layout).size
    dst_slot = torch.tensor([0, -1, bb, -1, 2 * bb])
    buf = torch.full((3 * bb,), 255, dtype=torch.uint8)
    dec = decode_experts(experts, dst_slot, buf)
    for e in (0, 2, 4):
        for m in ("gate", "up", "down"):
            want = dequantize_matrix(experts, e, m).bfloat16().float()
            assert torch.equal(dequantize_matrix(dec, e, m), want), (e, m)


@pytest.mark.parametrize("fmt", [("Q8_0", "Q4_0", "BF16"), ("Q4_K", "IQ3_S", "Q6_K")],
                         ids=["legacy-mix", "kquant-mix"])
def test_decoded_matches_reference(fmt):
    g = torch.Generator().manual_seed(2)
    # D = F = 256: whole K-quant super-blocks. Three experts are enough for a pass over some of
    # them (one, then the other two); each expert costs the interpreter three decodes
    E, D, F, T, K = 3, 256, 256, 11, 2
    experts = random_expert_set(E, D, F, *fmt, seed=4)
    x = torch.randn(T, D, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.softmax(torch.randn(T, K, generator=g), -1)
    ref = moe_ffn_torch(x, ids, w, experts)
    assert rel(moe_ffn_decoded(x, ids, w, experts), ref) < DECODED_REL
    # a pass over some experts (ids of the others -1) adds into an fp32 accumulator
    acc = torch.zeros(T, D)
    for group in ([0], [1, 2]):
        part = torch.where(torch.isin(ids, torch.tensor(group)), ids, -1)
        moe_ffn_decoded(x, part, w, experts, out=acc)
    assert rel(acc, ref) < DECODED_REL


def test_decoded_absent_and_small_buffer_are_clear():
    experts = random_expert_set(4, 64, 32, "Q8_0", absent=(2,))
    x = torch.randn(3, 64).bfloat16()
    w = torch.full((3, 2), 0.5)
    with pytest.raises(StrataError, match=r"experts \[2\] are routed to but not resident"):
        moe_ffn_decoded(x, torch.tensor([[0, 2], [1, 3], [0, 1]]), w, experts)
    with pytest.raises(StrataError, match="workspace\\['wdec'\\]"):
        moe_ffn_decoded(x, torch.tensor([[0, 1], [1, 3], [0, 1]]), w, experts,
                        workspace={"wdec": torch.empty(10, dtype=torch.uint8)})
    # a buffer for one expert and a pass of three: never written past, refused by name
    one = torch.full((bf16_layout(experts.layout).size + 100,), 7, dtype=torch.uint8)
    with pytest.raises(StrataError, match="routed to but not resident"):
        moe_ffn_decoded(x, torch.tensor([[0, 1], [1, 3], [0, 1]]), w, experts,
                        workspace={"wdec": one[:-100]})
    assert torch.all(one[-100:] == 7)


def test_auto_runs_the_path_the_table_chooses(monkeypatch):
    """strata.models.moe's "auto" runs, pass by pass, the path the measured table chooses for
    its formats and rows per expert (a table made here: Q8_0's kernel wins below 64 rows)."""
    from strata.kernels.moe import choices
    from strata.kernels.moe import decoded as dec_mod
    from strata.kernels.moe import ffn as moe_mod
    from strata.models import moe as model_moe
    pts = [{"rows": r, "tflops": {"kernel": k, "decoded": d}}
           for r, k, d in ((16, 20.0, 5.0), (64, 40.0, 40.0), (256, 60.0, 200.0))]
    monkeypatch.setattr(choices, "table", lambda: choices.FfnTable({"GPU": {"Q8_0": pts}}, ()))
    monkeypatch.setattr(choices, "device_name", lambda i: "GPU")
    experts = random_expert_set(4, 64, 32, "Q8_0", "Q8_0", "Q8_0", seed=1)
    called = []
    monkeypatch.setattr(dec_mod, "moe_ffn_decoded", lambda *a, **k: called.append("decoded"))
    monkeypatch.setattr(moe_mod, "moe_ffn", lambda *a, **k: called.append("kernel"))
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    for rows in (8, 32, 128, 512):
        ids = torch.zeros(rows * experts.n_expert, 1, dtype=torch.int64)   # rows an expert
        model_moe._auto(x, ids, ids.float(), experts)
    assert called == ["kernel", "kernel", "decoded", "decoded"]

