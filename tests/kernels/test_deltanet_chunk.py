"""The gated delta rule (strata.kernels.deltanet): the Triton chunked form, its torch twin, the
recurrent reference and fla-core's kernels as strata launches them (the "fla" backend,
strata.kernels.deltanet.fla_rule; in the interpreter here) against an fp64 evaluation of the
recurrence, against transformers 5.24's torch_chunk_gated_delta_rule, and carried across calls.

The bound, and why it holds. With k L2-normalised (|k| <= 1), 0 <= beta <= 1 and g <= 0, one
token's map S -> exp(g) (I - beta k k^T) S + beta k v^T has a linear part of spectral norm <= 1:
an error in S is never amplified by later tokens, so the state's error after t tokens is at
most the sum of the errors each token adds. Any of the three fp32 evaluations adds, per token,
the rounding of a few (c = 4) sequential stages of sums at most dk + BT terms long (a dk-term
dot with S, a BT-term one inside the chunk) whose products are each within 12 u of exact (the
Triton dots' tf32x3: three tf32 products per fp32 one), on values no larger than
|S_{t-1}|_F + beta |v_t|:
    E_t = c u (dk + BT + 12) sum_{s <= t} (|S_{s-1}|_F + beta_s |v_s|)       u = 2^-24
bounds |S_t - S_t^64|_F (so every element of the state), and o_t = S_t^T q_t adds one read of
S_t by q_t: |o_t - o_t^64| <= 2 |q_t| E_t. A bf16 output adds one bf16 step of the rounding
(the interpreter truncates). Two fp32 evaluations differ by at most the sum of their bounds.
fla's evaluation has the same stages (its triangular solve is a BT-term forward substitution in
place of strata's) and decays by exp2 of g log2(e), which moves a decay factor by at most
|g| log2(e) u relative: |g| stays under 60 here (the gates' A <= 16), within the slack of the
c (dk + BT + 12) u a token the bound allows. It is a worst case (every rounding aligned, the Frobenius norm for each element): measured
errors sit near 1e-4 of it (the prints of -s), so it does not tell tf32x3 from fp32 dots; an
algorithmic slip (a wrong decay, a missing head repeat, a chunk off by one) moves results by
O(0.1 to 1), far past it.

Carrying: a cut at a multiple of the chunk (64) runs the same programs / torch calls on the same
rows, so two calls carrying the state equal one call bit for bit (the twin and the recurrent
form on the CPU, the Triton path in the interpreter); a cut inside a chunk moves rounding only,
within the bound. Outputs start as NaN (tests/conftest.py), so an element never written fails.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

import pytest
import torch

from strata.errors import StrataError
from strata.kernels.deltanet import (chunk_gated_delta_rule, chunk_gated_delta_rule_torch,
                                     delta_gates, recurrent_gated_delta_rule)
from strata.kernels.deltanet.fla_rule import chunk_gated_delta_rule_fla, fla_kernels
from strata.kernels.deltanet.launch import DEFAULT, DeltaLaunch, delta_launch, pin_delta_launch
from tests.kernels.compiled import compile_lines

U32 = 2.0 ** -24
C_STAGES = 4
BT = 64
TF32X3 = 12      # u per product of tl.dot at input_precision tf32x3


@dataclass(frozen=True)
class Case:
    T: int
    Hk: int = 2
    Hv: int = 4
    dk: int = 32
    dv: int = 32

    @property
    def id(self) -> str:
        return f"T{self.T}-Hk{self.Hk}-Hv{self.Hv}-dk{self.dk}-dv{self.dv}"


CASES = [
    Case(1),                         # one token: the chunk is one row
    Case(63),                        # one short chunk
    Case(64),                        # exactly one chunk
    Case(65),                        # a chunk and one row
    Case(200),                       # four chunks, the last of 8 rows
    Case(65, Hk=1, Hv=3, dk=48, dv=24),   # masked head dims (BK 64, BV 32), GQA 3 to 1
    Case(70, Hk=4, Hv=4, dk=16, dv=80),   # no GQA, the smallest dk, dv over three blocks
]


def inputs(c: Case, seed: int, dtype=torch.float32, device="cpu"):
    """q, k, v, g, beta, h0 as the model makes them: g and beta from the gates with per-head A
    drawn as transformers initialises it (A in [0.01, 16]: weak to very strong decay)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(c.T, c.Hk, c.dk, generator=gen)
    k = torch.randn(c.T, c.Hk, c.dk, generator=gen)
    v = torch.randn(c.T, c.Hv, c.dv, generator=gen)
    a, b = torch.randn(c.T, c.Hv, generator=gen), torch.randn(c.T, c.Hv, generator=gen)
    A_log = torch.empty(c.Hv).uniform_(0.01, 16, generator=gen).log()
    g, beta = delta_gates(a, b, A_log, torch.ones(c.Hv))
    h0 = 0.5 * torch.randn(c.Hv, c.dk, c.dv, generator=gen)
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    return tuple(x.to(device) for x in (q, k, v, g, beta, h0))


