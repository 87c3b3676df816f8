"""The decoded FFN's grouped backend (torch._grouped_mm over the decode buffer) == moe_ffn's
meaning, and its two small kernels == their torch twins.

Outputs and workspaces start NaN (tests/conftest.py poisons torch.empty; the workspaces here are
filled with NaN too), so a row read before it is written shows. Bounds: DECODED_REL against the
fp32 reference and against the Triton backend (tests/kernels/test_moe_decoded.py's; the grouped
GEMMs round g, u and the down rows to bf16 once more than the Triton kernel, well inside it).
Cases: all experts present (check True / False), a streamed pass's subset (ids -1, experts of
other passes at slot -1, the engine's workspace, combine defer/layer), out= accumulation into a
non-zero accumulator, a decoded expert with no rows (an empty group mid-buffer), T = 1, the
absent-expert error, a misaligned buffer (falls back, says why), no host reads with check=False,
and "auto"'s rule (grouped on its own buffers, the Triton GEMM on the engine's carve).
"""
import pytest
import torch

from strata.bench.expert_gemm import DECODED_REL, rel_err
from strata.engine.syncs import SyncGuard
from strata.errors import StrataError
from strata.kernels import moe_ffn_torch
from strata.kernels.moe import grouped as gm
from strata.kernels.moe.decoded import (bf16_layout, decode_experts, last_decoded_gemm,
                                        moe_ffn_decoded, pin_decoded_gemm)
from strata.kernels.moe.random_experts import random_expert_set
from strata.kernels.moe.tiles import plan_launch
from tests.kernels.compiled import compile_lines

E, D, F, K = 6, 64, 32, 2


@pytest.fixture(scope="module")
def experts():
    return random_expert_set(E, D, F, "Q8_0", "Q4_0", "BF16", seed=4)


def _inputs(T, seed=2, n_expert=E):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g).bfloat16()
    ids = torch.stack([torch.randperm(n_expert, generator=g)[:K] for _ in range(T)])
    w = torch.softmax(torch.randn(T, K, generator=g), -1)
    return x, ids, w


def _grouped(*args, **kw):
    with pin_decoded_gemm("grouped"):
        y = moe_ffn_decoded(*args, **kw)
    assert last_decoded_gemm().backend == "grouped", last_decoded_gemm()
    return y


def _triton(*args, **kw):
    with pin_decoded_gemm("triton"):
        y = moe_ffn_decoded(*args, **kw)
    assert last_decoded_gemm().backend == "triton"
    return y


def _nan(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype)


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("T", [1, 13])
def test_grouped_matches_reference_and_triton(experts, check, T):
    x, ids, w = _inputs(T)
    ref = moe_ffn_torch(x, ids, w, experts)
    y = _grouped(x, ids, w, experts, check=check)
    assert y.dtype == torch.bfloat16 and not y.isnan().any()
    assert rel_err(y, ref) < DECODED_REL
    assert rel_err(y, _triton(x, ids, w, experts, check=check)) < DECODED_REL


def _engine_ws(experts, T, n_slots):
    """The carve's buffers as the streaming engine lends them, NaN where nothing wrote."""
    bb = bf16_layout(experts.layout).size
    rows = plan_launch(T, K, E, D, F, decoded=False, device=torch.device("cpu")).h_rows
    wdec = torch.zeros(n_slots * bb, dtype=torch.uint8)
    wdec.view(torch.bfloat16).fill_(float("nan"))
    return {"wdec": wdec, "yk": _nan(T * K, D), "h": _nan(rows, F, dtype=torch.bfloat16)}


