"""The fused softmax -> top-k router (strata.kernels.moe.router) against an fp64 truth and its twin.

The truth: logits in fp64 from the same bf16 x and the exact weight, softmax in fp64, top-k.
A row whose K-th and (K+1)-th logits lie closer than the fp32 sum's rounding could go either way
in any fp32 implementation, so ids are compared on the other rows ("decidable"), and a case must
keep nearly all of its rows decidable (a test that compares nothing cannot pass).
"""
from dataclasses import dataclass

import pytest
import torch

from strata.errors import StrataError
from strata.kernels.moe.router import (MAX_EXPERTS, RouterTile, bf16_parts, pin_router,
                                       route_logits, router_impl, router_logits,
                                       router_logits_torch, router_tile, softmax_topk_route,
                                       softmax_topk_route_torch)
from strata.models.moe_block import route
from tests.kernels.compiled import ROOT, compile_lines

# fp32 sums of D bf16 products of unit scale: |error| stays far below this; gaps under it are ties
TIE_GAP = 1e-4
# weights: fp32 softmax against fp64, a few ulps of the exp, the sum and the renormalization
WEIGHT_REL = 1e-5


@dataclass(frozen=True)
class Case:
    T: int
    D: int
    E: int
    K: int
    wdtype: torch.dtype
    why: str

    @property
    def id(self):
        return f"T{self.T}-D{self.D}-E{self.E}-K{self.K}-{str(self.wdtype)[6:]}"


CASES = [
    Case(1, 64, 8, 2, torch.bfloat16, "one token: a block of BM rows mostly masked"),
    Case(77, 96, 60, 4, torch.float32, "E not a power of two, D not a multiple of the step, "
         "an fp32 weight in three bf16 parts"),
    Case(130, 128, 128, 8, torch.bfloat16, "qwen3's E and K, rows over two blocks"),
    Case(33, 64, 512, 8, torch.float16, "seed-512e's E (the widest block), fp16 in two parts"),
    Case(20, 64, 8, 8, torch.bfloat16, "K = E: every expert, in order"),
    Case(19, 64, 17, 1, torch.bfloat16, "K = 1, prime E"),
]


def truth(x, w, k, renormalize):
    """fp64 ids, weights and the per-row gap between the K-th and the next logit."""
    logits = x.double() @ w.double().t()                                     # [T, E]
    p = torch.softmax(logits, -1)
    top = logits.topk(min(k + 1, w.shape[0]), -1).values
    gap = (top[:, k - 1] - top[:, k]) if k < w.shape[0] else torch.full_like(top[:, 0], 1e9)
    wt, ids = p.topk(k, -1)
    if renormalize:
        wt = wt / wt.sum(-1, keepdim=True)
    return ids, wt, gap


