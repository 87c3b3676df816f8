"""The chunked-prefill flash-attention kernel (forward). See strata.kernels.attention.chunk.

Legend: T chunk tokens, Pa / Pb prefix segment lengths, G query heads per kv head, hd head width,
BM rows (token·G + head) per program, BN keys per step. Scores live in the log2 domain
(qk_scale = sm_scale·log2 e, so exp2 gives the softmax's exp).

A SCALED segment holds int8 codes with per-token scales: as int8 (converted to bf16 per tile in
the kernel) or already expanded to bf16 (strata.kernels.attention.expand: exact, |code| <= 127);
the pointer's dtype picks which, and the scales go on the scores and probabilities either way.
RESUME / FINISH split one chunk's attention over several launches (a prefix longer than the
expansion scratch, strata.kernels.attention.scratch): RESUME starts from the online-softmax state
(acc, m, l) an earlier launch stored; without FINISH the launch stores that state and skips the
chunk's own keys; with FINISH it attends them and writes o. One launch is RESUME=False, FINISH=True.

Two optional pieces (constexprs, off by default: the plain kernel is unchanged), GPT-OSS's:
WIN   a sliding window: row at absolute position p sees key at absolute position j only when
      p - j < window (key tiles wholly before the block's window are never visited; a row's
      running max stays -inf until its first visible key, so exp2 is taken against 0 then);
SINKS a learned logit per query head joins each row's softmax denominator (not the output),
      once, in the FINISH launch.
SEQ   packed sequences (many independent ones back to back in the chunk, no prefix): starts[t]
      is the chunk index of token t's sequence's first token, and row t sees chunk key n only
      when n >= starts[t] (block-diagonal causal); key tiles wholly before the block's first
      row's sequence are never visited, and a row's running max stays -inf until its first
      visible key, as under WIN.
Absolute positions come from the launcher, so they hold in every launch of a split chunk:
segment a's keys start at pos_a, b's at pos_b, and the chunk's token t sits at n_prefix + t
(n_prefix: the whole prefix, all launches' segments together). One launch over (a, b):
pos_a = 0, pos_b = Pa, n_prefix = Pa + Pb.
"""
from typing import NamedTuple

import triton
import triton.language as tl

from strata.kernels.moe._ffn_kernel import _bf16


class AttnSpec(NamedTuple):
    """The kernel's compile-time choices, one constexpr argument `S` (the launcher builds it once
    a launch): G, the head width HD, the tile (BM, BN), whether each prefix segment is SCALED,
    RESUME / FINISH, the interpreter flag, and the optional pieces WIN / SINKS / SEQ."""
    G: int
    HD: int
    BM: int
    BN: int
    A_SCALED: bool
    B_SCALED: bool
    RESUME: bool
    FINISH: bool
    INTERP: bool
    WIN: bool = False
    SINKS: bool = False
    SEQ: bool = False


@triton.jit
def _mma(a, b, acc, INTERP: tl.constexpr):
    """acc + a @ b on bf16 (or int8) operands. The interpreter's tl.dot multiplies bf16 bit
    patterns, so there both go up to fp32 first (bf16 and int8 products are exact in fp32: the
    same math); on the GPU the dot runs on bf16 tensor cores."""
    if INTERP:
        acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    return acc