def test_streamed_passes_add_into_out_and_defer_to_the_layer(experts):
    """Passes over {0, 1, 2} and {3, 4, 5}: ids of the other pass -1 and its experts at slot -1
    (absent from the pass's set), check=False with the engine's workspace; with out= (pass
    combine) and with defer + layer (the rows meet in yk, summed once)."""
    T = 9
    x, ids, w = _inputs(T, seed=5)
    ref = moe_ffn_torch(x, ids, w, experts)
    out0 = torch.randn(T, D, generator=torch.Generator().manual_seed(1))
    acc, acc_layer, acc_own = out0.clone(), out0.clone(), out0.clone()
    ws = _engine_ws(experts, T, n_slots=4)   # room for more than a pass holds: an empty group
    for n, group in enumerate(([0, 1, 2], [3, 4, 5])):
        part = torch.where(torch.isin(ids, torch.tensor(group)), ids, -1)
        in_pass = torch.isin(torch.arange(E), torch.tensor(group))
        sub = type(experts)(experts.arena, torch.where(in_pass, experts.slot_offset, -1),
                            experts.layout)
        got = _grouped(x, part, w, sub, out=acc, workspace=ws, check=False)
        assert got is acc
        _grouped(x, part, w, sub, out=acc_layer, workspace=ws, check=False,
                 combine="layer" if n == 1 else "defer")
        _grouped(x, part, w, sub, out=acc_own, check=False)    # own buffers: no yk at all
    assert rel_err(acc - out0, ref) < DECODED_REL
    assert rel_err(acc_layer - out0, ref) < DECODED_REL
    assert torch.equal(acc_own, acc)          # the sum from yd is yk's sum, bit for bit
    # the Triton backend's passes on the same workspace agree
    tri = out0.clone()
    ws = _engine_ws(experts, T, n_slots=4)
    for group in ([0, 1, 2], [3, 4, 5]):
        part = torch.where(torch.isin(ids, torch.tensor(group)), ids, -1)
        _triton(x, part, w, experts, out=tri, workspace=ws, check=False)
    assert rel_err(acc - out0, tri - out0) < DECODED_REL


def test_a_decoded_expert_without_rows_is_an_empty_group(experts):
    """All six experts decoded, expert 2 and 4 routed to by nobody: groups 2 and 4 hold no rows
    between groups that do (grouped_ffn straight over decode_experts' buffer)."""
    T = 7
    x, ids, w = _inputs(T, seed=3, n_expert=4)
    ids = torch.tensor([0, 1, 3, 5])[ids]
    bb = bf16_layout(experts.layout).size
    buf = torch.zeros(E * bb, dtype=torch.uint8)
    buf.view(torch.bfloat16).fill_(float("nan"))
    dec = decode_experts(experts, torch.arange(E) * bb, buf)
    ref = moe_ffn_torch(x, ids, w, experts)
    for check in (True, False):
        y = gm.grouped_ffn(x, ids, w, dec, check=check)
        assert rel_err(y, ref) < DECODED_REL, check
    # no rows at all for this call's experts: y = 0, or out untouched
    none = torch.full_like(ids, -1)
    assert torch.equal(gm.grouped_ffn(x, none, w, dec), torch.zeros(T, D, dtype=torch.bfloat16))
    out = torch.ones(T, D)
    assert torch.equal(gm.grouped_ffn(x, none, w, dec, out=out, check=False), torch.ones(T, D))


def test_grouped_refuses_what_moe_ffn_refuses():
    experts = random_expert_set(4, D, F, "Q8_0", absent=(2,))
    x = torch.randn(3, D).bfloat16()
    w = torch.full((3, 2), 0.5)
    with pytest.raises(StrataError, match=r"experts \[2\] are routed to but not resident"):
        _grouped(x, torch.tensor([[0, 2], [1, 3], [0, 1]]), w, experts)
    with pytest.raises(StrataError, match="combine='defer'"):
        _grouped(x, torch.tensor([[0, 1], [1, 3], [0, 1]]), w, experts, combine="defer")
    with pytest.raises(StrataError, match="pin_decoded_gemm takes one of"):
        with pin_decoded_gemm("cutlass"):
            pass


def test_misaligned_buffer_falls_back_and_says_why(experts):
    x, ids, w = _inputs(5)
    bb = bf16_layout(experts.layout).size
    raw = torch.zeros(E * bb + 64, dtype=torch.uint8)
    ws = {"wdec": raw[8:8 + E * bb]}          # 8 bytes off a 16-byte boundary
    with pin_decoded_gemm("grouped"), pytest.warns(UserWarning, match="not 16-byte aligned"):
        y = moe_ffn_decoded(x, ids, w, experts, workspace=ws)
    assert last_decoded_gemm().backend == "triton"
    assert "16-byte" in last_decoded_gemm().reason
    assert rel_err(y, moe_ffn_torch(x, ids, w, experts)) < DECODED_REL