def inputs(c: Case, seed: int, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(c.T, c.D, generator=g).to(torch.bfloat16)
    w = (torch.randn(c.E, c.D, generator=g) * 2 / c.D ** 0.5).to(c.wdtype)
    return x.to(device), w.to(device)


def check_against_truth(ids, wt, x, w, k, renormalize, weight_rel=WEIGHT_REL) -> float:
    """Asserts ids (decidable rows) and weights against the fp64 truth; returns the weights'
    largest relative error."""
    tid, twt, gap = truth(x.cpu(), w.cpu(), k, renormalize)
    ok = gap > TIE_GAP                                                       # [T] decidable
    assert ok.float().mean() >= 0.9, "too few decidable rows: the case compares nothing"
    ids, wt = ids.cpu(), wt.cpu()
    assert ids.dtype == torch.int64 and wt.dtype == torch.float32
    assert torch.equal(ids[ok], tid[ok])
    assert not wt.isnan().any()
    rel = ((wt[ok].double() - twt[ok]).abs() / twt[ok].abs().clamp_min(1e-30)).max().item()
    assert rel < weight_rel, f"weights off by {rel:.2e} relative"
    return rel


@pytest.mark.parametrize("renormalize", [True, False], ids=["renorm", "raw"])
@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_kernel_matches_truth_and_twin(c, renormalize):
    for seed in (0, 1):    # fresh data each draw
        x, w = inputs(c, seed)
        ids, wt = softmax_topk_route(x, w, c.K, renormalize)
        check_against_truth(ids, wt, x, w, c.K, renormalize)
        tids, twt = softmax_topk_route_torch(x, w, c.K, renormalize)
        check_against_truth(tids, twt, x, w, c.K, renormalize)


def test_ties_pick_the_lower_expert():
    # two identical weight rows: equal logits in every token; the kernel names the lower first
    x = torch.randn(16, 64).to(torch.bfloat16)
    w = torch.randn(8, 64).to(torch.bfloat16)
    w[5] = w[2]
    ids, _ = softmax_topk_route(x, w, 8, False)
    pos = {e: (ids == e).nonzero()[:, 1] for e in (2, 5)}
    assert (pos[2] < pos[5]).all()


@pytest.mark.parametrize("E", [256, 60], ids=["E-pow2", "E-masked-lanes"])
def test_nan_and_inf_rows_still_pick_real_experts(E):
    """A NaN or inf in a token's x (a NaN logit row) must still route to K distinct experts in
    [0, E): the resident and streamed reads run the expert FFN unchecked, which indexes its
    tables with these ids (qwen3.5-35b-a3b's E = 256, a device assert on the H100). Its weights
    are NaN, as the twin's; the finite rows keep the twin's ids and weights."""
    K = 8
    x, w = inputs(Case(12, 64, E, K, torch.bfloat16, ""), seed=3)
    x[1] = float("nan")                  # every logit NaN
    x[4, 7] = float("inf")               # +-inf and NaN logits
    x[6, 2] = float("nan")               # one NaN entry: every logit NaN
    bad = torch.zeros(12, dtype=torch.bool)
    bad[[1, 4, 6]] = True
    ids, wt = softmax_topk_route(x, w, K, True)
    tids, twt = softmax_topk_route_torch(x, w, K, True)
    assert ((ids >= 0) & (ids < E)).all(), ids[bad]
    assert all(len(set(r)) == K for r in ids.tolist()), ids[bad]
    assert wt[bad].isnan().all() and twt[bad].isnan().all()
    assert torch.equal(ids[~bad], tids[~bad])
    assert torch.allclose(wt[~bad], twt[~bad], rtol=WEIGHT_REL, atol=0)


def test_empty_chunk():
    x = torch.zeros(0, 64, dtype=torch.bfloat16)
    ids, wt = softmax_topk_route(x, torch.randn(8, 64).to(torch.bfloat16), 2)
    assert ids.shape == (0, 2) and wt.shape == (0, 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_bf16_parts_sum_to_the_weight(dtype):
    # a wide spread of exponents: each part holds the next 8 mantissa bits
    w = (torch.randn(64, 96, dtype=torch.float64) * torch.logspace(-6, 3, 96)).to(dtype)
    parts = bf16_parts(w)
    assert parts.dtype == torch.bfloat16
    assert parts.shape[0] == {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}[dtype]
    assert torch.equal(parts.double().sum(0), w.double())


def test_bad_inputs_are_one_clear_error():
    x = torch.randn(4, 64).to(torch.bfloat16)
    w = torch.randn(8, 64).to(torch.bfloat16)
    for bad in (lambda: softmax_topk_route(x, w, 0), lambda: softmax_topk_route(x, w, 9),
                lambda: softmax_topk_route(x, w[:, :32], 2),
                lambda: softmax_topk_route(x.float(), w, 2),
                lambda: softmax_topk_route(x, torch.randn(MAX_EXPERTS + 1, 64).bfloat16(), 2),
                lambda: softmax_topk_route_torch(x, w, 9)):
        with pytest.raises(StrataError):
            bad()
    with pytest.raises(StrataError):
        RouterTile(block_m=8, block_d=64)
    with pytest.raises(StrataError):
        pin_router("cuda").__enter__()


def test_impl_choice_and_pins():
    x = torch.randn(4, 64).to(torch.bfloat16)
    w = torch.randn(8, 64).to(torch.bfloat16)
    assert router_impl(x, w) == ("triton" if x.is_cuda else "torch")   # CPU: the twin
    with pin_router("triton"):
        assert router_impl(x, w) == "triton"
        with pin_router("torch"):
            assert router_impl(x, w) == "torch"
        assert router_impl(x, w) == "triton"
    assert router_tile(128) == RouterTile(64, 64, 4, 4)
    assert router_tile(512) == RouterTile(32, 64, 8, 3)
    assert router_tile(512, parts=3) == RouterTile(32, 16, 8, 2)


@pytest.mark.parametrize("renormalize", [True, False])
def test_models_route_through_the_pinned_impl(renormalize):
    # moe_block.route is what Qwen3-MoE, Mixtral and the softmax family layers call
    x, w = inputs(CASES[2], seed=3)
    with pin_router("triton"):
        a = route(x, w, 8, renormalize)
    with pin_router("torch"):
        b = route(x, w, 8, renormalize)
    check_against_truth(*a, x, w, 8, renormalize)
    check_against_truth(*b, x, w, 8, renormalize)


def logit_bound(x, w):
    """The a-priori bound of any fp32 sum of the D exact products, |sum - exact| <= g D u
    sum_d |x_d w_d| (u = 2^-24; g = 2 allows the tensor cores' truncating adds), [T, E]."""
    D = x.shape[1]
    return 2 * D * 2.0 ** -24 * (x.double().abs() @ w.double().abs().t())


def check_logits(got, x, w) -> float:
    """Asserts logits [T, E] fp32 within logit_bound of the fp64 truth; returns the largest
    error as a fraction of the bound."""
    xc, wc = x.cpu(), w.cpu()
    exact = xc.double() @ wc.double().t()
    got = got.cpu()
    assert got.dtype == torch.float32 and got.shape == exact.shape and not got.isnan().any()
    frac = ((got.double() - exact).abs() / logit_bound(xc, wc).clamp_min(1e-300)).max().item()
    assert frac <= 1.0, f"logits {frac:.2f} of the fp32 summation bound off"
    return frac


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_logits_within_the_fp32_sum_bound(c):
    for seed in (0, 1):
        x, w = inputs(c, seed)
        check_logits(router_logits(x, w), x, w)
        check_logits(router_logits_torch(x, w), x, w)
    assert router_logits(x[:0], w).shape == (0, c.E)


def test_route_logits_takes_the_pinned_impl():
    x, w = inputs(CASES[1], seed=4)
    with pin_router("triton"):
        a = route_logits(x, w)
    with pin_router("torch"):
        b = route_logits(x, w)
    check_logits(a, x, w)
    assert torch.equal(b, x.float() @ w.float().t())


@pytest.mark.parametrize("renormalize", [True, False])
def test_sigmoid_and_gpt_oss_routers_through_the_kernel(renormalize):
    # DeepSeek / GLM's grouped sigmoid router and GPT-OSS's top-k-then-softmax score the
    # kernel's logits: the same picks as their fp32 GEMM on decidable rows
    from types import SimpleNamespace

    from strata.models.gpt_oss import topk_softmax
    from strata.models.routers import sigmoid_router
    from strata.shapes import Router
    x, w = inputs(Case(64, 128, 32, 4, torch.bfloat16, ""), seed=5)
    bias = torch.randn(32) * 0.1
    shape = SimpleNamespace(top_k=4, norm_topk_prob=renormalize,
                            router=Router("sigmoid", n_group=4, topk_group=2, scale=2.5))
    for make in (lambda: sigmoid_router(w, bias, shape), lambda: topk_softmax(w, bias, 4)):
        with pin_router("triton"):
            ids_k, wt_k = make()(x)
        with pin_router("torch"):
            ids_t, wt_t = make()(x)
        same = (ids_k == ids_t).all(1)
        assert same.float().mean() >= 0.9
        assert torch.allclose(wt_k[same], wt_t[same], rtol=WEIGHT_REL, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("E", [128, 256, 512], ids=["qwen3", "deepseek-v3", "seed-512e"])
def test_gpu_logits(E):
    x, w = inputs(Case(4096, 2048, E, 8, torch.bfloat16, ""), seed=9, device="cuda")
    got = check_logits(router_logits(x, w), x, w)
    twin = check_logits(router_logits_torch(x, w), x, w)
    print(f"E={E}: logits' error as a fraction of the fp32 sum bound: kernel {got:.3f}, "
          f"fp32 twin {twin:.3f}")


@pytest.mark.gpu
@pytest.mark.parametrize("E,K", [(128, 8), (512, 8)], ids=["qwen3", "seed-512e"])
def test_gpu_real_shapes(E, K):
    c = Case(4096, 2048, E, K, torch.bfloat16, "the real widths on the tensor cores")
    x, w = inputs(c, seed=7, device="cuda")
    ids, wt = softmax_topk_route(x, w, K, True)
    # at D = 2048 any fp32 sum of the logits is ~1e-5 off (the H200's cuBLAS fp32 GEMM too): the
    # kernel must be as close to the truth as the fp32 code it replaces (its twin, same device)
    twin = check_against_truth(*softmax_topk_route_torch(x, w, K, True), x, w, K, True,
                               weight_rel=1.0)
    got = check_against_truth(ids, wt, x, w, K, True, weight_rel=max(WEIGHT_REL, 2 * twin))
    print(f"E={E}: weights vs fp64, kernel {got:.2e}, fp32 twin {twin:.2e}")
    assert router_impl(x, w) == "triton"


def test_router_kernel_compiles_for_h200():
    """The kernel compiles for sm_90 (triton's passes and ptxas, no GPU) at qwen3-30b-a3b's and
    seed-512e's widths and router_tile's tiles, without register spills and with the sum over D
    promoted out of the tensor cores (compile_router.py without --quick: every variant)."""
    lines, out = compile_lines("compile_router.py", "--quick", timeout=600,
                               cwd=ROOT / "tests" / "kernels")
    assert len(lines) == 2, out
    for line in lines:
        assert "spill 0/0" in line and "promoted" in line, line
