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
import triton
import triton.language as tl

from strata.kernels.moe._ffn_kernel import _bf16


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
def _attend_tile(acc, m_i, l_i, q, k_base, v_base, ks_base, vs_base, n0, n_keys, stride_t,
                 stride_st, row_tok, qk_scale, HD: tl.constexpr, BN: tl.constexpr,
                 SCALED: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                 INTERP: tl.constexpr, kpos0=0, row_abs=0, window=0, WIN: tl.constexpr = False,
                 row_start=0, SEQ: tl.constexpr = False):
    """One [BM, BN] step of the online softmax over keys n0..n0+BN of one segment.
    MASK: keys past n_keys are cut (a segment's last tile); CAUSAL: key n is seen by rows whose
    token >= n (the chunk's diagonal tiles); WIN: key n (absolute kpos0 + n) is seen by rows
    at absolute row_abs only within the window; SEQ: key n is seen by rows whose sequence
    starts at or before it (row_start)."""
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
    if WIN:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)         # no key seen yet
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
    elif SEQ:   # (the same: a constexpr left at its default may be None, so no WIN | SEQ)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
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
def _attend_segment(acc, m_i, l_i, q, k_base, v_base, ks_base, vs_base, n_keys, stride_t,
                    stride_st, row_tok, qk_scale, HD: tl.constexpr, BN: tl.constexpr,
                    SCALED: tl.constexpr, INTERP: tl.constexpr, kpos0=0, row_abs=0, lo_abs=0,
                    window=0, WIN: tl.constexpr = False):
    """A prefix segment: every key is seen by every row; only its last tile is masked. WIN:
    tiles wholly before lo_abs - window + 1 (lo_abs: the block's first row) are skipped."""
    full = (n_keys // BN) * BN
    start = 0
    if WIN:
        start = (tl.maximum(lo_abs - window + 1 - kpos0, 0) // BN) * BN
    for n0 in range(start, full, BN):
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, k_base, v_base, ks_base, vs_base, n0,
                                     n_keys, stride_t, stride_st, row_tok, qk_scale, HD, BN,
                                     SCALED, False, False, INTERP, kpos0, row_abs, window, WIN)
    if full < n_keys:
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, k_base, v_base, ks_base, vs_base, full,
                                     n_keys, stride_t, stride_st, row_tok, qk_scale, HD, BN,
                                     SCALED, True, False, INTERP, kpos0, row_abs, window, WIN)
    return acc, m_i, l_i


@triton.jit
def _chunk_attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, T, stride_qt, stride_qh, stride_ot,
                           stride_oh, stride_ct, stride_ch,
                           ak_ptr, av_ptr, aks_ptr, avs_ptr, Pa, stride_at, stride_ah,
                           stride_ast, stride_ash,
                           bk_ptr, bv_ptr, bks_ptr, bvs_ptr, Pb, stride_bt, stride_bh,
                           stride_bst, stride_bsh, qk_scale, acc_ptr, ml_ptr, stride_ml,
                           G: tl.constexpr, HD: tl.constexpr, BM: tl.constexpr,
                           BN: tl.constexpr, A_SCALED: tl.constexpr, B_SCALED: tl.constexpr,
                           RESUME: tl.constexpr, FINISH: tl.constexpr, INTERP: tl.constexpr,
                           sinks_ptr=None, window=0, pos_a=0, pos_b=0, n_prefix=0,
                           WIN: tl.constexpr = False, SINKS: tl.constexpr = False,
                           starts_ptr=None, SEQ: tl.constexpr = False):
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
    if RESUME:
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
    acc, m_i, l_i = _attend_segment(acc, m_i, l_i, q, ak_ptr + hkv64 * stride_ah,
                                    av_ptr + hkv64 * stride_ah, aks_ptr + hkv64 * stride_ash,
                                    avs_ptr + hkv64 * stride_ash, Pa, stride_at, stride_ast,
                                    row_tok, qk_scale, HD, BN, A_SCALED, INTERP, pos_a,
                                    row_abs, lo_abs, window, WIN)
    acc, m_i, l_i = _attend_segment(acc, m_i, l_i, q, bk_ptr + hkv64 * stride_bh,
                                    bv_ptr + hkv64 * stride_bh, bks_ptr + hkv64 * stride_bsh,
                                    bvs_ptr + hkv64 * stride_bsh, Pb, stride_bt, stride_bst,
                                    row_tok, qk_scale, HD, BN, B_SCALED, INTERP, pos_b,
                                    row_abs, lo_abs, window, WIN)
    if FINISH:
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
        for n0 in range(c0, full, BN):
            acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, kc, vc, kc, vc, n0, T, stride_ct, 0,
                                         row_tok, qk_scale, HD, BN, False, False, False, INTERP,
                                         n_prefix, row_abs, window, WIN, row_start, SEQ)
        for n0 in range(c1, t_end, BN):
            acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, kc, vc, kc, vc, n0, T, stride_ct, 0,
                                         row_tok, qk_scale, HD, BN, False, True, True, INTERP,
                                         n_prefix, row_abs, window, WIN, row_start, SEQ)
        if SINKS:
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