@triton.jit
def _attend_tile(acc, m_i, l_i, q, SEG, n0, ROWS, qk_scale, window, S: tl.constexpr,
                 SCALED: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                 SEQ: tl.constexpr):
    """One [BM, BN] step of the online softmax over keys n0..n0+BN of one segment. SEG: the
    segment as one kv head sees it (_head_segment); ROWS (row_tok, row_abs, row_start): the
    block's rows' chunk tokens, absolute positions and sequences' starts.
    MASK: keys past n_keys are cut (a segment's last tile); CAUSAL: key n is seen by rows whose
    token >= n (the chunk's diagonal tiles); S.WIN: key n (absolute kpos0 + n) is seen by rows
    at absolute row_abs only within the window; SEQ: key n is seen by rows whose sequence
    starts at or before it (row_start)."""
    k_base, v_base, ks_base, vs_base, n_keys, stride_t, stride_st, kpos0 = SEG
    row_tok, row_abs, row_start = ROWS
    HD: tl.constexpr = S.HD
    BN: tl.constexpr = S.BN
    INTERP: tl.constexpr = S.INTERP
    WIN: tl.constexpr = S.WIN
    offs_n = n0 + tl.arange(0, BN)                                   # [BN]
    offs_d = tl.arange(0, HD)                                        # [HD]
    kv_off = offs_n.to(tl.int64)[:, None] * stride_t + offs_d[None, :]   # [BN, HD]
    if MASK:
        live = offs_n < n_keys                                       # [BN]
        k = tl.load(k_base + kv_off, mask=live[:, None], other=0)    # [BN, HD]
    else:
        k = tl.load(k_base + kv_off)
    s = _mma(q, tl.trans(k), tl.zeros([q.shape[0], BN], tl.float32), INTERP)   # [BM, BN] fp32
    if SCALED:
        # q . (k_code * s) = s * (q . k_code): codes are exact in bf16, the scale goes on the scores
        if MASK:
            ks = tl.load(ks_base + offs_n.to(tl.int64) * stride_st, mask=live, other=0)
        else:
            ks = tl.load(ks_base + offs_n.to(tl.int64) * stride_st)
        s = s * (ks.to(tl.float32) * qk_scale)[None, :]
    else:
        s = s * qk_scale
    if MASK:
        s = tl.where(live[None, :], s, float("-inf"))
    if CAUSAL:
        s = tl.where(offs_n[None, :] <= row_tok[:, None], s, float("-inf"))
    if WIN:
        s = tl.where(row_abs[:, None] - (kpos0 + offs_n)[None, :] < window, s, float("-inf"))
    if SEQ:
        s = tl.where(offs_n[None, :] >= row_start[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))                            # [BM]
    if WIN or SEQ:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)         # no key seen yet
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
    else:
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])                              # [BM, BN] fp32
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if MASK:
        v = tl.load(v_base + kv_off, mask=live[:, None], other=0)    # [BN, HD]
    else:
        v = tl.load(v_base + kv_off)
    if SCALED:
        # sum_n p (v_code * s) = sum_n (p * s) v_code: the scale goes on the probabilities
        if MASK:
            vs = tl.load(vs_base + offs_n.to(tl.int64) * stride_st, mask=live, other=0)
        else:
            vs = tl.load(vs_base + offs_n.to(tl.int64) * stride_st)
        p = p * vs.to(tl.float32)[None, :]
    acc = _mma(_bf16(p, INTERP), v, acc, INTERP)                     # [BM, HD] fp32
    return acc, m_new, l_i


@triton.jit
def _attend_segment(acc, m_i, l_i, q, SEG, ROWS, lo_abs, qk_scale, window, S: tl.constexpr,
                    SCALED: tl.constexpr):
    """A prefix segment: every key is seen by every row; only its last tile is masked. S.WIN:
    tiles wholly before lo_abs - window + 1 (lo_abs: the block's first row) are skipped."""
    n_keys = SEG[4]
    kpos0 = SEG[7]
    BN: tl.constexpr = S.BN
    full = (n_keys // BN) * BN
    start = 0
    if S.WIN:
        start = (tl.maximum(lo_abs - window + 1 - kpos0, 0) // BN) * BN
    for n0 in range(start, full, BN):
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, SEG, n0, ROWS, qk_scale, window, S,
                                     SCALED, False, False, False)
    if full < n_keys:
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, SEG, full, ROWS, qk_scale, window, S,
                                     SCALED, True, False, False)
    return acc, m_i, l_i


@triton.jit
def _head_segment(SEG, hkv, kpos0):
    """A prefix segment's descriptor (k_ptr, v_ptr, ks_ptr, vs_ptr, n_keys, stride_t, stride_h,
    stride_st, stride_sh) as kv head hkv (int64) sees it: (k, v, ks, vs bases, n_keys, stride_t,
    stride_st, kpos0), kpos0 the absolute position of its first key."""
    k_ptr, v_ptr, ks_ptr, vs_ptr, n_keys, stride_t, stride_h, stride_st, stride_sh = SEG
    return (k_ptr + hkv * stride_h, v_ptr + hkv * stride_h, ks_ptr + hkv * stride_sh,
            vs_ptr + hkv * stride_sh, n_keys, stride_t, stride_st, kpos0)


