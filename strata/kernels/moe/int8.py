"""The MoE feed-forward on integer tensor cores: activations quantized to q8_1, weights as their
int8 codes, as llama.cpp's MMQ kernels compute a prefill.

Legend: T tokens, D hidden, F expert width, E experts, K top-k, B = n_in / 32 blocks a row.

    xq = q8_1(x)                                       (strata.kernels.moe.q8; per token)
    h[r] = act(gate_e . xq[tok(r)], up_e . xq[tok(r)])  fp32, rows r in expert order
    hq = q8_1(h)                                       (in the gate/up GEMM's epilogue)
    yk[t*K + k] = w[t, k] * down_e . hq[r(t, k)]        fp32
    y[t] = sum_k yk[t*K + k]                            (strata.kernels.moe.combine)

where a dot of a q8_1 row (qa int8, da, sa per block) and a weight row (int8 codes c, run scales
d and minimums m, strata.formats.split) is taken block by block in increasing k:

    acc += P_b * (da_b * d_b)  [+ sa_b * m_b]           P_b = sum_{k in b} qa[k] c[k]  (int32)

(runs of 16 weights: two such terms a block, the minimum's sum da_b * sum of the half's codes).
Every step is fp32 and unfused, so the Triton kernel and the torch twins give the same bits; the
one exception is act's exp (the GPU's ex2 and numpy's or torch's exp differ in the last place),
so `int8_gate_up` matches its twin to a few ulps of h and `int8_down` bit for bit;
`int8_gate_up_q8` (h quantized in the epilogue, never stored in fp32) gives the bits of
quantize_q8_1 on int8_gate_up's h.

Formats: INT8_FORMATS (the integer splits: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
Q6_K, IQ4_NL, IQ4_XS, MXFP4). D and F must be multiples of 32 (q8_1's block).

`moe_ffn_int8`, `int8_gate_up`, `int8_gate_up_q8` and `int8_down` are Triton launchers, each
with a plain-torch twin of one signature (`..._torch`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from strata._backend import INTERPRET
from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.formats.split import SPLITTERS, split_codes
from strata.kernels.decode import format_traits
from strata.kernels.decode._common import _minus_min
from strata.kernels.moe import _int8_kernel as _k
from strata.kernels.moe.combine import combine_rows_torch
from strata.kernels.moe.ffn import COMBINES, _check_inputs, _combine, _work, expert_biases
from strata.kernels.moe.grouping import group_blocked, group_blocked_bounded
from strata.kernels.moe.q8 import QK, Q8Rows, quantize_q8_1, quantize_q8_1_torch
from strata.kernels.moe.tiles import padded_rows

INT8_FORMATS = tuple(SPLITTERS)
KBS = (1, 2, 4, 8)   # q8_1 blocks a reduction step can cover (Int8Tile.kb)


@dataclass(frozen=True)
class Int8Tile:
    """BLOCK_M rows (one expert) x BLOCK_N outputs a program; the reduction steps `kb` q8_1
    blocks at a time (their loads and code decoding at once; the bits are the same for every kb).
    The default is a first guess for Hopper (wgmma wants BLOCK_M >= 64), not yet measured."""
    BLOCK_M: int = 64
    BLOCK_N: int = 64
    num_warps: int = 4
    num_stages: int = 2
    kb: int = 1

    @property
    def name(self) -> str:
        k = f"k{self.kb}" if self.kb != 1 else ""
        return f"{self.BLOCK_M}x{self.BLOCK_N}/w{self.num_warps}s{self.num_stages}{k}"

    @classmethod
    def parse(cls, text: str) -> "Int8Tile":
        """'BMxBN/wWsS[kK]' (the `name` form), e.g. '128x128/w8s3' or '128x128/w8s3k4': BM and
        BN powers of two from 16, BN a multiple of the q8_1 block (the gate/up pass writes q8_1
        rows by whole blocks), K the q8_1 blocks a reduction step covers (1 when left out)."""
        try:
            dims, ws = text.split("/")
            bm, bn = (int(v) for v in dims.split("x"))
            if not ws.startswith("w"):
                raise ValueError
            w, st = ws[1:].split("s")
            st, kb = st.split("k") if "k" in st else (st, "1")
            w, st, kb = int(w), int(st), int(kb)
            ok = all(v >= 16 and v & (v - 1) == 0 for v in (bm, bn)) and bn % QK == 0 and \
                w in (1, 2, 4, 8, 16) and 1 <= st <= 6 and kb in KBS
            if not ok:
                raise ValueError
            return cls(bm, bn, w, st, kb)
        except ValueError:
            raise StrataError(f"an int8 tile is BMxBN/wWsS[kK], BM and BN powers of two >= 16, "
                              f"BN a multiple of {QK}, 1-16 warps, 1-6 stages, K (q8_1 blocks a "
                              f"reduction step) one of {', '.join(map(str, KBS))} (e.g. "
                              f"128x128/w8s3k4); got {text!r}") from None


# the interpreter's: its time goes by programs x reduction steps (each step's Python overhead),
# hardly by a tile's elements, so a large tile; the bits are the same for every tile. Measured
# on this repo's CPU (moe_ffn_int8, T 256, top-2, one thread): Q4_K/Q6_K experts of D = F = 256,
# 16x32 163 s, 32x64 43 s, 64x64 17 s, 64x128 8.2 s, 64x256 6.4 s; Q8_0 of D 64, F 32 (3.1,
# 1.9, 1.3, 1.3, 1.4 s). 64x128: most of the gain at half 64x256's padding of narrow experts
INTERP_TILE = Int8Tile(BLOCK_M=64, BLOCK_N=128)


def default_tile() -> Int8Tile:
    """The tile moe_ffn_int8 takes when none is given."""
    return INTERP_TILE if INTERPRET else Int8Tile()


def _min_sign(fmt) -> int:
    """0: no minimum; 1: w = d*c + m (Q4_1, Q5_1); -1: w = d*c - m (the k-quants)."""
    tr = format_traits(fmt)
    return 0 if not tr.PAIR else -1 if tr.apply is _minus_min else 1


def _check_int8(experts: ExpertSet) -> None:
    lay = experts.layout
    bad = sorted({m.fmt.name for m in lay.matrices if m.fmt.name not in INT8_FORMATS})
    if bad:
        raise StrataError(f"no int8 split for {bad}; the int8 GEMM reads "
                          f"{', '.join(INT8_FORMATS)}")
    if lay.d_model % QK or lay.d_expert % QK:
        raise StrataError(f"the int8 GEMM needs D and F multiples of {QK}, got D={lay.d_model} "
                          f"F={lay.d_expert}")


def _room(grp) -> int:
    """Row blocks the grouping has room for: the exact count (group_blocked), or the bound
    (group_blocked_bounded: the kernel reads the count on the device and idles past it)."""
    return grp.n_blocks if grp.n_blocks is not None else grp.block_expert.numel()


def launch_out(tile: Int8Tile, dst, hq: Q8Rows | None):
    """(dst, hd, hs, stride_hd) a launch writes: fp32 h or yk at dst, or hq's q8_1 rows (codes,
    d, s); a StrataError where the tile cannot run (kb, or BN not whole q8_1 blocks for hq)."""
    if tile.kb not in KBS:
        raise StrataError(f"an int8 tile's reduction step covers "
                          f"{', '.join(map(str, KBS))} q8_1 blocks, got kb={tile.kb}")
    if hq is None:
        return dst, dst, dst, 0     # hd, hs never touched
    if tile.BLOCK_N % QK:
        raise StrataError(f"q8_1 rows out of the GEMM need BLOCK_N a multiple of {QK}, "
                          f"got {tile.BLOCK_N}")
    return hq.q, hq.d, hq.s, hq.d.stride(0)


def _launch(mode: int, a: Q8Rows, grp, experts: ExpertSet, m1, m2, dst, tw, tile: Int8Tile,
            n_out: int, n_in: int, b1: str, b2: str, topk: int, hq: Q8Rows | None = None):
    """One GEMM launch; `hq`: GATE_UP writes these q8_1 rows instead of fp32 h (dst)."""
    lay = experts.layout
    dst, hd, hs, stride_hd = launch_out(tile, dst, hq)
    boff = ((lay.bias.part(b1)[0], lay.bias.part(b2)[0]) if lay.bias is not None else (0, 0))
    S = _k.Int8Spec(MODE=mode, TOPK=topk, FMT1=format_traits(m1.fmt), FMT2=format_traits(m2.fmt),
                    MIN1=_min_sign(m1.fmt), MIN2=_min_sign(m2.fmt), BM=tile.BLOCK_M,
                    BN=tile.BLOCK_N, INTERP=INTERPRET, BIAS=lay.bias is not None,
                    ACT=lay.act.code, QH=hq is not None, KB=tile.kb)
    n_tiles = _room(grp) * -(-n_out // tile.BLOCK_N)
    _k._int8_gemm_kernel[(n_tiles,)](
        a.q, a.d, a.s, a.q.stride(0), a.d.stride(0), grp.sorted_ids, grp.block_expert,
        grp.n_assign, experts.arena, experts.slot_offset, m1.offset, m1.row_bytes, m2.offset,
        m2.row_bytes, dst, dst.stride(0), tw, n_out, n_in, grp.n_blocks_dev, *boff,
        float(lay.act.alpha), float(lay.act.limit), hd, hs, stride_hd, S=S,
        num_warps=tile.num_warps, num_stages=tile.num_stages, enable_fp_fusion=False)
    return dst


def int8_gate_up(xq: Q8Rows, grp, experts: ExpertSet, topk: int,
                 tile: Int8Tile = Int8Tile()) -> torch.Tensor:
    """h fp32 [n_blocks * BM, F]: row r = act(gate_e . xq[tok(r)], up_e . xq[tok(r)]) for the
    block-padded grouping `grp` (strata.kernels.moe.grouping.group_blocked with tile.BLOCK_M);
    padding rows hold act(bias) (act(0, 0) = 0 without biases)."""
    lay = experts.layout
    h = torch.empty(_room(grp) * tile.BLOCK_M, lay.d_expert, dtype=torch.float32,
                    device=xq.q.device)
    if _room(grp):
        _launch(0, xq, grp, experts, lay.gate, lay.up, h, h, tile, lay.d_expert, lay.d_model,
                "gate", "up", topk)
    return h


def int8_gate_up_q8(xq: Q8Rows, grp, experts: ExpertSet, topk: int,
                    tile: Int8Tile = Int8Tile(), out: Q8Rows | None = None) -> Q8Rows:
    """int8_gate_up's h, quantized to q8_1 in the GEMM's epilogue (no fp32 h in memory): the
    bits of quantize_q8_1(int8_gate_up(...)). `out`: rows to write into (at least n_blocks * BM)."""
    lay = experts.layout
    rows = _room(grp) * tile.BLOCK_M
    hq = out or _q8_rows(rows, lay.d_expert, xq.q.device)
    if rows:
        _launch(0, xq, grp, experts, lay.gate, lay.up, None, hq.d, tile, lay.d_expert,
                lay.d_model, "gate", "up", topk, hq=hq)
    return hq


def _q8_rows(R: int, n: int, device, raw: torch.Tensor | None = None) -> Q8Rows:
    """q8_1 rows [R, n]: fresh, or views of the uint8 `raw` (codes, then d, then s; R*n is
    even, so the fp16 parts start 2-byte aligned)."""
    if raw is None:
        return Q8Rows(torch.empty(R, n, dtype=torch.int8, device=device),
                      torch.empty(R, n // QK, dtype=torch.float16, device=device),
                      torch.empty(R, n // QK, dtype=torch.float16, device=device))
    nq, nd = R * n, R * (n // QK) * 2
    return Q8Rows(raw[:nq].view(torch.int8).view(R, n),
                  raw[nq:nq + nd].view(torch.float16).view(R, n // QK),
                  raw[nq + nd:nq + 2 * nd].view(torch.float16).view(R, n // QK))


def q8_nbytes(R: int, n: int) -> int:
    """Bytes of q8_1 rows [R, n]: n codes and two fp16 a block of 32, rounded up to 256."""
    return -(-(R * n + 4 * R * (n // QK)) // 256) * 256


def _q8_buffers(workspace, T: int, D: int, R: int, F: int, device) -> tuple[Q8Rows, Q8Rows]:
    """(x's q8_1 rows [T, D], h's [R, F]): views of workspace["h"]'s bytes where it holds both
    (an engine's carve), else fresh tensors."""
    buf = workspace.get("h") if workspace else None
    nx, nh = q8_nbytes(T, D), q8_nbytes(R, F)
    if buf is not None and buf.is_contiguous() and buf.numel() * buf.element_size() >= nx + nh:
        raw = buf.view(-1).view(torch.uint8)
        return _q8_rows(T, D, device, raw[:nx]), _q8_rows(R, F, device, raw[nx:nx + nh])
    return _q8_rows(T, D, device), _q8_rows(R, F, device)


def int8_down(hq: Q8Rows, grp, experts: ExpertSet, topk_weights: torch.Tensor,
              tile: Int8Tile = Int8Tile(), yk: torch.Tensor | None = None) -> torch.Tensor:
    """yk fp32 [T*K, D]: row a = w[a] * (down_e . hq[r(a)] + bd_e) for every assignment a in the
    grouping (rows of skipped assignments are left unwritten); `yk`: the rows to write into."""
    lay = experts.layout
    T, K = topk_weights.shape
    if yk is None:
        yk = torch.empty(T * K, lay.d_model, dtype=torch.float32, device=hq.q.device)
    tw = topk_weights.reshape(-1).float().contiguous()
    if _room(grp):
        _launch(1, hq, grp, experts, lay.down, lay.down, yk, tw, tile, lay.d_model,
                lay.d_expert, "down", "down", K)
    return yk


# ---------------------------------------------------------------- torch twins

def _split(experts: ExpertSet, e: int, name: str):
    """(codes int8 [rows, cols], d, m fp32 [rows, cols/run] (m None: no minimum), run) of expert
    e's matrix `name`."""
    mat = getattr(experts.layout, name)
    off = int(experts.slot_offset[e])
    raw = experts.arena[off + mat.offset: off + mat.offset + mat.nbytes]
    c, d, m = split_codes(raw, mat.fmt, mat.rows, mat.cols)
    return c, d, m, mat.cols // d.shape[1]


def int8_matmul_torch(qa: torch.Tensor, da: torch.Tensor, sa: torch.Tensor, c, d, m,
                      run: int) -> torch.Tensor:
    """fp32 [M, N]: q8_1 rows (qa int8 [M, n], da / sa fp32 [M, n/32]) against a split matrix
    (c int8 [N, n], d / m fp32 [N, n/run]) as the kernel's _int8_mma adds them up."""
    M, N = qa.shape[0], c.shape[0]
    acc = torch.zeros(M, N, dtype=torch.float32, device=qa.device)
    per = QK // run                                     # runs a block
    for kb in range(qa.shape[1] // QK):
        for h in range(per):
            k = slice(kb * QK + h * run, kb * QK + (h + 1) * run)
            # integer dot (exact in fp64: |sum| < 2**53), as the int32 MMA
            P = (qa[:, k].double() @ c[:, k].double().T).float()
            r = kb * per + h
            acc = acc + P * (da[:, kb, None] * d[None, :, r])
            if m is not None:
                s = sa[:, kb] if per == 1 else qa[:, k].int().sum(1).float() * da[:, kb]
                acc = acc + s[:, None] * m[None, :, r]
    return acc


def _block_rows(a: Q8Rows, rows: torch.Tensor, valid: torch.Tensor):
    """(qa, da, sa) of a block's rows, zero where not valid (as the kernel's masked loads)."""
    r = torch.where(valid, rows, 0).long()
    v = valid[:, None]
    return (torch.where(v, a.q[r], 0), torch.where(v, a.d[r].float(), 0.0),
            torch.where(v, a.s[r].float(), 0.0))


def _blocks(grp, BM: int):
    """(block index, expert, its BM sorted rows' assignment ids, valid) of each row block."""
    ids = grp.sorted_ids.long()
    n = grp.n_blocks if grp.n_blocks is not None else int(grp.n_blocks_dev)
    for mb, e in enumerate(grp.block_expert[:n].tolist()):
        blk = ids[mb * BM:(mb + 1) * BM]
        yield mb, e, blk, blk < grp.n_assign


def int8_gate_up_torch(xq: Q8Rows, grp, experts: ExpertSet, topk: int,
                       tile: Int8Tile = Int8Tile()) -> torch.Tensor:
    """Plain-torch twin of `int8_gate_up` (same signature)."""
    lay = experts.layout
    BM = tile.BLOCK_M
    h = torch.full((_room(grp) * BM, lay.d_expert), float("nan"), dtype=torch.float32,
                   device=xq.q.device)
    for mb, e, ids, valid in _blocks(grp, BM):
        a = _block_rows(xq, ids // topk, valid)
        g = int8_matmul_torch(*a, *_split(experts, e, "gate"))
        u = int8_matmul_torch(*a, *_split(experts, e, "up"))
        b = expert_biases(experts, e)
        if b is not None:
            g, u = g + b[0], u + b[1]
        h[mb * BM:(mb + 1) * BM] = _act_torch(g, u, lay.act)
    return h


def int8_gate_up_q8_torch(xq: Q8Rows, grp, experts: ExpertSet, topk: int,
                          tile: Int8Tile = Int8Tile(), out: Q8Rows | None = None) -> Q8Rows:
    """Plain-torch twin of `int8_gate_up_q8` (same signature)."""
    return quantize_q8_1_torch(int8_gate_up_torch(xq, grp, experts, topk, tile), out=out)


def _act_torch(g: torch.Tensor, u: torch.Tensor, act) -> torch.Tensor:
    """The kernel's act (strata.kernels.moe._ffn_kernel._act) in its own expressions."""
    if act.name == "silu":
        return g / (1.0 + torch.exp(-g)) * u
    g = torch.minimum(g, torch.tensor(act.limit, dtype=torch.float32))
    u = torch.clamp(u, -act.limit, act.limit)
    return g / (1.0 + torch.exp(-act.alpha * g)) * (u + 1.0)


def int8_down_torch(hq: Q8Rows, grp, experts: ExpertSet, topk_weights: torch.Tensor,
                    tile: Int8Tile = Int8Tile(), yk: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch twin of `int8_down` (same signature; unwritten rows of a fresh yk are NaN)."""
    lay = experts.layout
    T, K = topk_weights.shape
    if yk is None:
        yk = torch.full((T * K, lay.d_model), float("nan"), dtype=torch.float32,
                        device=hq.q.device)
    tw = topk_weights.reshape(-1).float()
    BM = tile.BLOCK_M
    for mb, e, ids, valid in _blocks(grp, BM):
        rows = torch.arange(mb * BM, (mb + 1) * BM, device=ids.device)
        y = int8_matmul_torch(*_block_rows(hq, rows, valid), *_split(experts, e, "down"))
        b = expert_biases(experts, e)
        if b is not None:
            y = y + b[2]
        yk[ids[valid]] = (y * tw[torch.where(valid, ids, 0)][:, None])[valid]
    return yk


# ---------------------------------------------------------------- the whole feed-forward

def _plan(x, topk_ids, topk_weights, experts, out, combine, workspace):
    _check_inputs(x, topk_ids, topk_weights, experts)
    _check_int8(experts)
    if combine not in COMBINES:
        raise StrataError(f"combine must be one of {COMBINES}, got {combine!r}")
    if combine == "defer" and (not workspace or workspace.get("yk") is None):
        raise StrataError("combine='defer' keeps the rows between calls in workspace['yk']; "
                          "pass one (fp32, at least [T*K, D])")
    if out is not None and (out.dtype != torch.float32 or out.shape != x.shape):
        raise StrataError(f"out must be fp32 {list(x.shape)}, got {out.dtype} {list(out.shape)}")


def moe_ffn_int8(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 experts: ExpertSet, *, tile: Int8Tile | None = None, out=None, workspace=None,
                 check: bool = True, combine: str = "pass", scratch_alloc=None) -> torch.Tensor:
    """The layer's MoE feed-forward on int8 (module docstring): x bf16 [T, D] -> y bf16 [T, D],
    or added into `out` (fp32 [T, D]). moe_ffn's calling convention (strata.kernels.moe.ffn):
    ids of -1 are skipped; check=False: no host sync (the grid is the bound of padded_rows, the
    kernel reads the block count on the device); combine "pass" | "defer" | "layer" with the
    per-assignment rows in workspace["yk"]. Data-parallel only: scratch_alloc is never called.
    The q8_1 rows of x and h take their bytes from workspace["h"] (the bf16 GEMM's h, 2F bytes
    a row: q8_1 rows need 1.125 a feature) where it holds them both, else fresh tensors."""
    _plan(x, topk_ids, topk_weights, experts, out, combine, workspace)
    return run_ffn(x, topk_ids, topk_weights, experts, tile or default_tile(), out, workspace,
                   check, combine, int8_gate_up_q8, int8_down)


def run_ffn(x, topk_ids, topk_weights, experts, tile: Int8Tile, out, workspace, check: bool,
            combine: str, gate_up_q8, down, order=False) -> torch.Tensor:
    """moe_ffn_int8's body after its checks, with its two GEMM passes given (`gate_up_q8`,
    `down`: int8_gate_up_q8's and int8_down's signatures) and x's q8_1 codes in the plane order
    `order` names (quantize_q8_1's; strata.kernels.moe.plane_int8 runs the plane layout's passes
    through it)."""
    T, K = topk_ids.shape
    D = x.shape[1]
    E, BM = experts.n_expert, tile.BLOCK_M
    yk = _work(workspace, "yk", (T * K, D), torch.float32, x.device)             # [T·K, D]
    if T * K == 0:
        return _combine(yk, T, K, D, topk_ids, out, "layer" if combine == "layer" else None)
    if check:   # one sync: validates the ids and the slot table, sizes the grid exactly
        grp = group_blocked(topk_ids, E, BM, slot_offset=experts.slot_offset,
                            skip_negative=True)
    else:
        grp = group_blocked_bounded(topk_ids, E, BM, padded_rows(T, K, E, BM) // BM)
    if grp.n_blocks is None or grp.n_blocks:
        xq, hq = _q8_buffers(workspace, T, D, _room(grp) * BM, experts.layout.d_expert, x.device)
        hq = gate_up_q8(quantize_q8_1(x, out=xq, order=order), grp, experts, K, tile, out=hq)
        down(hq, grp, experts, topk_weights, tile, yk=yk)
    elif combine != "layer":    # nothing routed to this call's experts
        return _combine(yk, T, K, D, topk_ids, out, None)
    if combine == "defer":
        return out if out is not None else torch.zeros(T, D, dtype=torch.bfloat16,
                                                       device=x.device)
    mask = combine == "pass" and (grp.n_skipped is None or grp.n_skipped > 0)
    return _combine(yk, T, K, D, topk_ids, out, "mask" if mask else "all")


def moe_ffn_int8_torch(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                       experts: ExpertSet, *, tile: Int8Tile | None = None, out=None,
                       workspace=None, check: bool = True, combine: str = "pass",
                       scratch_alloc=None) -> torch.Tensor:
    """Plain-torch twin of `moe_ffn_int8` (same signature; workspace, check and scratch_alloc
    ignored): every call sums its own rows (into `out` when given), as moe_ffn_torch, so a
    layer's calls add up to the same y whatever `combine` says."""
    _plan(x, topk_ids, topk_weights, experts, out, "pass", None)
    tile = tile or default_tile()
    T, K = topk_ids.shape
    D = x.shape[1]
    grp = group_blocked(topk_ids, experts.n_expert, tile.BLOCK_M,
                        slot_offset=experts.slot_offset, skip_negative=True)
    hq = int8_gate_up_q8_torch(quantize_q8_1_torch(x), grp, experts, K, tile)
    yk = int8_down_torch(hq, grp, experts, topk_weights, tile)
    rows = None if grp.n_blocks == 0 else "mask" if grp.n_skipped else "all"
    return combine_rows_torch(yk, T, K, D, topk_ids, out, rows)