def test_check_false_reads_nothing_on_the_host(experts):
    T = 6
    x, ids, w = _inputs(T)
    part = torch.where(ids < 3, ids, -1)
    ws = _engine_ws(experts, T, n_slots=3)
    acc = torch.zeros(T, D)
    with pin_decoded_gemm("grouped"), SyncGuard() as g:
        moe_ffn_decoded(x, part, w, experts, out=acc, workspace=ws, check=False)
    assert last_decoded_gemm().backend == "grouped"
    assert not g.caught, g.report()


def test_auto_through_the_ffn_keeps_triton_on_the_engines_carve(experts, monkeypatch):
    """With grouped available, moe_ffn_decoded's "auto" runs it on its own buffers and the Triton
    GEMM on the carve's (workspace "yk"), whose plan does not count the grouped temporaries."""
    monkeypatch.setattr(gm, "GROUPED_MIN_ROWS", 1)
    monkeypatch.setattr(gm, "grouped_available", lambda x: True)
    T = 4
    x, ids, w = _inputs(T)
    ref = moe_ffn_torch(x, ids, w, experts)
    assert rel_err(moe_ffn_decoded(x, ids, w, experts), ref) < DECODED_REL
    assert last_decoded_gemm().backend == "grouped"
    ws = _engine_ws(experts, T, n_slots=E)
    acc = torch.zeros(T, D)
    moe_ffn_decoded(x, ids, w, experts, out=acc, workspace=ws, check=False)
    assert last_decoded_gemm().backend == "triton"
    assert rel_err(acc, ref) < DECODED_REL


def test_auto_takes_grouped_where_available_and_rows_suffice(monkeypatch):
    x = torch.zeros(1, D, dtype=torch.bfloat16)
    enough = torch.zeros(gm.GROUPED_MIN_ROWS * E // K, K, dtype=torch.int64)
    short = enough[:-1]
    assert gm.decoded_gemm(x, enough, E) == "triton"              # the CPU: no cutlass
    monkeypatch.setattr(gm, "grouped_available", lambda x: True)
    assert gm.decoded_gemm(x, enough, E) == "grouped"
    assert gm.decoded_gemm(x, short, E) == "triton"
    assert gm.decoded_gemm(x, enough, E, carved=True) == "triton"   # the engine's budget
    with pin_decoded_gemm("triton"):
        assert gm.decoded_gemm(x, enough, E) == "triton"
    with pin_decoded_gemm("grouped"):
        assert gm.decoded_gemm(x, short, E, carved=True) == "grouped"
        with pin_decoded_gemm("auto"):
            assert gm.decoded_gemm(x, short, E) == "triton"


@pytest.mark.parametrize("M,n_valid", [(37, 37), (37, 20), (5, 0)])
def test_silu_mul_and_scatter_rows_match_their_twins(M, n_valid):
    g = torch.Generator().manual_seed(M + n_valid)
    Fh, Dh, TK = 48, 40, 50
    gu = (3 * torch.randn(M, 2 * Fh, generator=g)).bfloat16()
    nv = torch.tensor([n_valid], dtype=torch.int32)
    h1 = gm.silu_mul(gu[:, :Fh], gu[:, Fh:], _nan(M + 3, Fh, dtype=torch.bfloat16), nv)
    h2 = gm.silu_mul_torch(gu[:, :Fh], gu[:, Fh:], _nan(M + 3, Fh, dtype=torch.bfloat16), nv)
    assert not h1[:n_valid].isnan().any() and h1[n_valid:].isnan().all()
    # the same fp32 formula rounded once: equal but where exp's last bit tips a rounding
    assert (h1.float() - h2.float())[:n_valid].abs().le(
        h2[:n_valid].float().abs() * 2 ** -7).all()                          # one bf16 step
    yd = torch.randn(M, Dh, generator=g).bfloat16()
    order = torch.randperm(TK, generator=g)[:M]
    tw = torch.rand(TK, generator=g)
    y1 = gm.scatter_rows(yd, order, tw, _nan(TK, Dh), nv)
    y2 = gm.scatter_rows_torch(yd, order, tw, _nan(TK, Dh), nv)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0, equal_nan=True)
    written = torch.zeros(TK, dtype=torch.bool)
    written[order[:n_valid]] = True
    assert not y1[written].isnan().any() and y1[~written].isnan().all()