@triton.jit
def _chunk_attn_fwd_kernel(CHUNK, A, B, qk_scale, STATE, EXTRA, S: tl.constexpr):
    """S: the AttnSpec. The launch data come as descriptors: CHUNK (q_ptr, k_ptr, v_ptr, o_ptr, T,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_ct, stride_ch): the chunk's queries, its
    own keys and values, the output, its tokens, and the (token, head) strides of q, o and k / v;
    A and B the prefix segments (k_ptr, v_ptr, ks_ptr, vs_ptr, n_keys, stride_t, stride_h,
    stride_st, stride_sh: codes or bf16 [P, Hkv, hd] and their scales [P, Hkv], a bf16 one's
    scale pointers never read); STATE (acc_ptr, ml_ptr, stride_ml): the carried softmax state;
    EXTRA (sinks_ptr, window, pos_a, pos_b, n_prefix, starts_ptr): the optional pieces' data,
    None / 0 where their constexpr is off. (The leaves stay in this order: LLVM orders commutative
    operands by argument position, so another order compiles to other code.)"""
    (q_ptr, k_ptr, v_ptr, o_ptr, T, stride_qt, stride_qh, stride_ot, stride_oh, stride_ct,
     stride_ch) = CHUNK
    acc_ptr, ml_ptr, stride_ml = STATE
    sinks_ptr, window, pos_a, pos_b, n_prefix, starts_ptr = EXTRA
    G: tl.constexpr = S.G
    HD: tl.constexpr = S.HD
    BM: tl.constexpr = S.BM
    BN: tl.constexpr = S.BN
    INTERP: tl.constexpr = S.INTERP
    WIN: tl.constexpr = S.WIN
    SEQ: tl.constexpr = S.SEQ
    # the last row blocks see the most chunk keys: start them first (shorter tail)
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    hkv = tl.program_id(1)
    rows = pid_m * BM + tl.arange(0, BM)                             # [BM] token·G + head
    row_tok = rows // G
    head = (hkv * G + rows % G).to(tl.int64)
    live = rows < T * G
    offs_d = tl.arange(0, HD)
    q_off = row_tok.to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_off, mask=live[:, None], other=0)          # [BM, HD] bf16

    # the carried state: acc [T, H, hd] fp32 contiguous, m and l [T, H] fp32 stride_ml apart
    n_head = tl.num_programs(1) * G
    ml_off = row_tok.to(tl.int64) * n_head + head                    # [BM]
    acc_off = ml_off[:, None] * HD + offs_d[None, :]                 # [BM, HD]
    if S.RESUME:
        acc = tl.load(acc_ptr + acc_off, mask=live[:, None], other=0)
        m_i = tl.load(ml_ptr + ml_off, mask=live, other=float("-inf"))
        l_i = tl.load(ml_ptr + stride_ml + ml_off, mask=live, other=0)
    else:
        acc = tl.zeros([BM, HD], dtype=tl.float32)
        m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BM], dtype=tl.float32)
    hkv64 = hkv.to(tl.int64)
    t_min = (pid_m * BM) // G
    row_abs = row_tok   # [BM] absolute positions (read only with WIN: n_prefix is set then)
    lo_abs = t_min
    if WIN:
        row_abs = n_prefix + row_tok
        lo_abs = n_prefix + t_min
    # prefix segment a (older, e.g. streamed from the host), then b (the resident window)
    rows_at = (row_tok, row_abs, row_tok)   # (a prefix segment's rows: no sequences' starts)
    acc, m_i, l_i = _attend_segment(acc, m_i, l_i, q, _head_segment(A, hkv64, pos_a), rows_at,
                                    lo_abs, qk_scale, window, S, S.A_SCALED)
    acc, m_i, l_i = _attend_segment(acc, m_i, l_i, q, _head_segment(B, hkv64, pos_b), rows_at,
                                    lo_abs, qk_scale, window, S, S.B_SCALED)
    if S.FINISH:
        # the chunk itself: tiles every row sees whole, then the diagonal ones (causal mask)
        t_end = tl.minimum((pid_m * BM + BM - 1) // G + 1, T)
        full = ((t_min + 1) // BN) * BN
        kc = k_ptr + hkv64 * stride_ch
        vc = v_ptr + hkv64 * stride_ch
        c0 = 0
        c1 = full
        if WIN:
            c0 = (tl.maximum(t_min - window + 1, 0) // BN) * BN
            c1 = tl.maximum(full, c0)
        row_start = row_tok
        if SEQ:
            # starts rise with t: no row of the block sees a key before its first row's start
            row_start = tl.load(starts_ptr + row_tok, mask=live, other=0)
            c0 = tl.maximum(c0, (tl.load(starts_ptr + t_min) // BN) * BN)
            c1 = tl.maximum(c1, c0)
        chunk = (kc, vc, kc, vc, T, stride_ct, 0, n_prefix)
        rows_at = (row_tok, row_abs, row_start)
        for n0 in range(c0, full, BN):
            acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, chunk, n0, rows_at, qk_scale, window,
                                         S, False, False, False, SEQ)
        for n0 in range(c1, t_end, BN):
            acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, chunk, n0, rows_at, qk_scale, window,
                                         S, False, True, True, SEQ)
        if S.SINKS:
            # the sink's exp joins the denominator: rescale to the max of (row max, sink)
            sk = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634   # log2 domain
            m_f = tl.maximum(m_i, sk)
            scale = tl.exp2(m_i - m_f)
            acc = acc * scale[:, None]
            l_i = l_i * scale + tl.exp2(sk - m_f)
        o = acc / l_i[:, None]
        o_off = (row_tok.to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh
                 + offs_d[None, :])
        if o_ptr.dtype.element_ty == tl.bfloat16:
            o = _bf16(o, INTERP)
        tl.store(o_ptr + o_off, o, mask=live[:, None])
    else:
        tl.store(acc_ptr + acc_off, acc, mask=live[:, None])
        tl.store(ml_ptr + ml_off, m_i, mask=live)
        tl.store(ml_ptr + stride_ml + ml_off, l_i, mask=live)