def truth(q, k, v, g, beta, h0):
    """The recurrence in fp64 (with the L2 norm and the dk^-1/2 scale) and the bound pieces:
    -> o [T, Hv, dv], S [Hv, dk, dv], E [T, Hv] (E_t above), |q_t| [T, Hv]."""
    T, Hk, dk = q.shape
    Hv = v.shape[1]
    f = lambda x: x.detach().cpu().double()                                 # noqa: E731
    qd, kd, vd, gd, bd = (f(x) for x in (q, k, v, g, beta))
    qd = qd * torch.rsqrt((qd * qd).sum(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
    kd = kd * torch.rsqrt((kd * kd).sum(-1, keepdim=True) + 1e-6)
    qd, kd = (x.repeat_interleave(Hv // Hk, dim=1) for x in (qd, kd))      # [T, Hv, dk]
    S = f(h0).clone() if h0 is not None else torch.zeros(Hv, dk, v.shape[2], dtype=torch.double)
    o = torch.zeros(T, Hv, v.shape[2], dtype=torch.double)
    E = torch.zeros(T, Hv, dtype=torch.double)
    acc = torch.zeros(Hv, dtype=torch.double)
    for t in range(T):
        acc = acc + S.flatten(1).norm(dim=1) + bd[t] * vd[t].norm(dim=-1)
        S = S * gd[t].exp()[:, None, None]
        delta = (vd[t] - torch.einsum("hkv,hk->hv", S, kd[t])) * bd[t][:, None]
        S = S + kd[t][:, :, None] * delta[:, None, :]
        o[t] = torch.einsum("hkv,hk->hv", S, qd[t])
        E[t] = C_STAGES * U32 * (dk + BT + TF32X3) * acc
    return o, S, E, qd.norm(dim=-1)


def bf16_step(x):
    _, e = torch.frexp(x.abs())
    return torch.ldexp(torch.ones_like(x), e - 1 - 7)


def check(o, S, ref, what, scale=1.0):
    """o, S within `scale` x the bound of the fp64 truth `ref`; returns the max errors."""
    o64, S64, E, qn = ref
    ob = scale * 2 * qn[:, :, None] * E[:, :, None]                          # [T, Hv, 1]
    if o.dtype == torch.bfloat16:
        ob = ob + bf16_step(o64)
    do = (o.cpu().double() - o64).abs()
    dS = (S.cpu().double() - S64).abs()
    assert torch.isfinite(o).all() and torch.isfinite(S).all(), what
    assert (do <= ob).all(), f"{what}: o off by {do.max():.3g}, worst ratio {(do / ob).max():.3g}"
    sb = scale * E[-1] if len(E) else torch.zeros(S.shape[0], dtype=torch.double)
    assert (dS <= sb[:, None, None]).all(), f"{what}: S off by {dS.max():.3g}"
    return float(do.max()) if do.numel() else 0.0, float(dS.max())


def _fla_missing() -> str | None:
    try:
        fla_kernels()
    except StrataError as e:
        return str(e)
    return None


FLA_MISSING = _fla_missing()
IMPLS = {"triton": chunk_gated_delta_rule, "twin": chunk_gated_delta_rule_torch,
         "recurrent": recurrent_gated_delta_rule, "fla": chunk_gated_delta_rule_fla}
# dev.sh installs fla-core: a fresh clone runs its cases; elsewhere they skip, saying why
ALL_IMPLS = [pytest.param(n, marks=pytest.mark.skipif(n == "fla" and FLA_MISSING is not None,
                                                      reason=str(FLA_MISSING)))
             for n in IMPLS]


@pytest.mark.parametrize("impl", ALL_IMPLS)
@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_within_bound_of_fp64_truth(c, impl):
    q, k, v, g, beta, h0 = inputs(c, 1)
    o, S = IMPLS[impl](q, k, v, g, beta, h0, use_qk_l2norm=True)
    assert o.shape == v.shape and o.dtype == q.dtype and S.shape == h0.shape
    errs = check(o, S, truth(q, k, v, g, beta, h0), f"{impl} {c.id}")
    print(f"{impl} {c.id}: max |o - fp64| {errs[0]:.3g}, max |S - fp64| {errs[1]:.3g}")


@pytest.mark.parametrize("c", [Case(1), Case(65), Case(200)], ids=lambda c: c.id)
def test_zero_initial_state_and_given_scale(c):
    """No initial state starts from zeros; pre-normalised q, k and an explicit scale give what
    use_qk_l2norm and the default scale give."""
    q, k, v, g, beta, _ = inputs(c, 2)
    ref = truth(q, k, v, g, beta, None)
    qn = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    kn = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    o, S = chunk_gated_delta_rule(qn, kn, v, g, beta, None, scale=c.dk ** -0.5)
    check(o, S, ref, f"triton {c.id}")


@pytest.mark.parametrize("c", [Case(1), Case(63), Case(64), Case(65), Case(200),
                               Case(65, Hk=1, Hv=3, dk=48, dv=24)], ids=lambda c: c.id)
def test_matches_transformers_chunk(c):
    """Against transformers' own chunked evaluation ([B=1, T, H, d]): both lie within the bound
    of the fp64 truth, so they differ by at most twice it."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule
    q, k, v, g, beta, h0 = inputs(c, 3)
    ho, hS = torch_chunk_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None],
                                          initial_state=h0[None], output_final_state=True,
                                          use_qk_l2norm_in_kernel=True)
    ref = truth(q, k, v, g, beta, h0)
    check(ho[0], hS[0], ref, "transformers")
    hf = (ho[0].double(), hS[0].double(), ref[2], ref[3])
    for impl in ("triton", "twin") + (("fla",) if FLA_MISSING is None else ()):
        o, S = IMPLS[impl](q, k, v, g, beta, h0, use_qk_l2norm=True)
        errs = check(o, S, hf, f"{impl} vs transformers {c.id}", scale=2.0)
        print(f"{impl} vs transformers {c.id}: max |o| {errs[0]:.3g}, max |S| {errs[1]:.3g}")


def two_calls(fn, x, cut):
    q, k, v, g, beta, h0 = x
    a = fn(q[:cut], k[:cut], v[:cut], g[:cut], beta[:cut], h0, use_qk_l2norm=True)
    b = fn(q[cut:], k[cut:], v[cut:], g[cut:], beta[cut:], a[1], use_qk_l2norm=True)
    return torch.cat([a[0], b[0]]), b[1]


@functools.cache
def one_call(impl):
    """The 200-token prompt in one call: every cut compares with the same read (the Triton one
    costs the interpreter as much as the two calls do)."""
    x = inputs(Case(200), 4)
    return IMPLS[impl](*x[:5], x[5], use_qk_l2norm=True)


@pytest.mark.parametrize("impl", ALL_IMPLS)
@pytest.mark.parametrize("cut", [0, 64, 128, 200], ids=lambda n: f"cut{n}")
def test_carry_at_chunk_multiples_is_bit_exact(impl, cut):
    """A 200-token prompt as two calls cut at a multiple of the chunk (0 and 200: an empty call)
    equals one call bit for bit, state and output."""
    x = inputs(Case(200), 4)
    one = one_call(impl)
    o, S = two_calls(IMPLS[impl], x, cut)
    assert torch.equal(o, one[0]) and torch.equal(S, one[1])


@pytest.mark.parametrize("cut", [1, 63, 100, 199], ids=lambda n: f"cut{n}")
def test_recurrent_carry_is_bit_exact_anywhere(cut):
    x = inputs(Case(200), 5)
    one = recurrent_gated_delta_rule(*x[:5], x[5], use_qk_l2norm=True)
    o, S = two_calls(recurrent_gated_delta_rule, x, cut)
    assert torch.equal(o, one[0]) and torch.equal(S, one[1])


@pytest.mark.parametrize("impl", [i for i in ALL_IMPLS if i.values[0] != "recurrent"])
@pytest.mark.parametrize("cut", [1, 100], ids=lambda n: f"cut{n}")
def test_carry_inside_a_chunk_within_bound(impl, cut):
    """Cut inside a chunk, the chunks differ, so rounding moves: both the one call and the two
    stay within the bound of the truth."""
    x = inputs(Case(200), 6)
    o, S = two_calls(IMPLS[impl], x, cut)
    check(o, S, truth(*x), f"{impl} two calls cut {cut}")


def test_state_updated_in_place():
    """out_state = initial_state: the state buffer is read and rewritten by the same program."""
    q, k, v, g, beta, h0 = inputs(Case(130), 7)
    ref = chunk_gated_delta_rule(q, k, v, g, beta, h0, use_qk_l2norm=True)
    S = h0.clone()
    o, S2 = chunk_gated_delta_rule(q, k, v, g, beta, S, use_qk_l2norm=True, out_state=S)
    assert S2.data_ptr() == S.data_ptr()
    assert torch.equal(o, ref[0]) and torch.equal(S, ref[1])
    St = h0.clone()
    chunk_gated_delta_rule_torch(q, k, v, g, beta, St, use_qk_l2norm=True, out_state=St)
    assert torch.equal(St, chunk_gated_delta_rule_torch(q, k, v, g, beta, h0,
                                                         use_qk_l2norm=True)[1])


@pytest.mark.parametrize("impl", ALL_IMPLS)
@pytest.mark.parametrize("bad", ["hv-not-multiple", "state-bf16", "g-shape", "chunk-32"])
def test_bad_inputs_one_line(impl, bad):
    q, k, v, g, beta, h0 = inputs(Case(5), 8)
    kw = {}
    if bad == "hv-not-multiple":
        v = torch.randn(5, 3, 32)
    elif bad == "state-bf16":
        h0 = h0.bfloat16()
    elif bad == "g-shape":
        g = g[:, :2]
    else:
        kw["chunk_size"] = 32
    with pytest.raises(StrataError) as e:
        IMPLS[impl](q, k, v, g, beta, h0, **kw)
    assert "\n" not in str(e.value)


# -- the launch in force (strata.kernels.deltanet.launch) --------------------------------------
@pytest.mark.parametrize("c,dtype", [(Case(1), torch.float32), (Case(65), torch.float32),
                                     (Case(130, Hk=1, Hv=3, dk=48, dv=24), torch.float32),
                                     (Case(70), torch.bfloat16)],
                         ids=["T1", "T65", "T130-Hv3-dk48-dv24", "T70-bf16"])
def test_split_launch_equals_the_fused_one(c, dtype):
    """The split launch (the scan writes v_new and the inter-chunk part, a third kernel adds
    the intra-chunk part) forms the same products in the same order: o and S equal to the bit,
    also carried over a cut at a chunk multiple."""
    x = inputs(c, 11, dtype)
    o, S = chunk_gated_delta_rule(*x, use_qk_l2norm=True)
    with pin_delta_launch(split=True):
        o2, S2 = chunk_gated_delta_rule(*x, use_qk_l2norm=True)
        if c.T > BT:
            o3, S3 = two_calls(chunk_gated_delta_rule, x, BT)
            assert torch.equal(o3, o) and torch.equal(S3, S)
    assert torch.equal(o2, o) and torch.equal(S2, S)


def test_launch_spec_is_checked_and_parsed():
    assert DeltaLaunch.parse("split,prec=tf32,bv=64") == DeltaLaunch(split=True, prec="tf32",
                                                                     bv=64)
    assert delta_launch() == DEFAULT
    with pin_delta_launch(split=True):
        assert delta_launch().split and delta_launch().prec == DEFAULT.prec
    assert delta_launch() == DEFAULT
    for bad in (dict(bv=48), dict(prec="fp16"), dict(warps=3), dict(stages=0),
                dict(split="yes")):
        with pytest.raises(StrataError) as e:
            DeltaLaunch(**bad)
        assert "\n" not in str(e.value)
    for text in ("splat", "bv=wide"):
        with pytest.raises(StrataError):
            DeltaLaunch.parse(text)
    with pytest.raises(StrataError):
        pin_delta_launch(spilt=True)


# Qwen3.5's heads in bf16 only (the engine's dtype): fp32 at 128 x 128 took 254 s of compile
# on the H100 (fp32 dots that wide spill), and fp32 keeps its small cases
GPU_DELTA_CASES = [pytest.param(c, dt, id=f"{c.id}-{name}")
                   for c in (Case(1), Case(65), Case(200), Case(333, Hk=1, Hv=3, dk=48, dv=24))
                   for dt, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))] + [
    pytest.param(Case(400, Hk=16, Hv=32, dk=128, dv=128), torch.bfloat16,
                 id="T400-Hk16-Hv32-dk128-dv128-bf16"),
    # the tiny hybrids' heads (16 x 16 tiles): a scan whose inter-chunk dot came before q k^T
    # compiled to a kernel that faulted here (an illegal address, H100 and H200, 8 warps)
    pytest.param(Case(100, dk=16, dv=16), torch.bfloat16, id="T100-Hk2-Hv4-dk16-dv16-bf16")]


@pytest.mark.gpu
@pytest.mark.parametrize("c,dtype", GPU_DELTA_CASES)
def test_gpu_within_bound_and_carry(c, dtype):
    """The same bound on CUDA (Qwen3.5's 16 / 32 heads of 128 among the cases), and the carry
    at a chunk multiple: the same programs on the same rows, so equal to the bit there too.
    At Qwen3.5's heads the split launch too, within the same bound (compiled, its programs need
    not round as the fused ones do; one case: each launch is a compile at that width)."""
    x = inputs(c, 9, dtype, device="cuda")
    with pin_delta_launch(backend="strata"):      # auto hands bf16 to fla-core on CUDA
        o, S = chunk_gated_delta_rule(*x, use_qk_l2norm=True)
        o2, S2 = two_calls(chunk_gated_delta_rule, x, (c.T // 2) // BT * BT)
    ref = truth(*x)
    check(o, S, ref, f"cuda {c.id}")
    assert torch.equal(o2, o) and torch.equal(S2, S)
    if c.dk == 128:
        with pin_delta_launch(backend="strata", split=True):
            check(*chunk_gated_delta_rule(*x, use_qk_l2norm=True), ref, f"cuda split {c.id}")


def test_chunk_kernels_compile_for_h200():
    """Both chunk kernels compile for sm_90 with triton's passes and ptxas (no GPU) at Qwen3.5's
    heads, in a process without the interpreter, their dots on the tensor cores (wgmma)
    (compile_deltanet.py without --quick: the norms, other shapes, bf16 q/k, the footprints)."""
    lines, out = compile_lines("compile_deltanet.py", "--quick", timeout=900)
    assert len(lines) == 2, out
    for line in lines:
        assert "wgmma" in line, line


# -- the fla backend (strata.kernels.deltanet.fla_rule) -----------------------------------------
needs_fla = pytest.mark.skipif(FLA_MISSING is not None, reason=str(FLA_MISSING))


@needs_fla
def test_fla_backend_through_the_pinned_launch():
    """backend=fla pinned: chunk_gated_delta_rule is fla_rule's call, bit for bit, and the
    state may be updated in place (fla's scan writes its own ht, copied into out_state)."""
    x = inputs(Case(130, Hk=1, Hv=3, dk=48, dv=24), 12)
    o, S = chunk_gated_delta_rule_fla(*x, use_qk_l2norm=True)
    with pin_delta_launch(backend="fla"):
        o2, S2 = chunk_gated_delta_rule(*x, use_qk_l2norm=True)
        St = x[5].clone()
        o3, S3 = chunk_gated_delta_rule(*x[:5], St, use_qk_l2norm=True, out_state=St)
    assert torch.equal(o2, o) and torch.equal(S2, S)
    assert S3.data_ptr() == St.data_ptr() and torch.equal(o3, o) and torch.equal(St, S)
    # strata's own launch is another evaluation: both within the bound, not equal
    assert not torch.equal(chunk_gated_delta_rule(*x, use_qk_l2norm=True)[1], S)


@needs_fla
def test_fla_bf16_operands_in_the_interpreter():
    """bf16 q, k, v (the engine's dtype on the GPU): fla keeps A, w, u, h and v_new in bf16, so
    each stored operand moves by up to one bf16 step where strata's stay fp32. No bound of the
    fp32 kind holds through that (the drift is measured, experiments/deltanet_fla: 3.8e-3 of
    the state at Qwen3.5's heads on the H100); here: finite, o in bf16, and the carry at a
    chunk multiple still bit for bit (the same programs on the same rows)."""
    x = inputs(Case(130), 13, torch.bfloat16)
    o, S = chunk_gated_delta_rule_fla(*x, use_qk_l2norm=True)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    o2, S2 = two_calls(chunk_gated_delta_rule_fla, x, 64)
    assert torch.equal(o2, o) and torch.equal(S2, S)


def test_fla_missing_is_one_line(monkeypatch):
    """Where fla-core is absent (or another minor), the fla backend says so in one line."""
    import importlib.metadata as md
    fla_kernels.cache_clear()

    def missing(name):
        raise md.PackageNotFoundError(name)
    monkeypatch.setattr(md, "version", missing)
    try:
        with pytest.raises(StrataError) as e:
            chunk_gated_delta_rule_fla(*inputs(Case(5), 8), use_qk_l2norm=True)
        assert "\n" not in str(e.value) and "strata[fla]" in str(e.value)
        monkeypatch.setattr(md, "version", lambda name: "0.7.1")
        with pytest.raises(StrataError) as e:
            fla_kernels()
        assert "0.7.1" in str(e.value)
    finally:
        monkeypatch.undo()
        fla_kernels.cache_clear()


@needs_fla
def test_fla_autotuners_keep_their_choice_on_disk(monkeypatch):
    """On a GPU fla_kernels() has every autotuner of the five kernels keep its timings in
    Triton's cache (a fresh process's first prompt reads the choice rather than timing every
    config: the warm-up's one-time load); STRATA_TUNE_CACHE=0 leaves them timing anew."""
    from strata.config import tune_cache
    from strata.kernels.deltanet.fla_rule import _autotuners, _tuned_on_disk
    ks = fla_kernels()
    tuners = [n for k in ks.values() for n in _autotuners(k)]
    assert all(list(_autotuners(k)) for k in ks.values()), "each of the five is autotuned"
    held = [n.cache_results for n in tuners]
    try:
        for n in tuners:
            n.cache_results = False
        for k in ks.values():
            _tuned_on_disk(k)
        assert all(n.cache_results for n in tuners)
    finally:
        for n, c in zip(tuners, held):
            n.cache_results = c
    monkeypatch.delenv("STRATA_TUNE_CACHE", raising=False)
    assert tune_cache()
    monkeypatch.setenv("STRATA_TUNE_CACHE", "0")
    assert not tune_cache()


def test_delta_on_a_model_without_linear_layers_is_refused(tmp_path, capsys):
    """--delta is used or refused, never dropped: on a model with no Gated DeltaNet layers it
    is one line, exit 2, for the plan, a streamed read and a resident read alike; on a hybrid
    it passes."""
    from strata.cli import main
    from strata.packs.synth import ExpertFormats, synth_pack
    from strata.shapes import get_preset
    pack = synth_pack(tmp_path / "t.pack", get_preset("tiny"), ExpertFormats.of("Q8_0"),
                      progress=False)
    for argv in (["plan", "--preset", "qwen3-30b-a3b", "--quant", "Q8_0", "--vram", "12GiB",
                  "--prompt-tokens", "8192"],
                 ["prefill", str(pack), "--tokens", "1,2,3", "--vram", "1GiB",
                  "--cache", "200KiB"],
                 ["prefill", str(pack), "--tokens", "1,2,3"]):
        assert main(argv + ["--delta", "backend=strata"]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert "--delta does not apply" in err and "\n" not in err, err
    assert main(["plan", "--preset", "qwen3.5-35b-a3b", "--quant", "Q4_K", "--vram", "12GiB",
                 "--prompt-tokens", "8192", "--delta", "backend=strata"]) == 0
    capsys.readouterr()


def test_backend_is_a_launch_field():
    assert DeltaLaunch.parse("backend=fla") == DeltaLaunch(backend="fla")
    assert DEFAULT.backend == "auto"
    with pytest.raises(StrataError) as e:
        DeltaLaunch(backend="cuda")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("fla,cuda", [(True, True), (True, False), (False, True)],
                         ids=["fla-cuda", "fla-cpu", "nofla-cuda"])
def test_auto_resolves_to_fla_for_a_bf16_read_on_cuda_only(monkeypatch, fla, cuda):
    """auto: fla-core for 2-byte activations where it is installed and the process has CUDA;
    strata's fp32-exact scan for fp32 ones, on the CPU, or without fla-core. A pinned backend
    is itself whatever the dtype. The planner's count follows the same answer."""
    from strata.kernels.deltanet import launch as L
    from strata.planning import deltanet_buffers
    from strata.shapes import get_preset
    monkeypatch.setattr(L, "_fla_installed", lambda: fla)
    monkeypatch.setattr(L, "_has_cuda", lambda: cuda)
    want = "fla" if fla and cuda else "strata"
    assert DEFAULT.resolved(2) == want and DEFAULT.resolved(4) == "strata"
    assert DeltaLaunch(backend="strata").resolved(2) == "strata"
    assert DeltaLaunch(backend="fla").resolved(4) == "fla"
    assert DeltaLaunch(split=True).resolved(2) == DeltaLaunch(prec="tf32").resolved(2) == "strata"
    shape = get_preset("tiny-qwen35moe")
    names = {b.name for b in deltanet_buffers(shape, 64, act_itemsize=2)}
    assert ("v_new" in names) == (want == "fla"), names
    assert L.delta_spec(shape) == f"default: {want}"
    with pin_delta_launch(backend="strata"):
        assert L.delta_spec(shape) == "backend=strata"


def test_a_plan_resolves_auto_for_its_device_not_this_host(monkeypatch, capsys):
    """strata plan plans a GPU read from any host: auto resolves for the plan's device (fla-core
    for cuda where it is installed, even on a host without CUDA; strata's for --device cpu), and
    the process's own reads keep resolving for the process's devices."""
    import json
    from strata.cli import main
    from strata.kernels.deltanet import launch as L
    from strata.kernels.pins import planning_for
    monkeypatch.setattr(L, "_fla_installed", lambda: True)
    monkeypatch.setattr(L, "_has_cuda", lambda: False)
    assert DEFAULT.resolved(2) == "strata"                       # this host: no CUDA
    with planning_for("cuda"):
        assert DEFAULT.resolved(2) == "fla"
    with planning_for("cpu"):
        monkeypatch.setattr(L, "_has_cuda", lambda: True)
        assert DEFAULT.resolved(2) == "strata"
    monkeypatch.setattr(L, "_has_cuda", lambda: False)
    argv = ["plan", "--preset", "qwen3.5-35b-a3b", "--quant", "Q4_K", "--vram", "12GiB",
            "--prompt-tokens", "32768", "--json"]
    for extra, want in (([], "fla"), (["--device", "cpu"], "strata")):
        assert main(argv + extra) == 0
        assert json.loads(capsys.readouterr().out)["kv"]["delta_backend"] == want, extra
    assert DEFAULT.resolved(2) == "strata"                       # the pin is the plan's only


@contextlib.contextmanager
def fla_first_configs():
    """fla's autotuners hold their first config only (no timing on a shape's first call), and
    are given their lists back after: each autotuned shape costs the GPU suite ~35 s."""
    from triton.runtime.autotuner import Autotuner
    held = []
    for node in fla_kernels().values():
        while node is not None:
            if isinstance(node, Autotuner):
                held.append((node, node.configs))
                node.configs = node.configs[:1]
            node = getattr(node, "fn", None)
    try:
        yield
    finally:
        for node, configs in held:
            node.configs = configs


@pytest.mark.gpu
@needs_fla
@pytest.mark.parametrize("c,tuned", [(Case(200), False),
                                     (Case(400, Hk=16, Hv=32, dk=128, dv=128), True),
                                     (Case(100, dk=16, dv=16), False)],
                         ids=lambda p: p.id if isinstance(p, Case) else ("tuned" if p else "first"))
def test_gpu_fla_backend_carry_and_memory(c, tuned):
    """On CUDA, bf16: the carry at a chunk multiple equal to the bit (fla's autotune keys hold
    no T, so both calls run one config), and the call's peak allocation above its inputs is the
    output, the final state and exactly sizes.fla_buffers. Counted in bytes requested: the caching
    allocator hands a reused block whole when less than 1 MiB of it would be left over, so its
    allocated bytes overstate a call's own (832 KiB at T 400 on the H100). Qwen3.5's heads
    autotune as a read does (`tuned`); the others keep fla's first configs."""
    from strata.kernels.deltanet.sizes import chunk_scratch_bytes
    x = inputs(c, 14, torch.bfloat16, device="cuda")
    want = (chunk_scratch_bytes(c.T, c.Hk, c.Hv, c.dk, c.dv, qk_l2norm=True, backend="fla",
                                itemsize=2) + c.T * c.Hv * c.dv * 2 + c.Hv * c.dk * c.dv * 4)
    peaks = []
    with contextlib.nullcontext() if tuned else fla_first_configs():
        for _ in range(2):      # the first call of a tuned shape autotunes (fla's configs, timed)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_stats()["requested_bytes.all.current"]
            o, S = chunk_gated_delta_rule_fla(*x, use_qk_l2norm=True)
            torch.cuda.synchronize()
            peaks.append(torch.cuda.memory_stats()["requested_bytes.all.peak"] - base)
            del o, S
    # a timed first call may add Triton's do_bench L2-flush buffer (256 MiB, its nvidia driver's
    # get_empty_cache_for_benchmark), outside the plan, inside the budget's 1 GiB reserve
    flush = 256 * 2**20 if tuned else 0
    assert want <= peaks[0] <= want + flush + 512 * 12, peaks
    assert want <= peaks[1] <= want + 512 * 12, peaks
    o, S = chunk_gated_delta_rule_fla(*x, use_qk_l2norm=True)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    o2, S2 = two_calls(chunk_gated_delta_rule_fla, x, (c.T // 2) // BT * BT)
    assert torch.equal(o2, o) and torch.equal(S2, S)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_layout_names_and_sizes_one_backend_whatever_the_dense_dtype(monkeypatch, dtype):
    """With fla-core installed on CUDA, auto hands a bf16 read to fla and an fp32 read to
    strata: the layout's dn_* buffers (their names) and dims_for's DN_* symbols (their sizes)
    both follow the engine's dense dtype, so an fp32 read under int8 KV carves strata's
    buffers (the KV's dtype alone would have named fla's)."""
    from strata.kernels.deltanet import launch as L
    from strata.planning import KVPolicy, dims_for, layout_spec, model_sizes
    from strata.shapes import get_preset
    monkeypatch.setattr(L, "_fla_installed", lambda: True)
    monkeypatch.setattr(L, "_has_cuda", lambda: True)
    shape = get_preset("tiny-qwen35moe")
    kv = KVPolicy("int8", None, 256)
    names = {n[3:] for n in layout_spec(kv=kv, shape=shape, act=dtype).names()
             if n.startswith("dn_")}
    dims = model_sizes(shape, kv=kv, act=dtype).dims(64, 2, 1)
    assert names == {k[3:] for k in dims if k.startswith("DN_")}
    assert ("v_new" in names) == (dtype == torch.bfloat16)