@pytest.mark.parametrize("rows", ["all", "mask"])
@pytest.mark.parametrize("add", [False, True])
def test_combine_sorted_is_the_scatter_then_combine(rows, add):
    """The sum straight from the sorted rows == scatter_rows then combine_rows, bit for bit (and
    its twin too); a masked k's row (NaN here) is never read."""
    from strata.kernels.moe.combine import combine_rows
    g = torch.Generator().manual_seed(7)
    T, Kc, Dc = 11, 3, 40
    ids = torch.randint(0, 4, (T, Kc), generator=g)
    if rows == "mask":
        ids[torch.rand(T, Kc, generator=g) < 0.3] = -1
    live = (ids.reshape(-1) >= 0).int()
    order = torch.sort(1 - live, stable=True).indices                 # live assignments first
    inv = torch.empty_like(order)
    inv[order] = torch.arange(T * Kc)
    nv = live.sum().int().reshape(1)
    yd = torch.randn(T * Kc, Dc, generator=g).bfloat16()
    yd[nv:] = float("nan")
    tw = torch.rand(T * Kc, generator=g)
    base = torch.randn(T, Dc, generator=g)
    want = combine_rows(gm.scatter_rows(yd, order, tw, _nan(T * Kc, Dc), nv), T, Kc, Dc, ids,
                        base.clone() if add else None, rows)
    for fn in (gm.combine_sorted, gm.combine_sorted_torch):
        got = fn(yd, inv, tw, T, Kc, Dc, ids, base.clone() if add else None, rows)
        assert got.dtype == want.dtype and torch.equal(got, want), fn.__name__


def test_grouped_kernels_compile_for_h200():
    """silu_mul, scatter_rows and combine_sorted compile for sm_90 at their GPU tiles (triton's
    passes and ptxas, no GPU) in a process without the interpreter, without register spills."""
    lines, out = compile_lines("compile_grouped.py", timeout=600)
    assert len(lines) == 4, out
    for line in lines:
        assert "spill 0/0" in line, line


@pytest.mark.gpu
def test_grouped_equals_triton_on_cuda_and_never_syncs():
    """qwen3-30b-a3b's expert shape (128 experts, D 2048, F 768, K 8) in Q8_0 at T = 2048:
    grouped (cutlass) == triton == the reference; check=False with the engine's buffers runs
    under the device's sync check; "auto" picks grouped from GROUPED_MIN_ROWS rows an expert."""
    from strata.bench.expert_gemm import SHAPES, make_experts
    from strata.kernels import topk_route
    shape, dev = SHAPES["qwen3-30b-a3b"], torch.device("cuda")
    if torch.cuda.get_device_capability(dev) < (9, 0):
        pytest.skip("cutlass's grouped GEMM needs sm90+")
    ex = make_experts(shape, "Q8_0", dev, distinct=8)
    T, Kq, Eq = 2048, shape.top_k, shape.n_expert
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(T, shape.d_model, generator=gen).bfloat16().to(dev)
    ids, w = topk_route(torch.randn(T, Eq, generator=gen).to(dev), Kq)
    ref = moe_ffn_torch(x, ids, w, ex)
    y = _grouped(x, ids, w, ex)
    assert rel_err(y, ref) < DECODED_REL
    assert rel_err(y, _triton(x, ids, w, ex)) < DECODED_REL
    bb = bf16_layout(ex.layout).size
    ws = {"wdec": torch.empty(Eq * bb, dtype=torch.uint8, device=dev),
          "yk": torch.empty(T * Kq, shape.d_model, device=dev),
          "h": torch.empty(T * Kq, shape.d_expert, dtype=torch.bfloat16, device=dev)}
    acc = torch.zeros(T, shape.d_model, device=dev)
    _grouped(x, ids, w, ex, out=acc, workspace=ws, check=False)      # warm
    acc.zero_()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _grouped(x, ids, w, ex, out=acc, workspace=ws, check=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert rel_err(acc, ref) < DECODED_REL
    rows = T * Kq / Eq
    moe_ffn_decoded(x, ids, w, ex)
    assert last_decoded_gemm().backend == ("grouped" if rows >= gm.GROUPED_MIN_ROWS else "triton")
    x4 = x.repeat(4, 1)                                  # 8192 tokens: 512 rows an expert
    ids4, w4 = ids.repeat(4, 1), w.repeat(4, 1)
    y4 = moe_ffn_decoded(x4, ids4, w4, ex)
    assert last_decoded_gemm().backend == "grouped"
    assert rel_err(y4[:T], ref) < DECODED_REL
