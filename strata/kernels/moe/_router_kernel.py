"""The @triton.jit kernel behind strata.kernels.moe.router (the launcher, tile and twin live there).

Legend: T tokens, D hidden, E experts (BE = next_pow2, masked), K top-k (KP = next_pow2),
P bf16 parts of the router weight; BM x BD a program's step.
"""
import triton
import triton.language as tl

from strata.kernels.moe._ffn_kernel import _dot


@triton.jit
def _opaque(x, INTERP: tl.constexpr):
    """x unchanged, but not a dot's result to the compiler: triton folds `acc + dot(a, b, 0)`
    into `dot(a, b, acc)`, which would put the running sum back into the tensor cores."""
    if not INTERP:
        x = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    return x


@triton.jit
def _softmax_topk_fwd_kernel(x_ptr, w_ptr, ids_ptr, wt_ptr, T, D, E, stride_xt, stride_wp,
                             stride_we, K: tl.constexpr, KP: tl.constexpr, P: tl.constexpr,
                             BM: tl.constexpr, BE: tl.constexpr, BD: tl.constexpr,
                             RENORM: tl.constexpr, INTERP: tl.constexpr,
                             LOGITS: tl.constexpr = False):
    """Rows pid*BM.. of ids [T, K] int64 and wt [T, K] fp32: logits = sum_p x @ w[p]^T (bf16
    products, exact in fp32, summed in fp32), softmax over E, the K largest (ties: the lower
    expert; NaN above every number, so ids stay in [0, E) whatever x holds), renormalized to
    sum 1 when RENORM. The probabilities are computed only at the K picks (exp(l - max) / sum,
    the softmax's own formula): one [BM, BE] block stays live.
    LOGITS: the logits themselves to wt_ptr as [T, E] fp32 instead (ids_ptr, K, RENORM unused):
    the GEMM of the routers that score otherwise (sigmoid, top-k then softmax)."""
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)                         # [BM]
    offs_e = tl.arange(0, BE)                                                 # [BE]
    m_mask = offs_m < T
    e_mask = offs_e < E
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xt                 # [BM, 1]
    w_rows = w_ptr + offs_e[:, None].to(tl.int64) * stride_we                 # [BE, 1]
    acc = tl.zeros((BM, BE), dtype=tl.float32)
    for d0 in range(0, D, BD):
        offs_d = d0 + tl.arange(0, BD)                                        # [BD]
        d_mask = offs_d < D
        xt = tl.load(x_rows + offs_d[None, :], mask=m_mask[:, None] & d_mask[None, :],
                     other=0.0)                                               # [BM, BD]
        step = tl.zeros((BM, BE), dtype=tl.float32)
        for p in tl.static_range(P):
            wt = tl.load(w_rows + p * stride_wp + offs_d[None, :],
                         mask=e_mask[:, None] & d_mask[None, :], other=0.0)   # [BE, BD]
            step = _dot(xt, wt, step, INTERP)                                 # [BM, BE] fp32
        # promoted: the tensor cores sum BD products (their accumulator rounds coarser than
        # fp32 FFMA: 1.9e-5 against 5e-6 on the weights at D 2048 on the H200), the running
        # sum over D is an fp32 add with round-to-nearest
        acc += _opaque(step, INTERP)
    if LOGITS:
        out = offs_m[:, None].to(tl.int64) * E + offs_e[None, :]              # [BM, BE]
        tl.store(wt_ptr + out, acc, mask=m_mask[:, None] & e_mask[None, :])
    else:
        _topk_epilogue(acc, ids_ptr, wt_ptr, offs_m, offs_e, m_mask, e_mask, K, KP, BM, BE,
                       RENORM)


@triton.jit
def _topk_epilogue(acc, ids_ptr, wt_ptr, offs_m, offs_e, m_mask, e_mask, K: tl.constexpr,
                   KP: tl.constexpr, BM: tl.constexpr, BE: tl.constexpr, RENORM: tl.constexpr):
    """The softmax -> top-k of a [BM, BE] block of logits, stored as ids / weights [T, K]."""
    logits = tl.where(e_mask[None, :], acc, float("-inf"))
    mx = tl.max(logits, axis=1)                                               # [BM]
    den = tl.sum(tl.exp(logits - mx[:, None]), axis=1)                        # [BM] (0 masked)
    kk = tl.arange(0, KP)                                                     # [KP]
    sel_w = tl.zeros((BM, KP), dtype=tl.float32)
    sel_i = tl.zeros((BM, KP), dtype=tl.int64)
    # the pick's key: a NaN logit (a NaN or inf in x) ranks above every number, as in
    # torch.topk, and a real one never as low as the -inf of the masked lanes and the picks, so
    # every pick is a real, unpicked expert: with NaN keys a row of NaN logits matches no lane
    # (NaN != NaN) and stores the sentinel BE, an id past the experts that the unchecked expert
    # FFN indexes with (a device assert on CUDA); its weights stay NaN, as the twin's
    cur = tl.where(acc != acc, float("inf"), tl.maximum(acc, -3.4028234663852886e38))
    cur = tl.where(e_mask[None, :], cur, float("-inf"))
    for k in tl.static_range(K):
        best = tl.max(cur, axis=1)                                            # [BM]
        idx = tl.min(tl.where(cur == best[:, None], offs_e[None, :], BE), axis=1)
        hit = offs_e[None, :] == idx[:, None]                                 # [BM, BE]
        pk = tl.exp(best - mx) / den                                          # softmax at idx
        sel_w = tl.where(kk[None, :] == k, pk[:, None], sel_w)
        sel_i = tl.where(kk[None, :] == k, idx[:, None].to(tl.int64), sel_i)
        cur = tl.where(hit, float("-inf"), cur)
    if RENORM:
        sel_w = sel_w / tl.sum(sel_w, axis=1)[:, None]
    out = offs_m[:, None].to(tl.int64) * K + kk[None, :]                      # [BM, KP]
    o_mask = m_mask[:, None] & (kk[None, :] < K)
    tl.store(ids_ptr + out, sel_i, mask=o_mask)
    tl.store(wt_ptr + out, sel_w, mask=o_mask)
