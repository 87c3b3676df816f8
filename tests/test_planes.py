"""The plane layout (strata.planes): where the bytes go, exact inversion, decoded values equal to
ggml's decoder (strata.formats.dequantize, itself bit-exact against gguf-py) bit for bit."""
import itertools

import pytest
import torch
from hypothesis import example, given, strategies as st

from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.formats import dequantize, get_format
from strata.kernels.moe.ffn import dequantize_matrix
from strata.kernels.moe.random_experts import random_blocks, random_expert_set
from strata.kernels.moe.plane import plane_matrix
from strata.planes import (PLANE_FORMATS, PlaneSet, dequantize_planes, plane_layout,
                           relayout_blob_, split_planes, to_expert_set, to_ggml,
                           to_plane_set, to_planes)


def _raw(fmt, rows, cols, seed, *, any_bytes=False):
    """A matrix's ggml bytes: valid random blocks, or (any_bytes) any bytes at all (scales that
    are inf, NaN or subnormal: the relayout and both decoders must still agree)."""
    if any_bytes:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, 256, (get_format(fmt).nbytes(rows, cols),), generator=g,
                             dtype=torch.uint8)
    return random_blocks(get_format(fmt), rows, cols, seed=seed)


def _q4_byte(pair):
    """Where weight pair `pair` (weights 2·pair, 2·pair + 1) of a row's 4-bit codes sits: pair
    8s + 4h + i of each 16-byte group at byte 4i + 2s + h (a wgmma lane's pairs adjacent)."""
    g, q = divmod(pair, 16)
    s, rest = divmod(q, 8)
    h, i = divmod(rest, 4)
    return 16 * g + 4 * i + 2 * s + h


def test_the_order_tables_are_the_relayouts():
    """Q8_ORDER / Q8_WEIGHTS and Q4_ORDER say what _q8_order / _q4_order do to one 16-byte group
    (byte j holds weight, or weight pair, ORDER[j]), and `back` undoes each."""
    from strata.planes import Q4_ORDER, Q8_ORDER, Q8_WEIGHTS, _q4_order, _q8_order
    g = torch.arange(32, dtype=torch.uint8)                            # two groups, by index
    for order, fn in ((Q8_ORDER, _q8_order), (Q4_ORDER, _q4_order)):
        want = torch.tensor(list(order) + [16 + j for j in order], dtype=torch.uint8)
        assert torch.equal(fn(g), want)
        assert torch.equal(fn(fn(g), back=True), g)
    assert [Q8_ORDER[j] for j in Q8_WEIGHTS] == list(range(16))


def _same(a, b):
    """Bit-equal fp32 tensors (NaNs compared by their bits too)."""
    return torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0"])
def test_each_byte_goes_where_the_layout_says(fmt):
    """scales[n, r] = block (n, r)'s fp16; Q8_0 codes[n, r·32 + 16g + 4i + 2h + p] = the block's
    q[16g + 8h + 2i + p] (each lane's four codes of a 16-wide k slice adjacent); Q4_0 weight pair
    j of a row (weight 2j in the low nibble, 2j + 1 in the high) at code byte _q4_byte(j), where
    ggml's block keeps weight i < 16 in the low nibble of qs[i] and i >= 16 in the high nibble of
    qs[i - 16]."""
    rows, cols, cb = 3, 96, PLANE_FORMATS[fmt].code_bytes
    raw = _raw(fmt, rows, cols, 1, any_bytes=True)
    pl = to_planes(raw, fmt, rows, cols)
    bb = cb + 2
    R = cols // 32
    for n in range(rows):
        for r in range(R):
            blk = raw[(n * R + r) * bb:(n * R + r + 1) * bb]
            at = n * R * cb + r * cb
            if fmt == "Q8_0":
                for g, i, h, p in itertools.product(range(2), range(4), range(2), range(2)):
                    j = 16 * g + 4 * i + 2 * h + p
                    assert pl[at + j] == blk[2 + 16 * g + 8 * h + 2 * i + p], (n, r, j)
            else:
                for i in range(32):   # weight i of the block, by both orders
                    g = int(blk[2 + i % 16]) >> (4 * (i // 16)) & 15
                    p = int(pl[at + _q4_byte(i // 2)]) >> (4 * (i % 2)) & 15
                    assert g == p, (n, r, i)
            s = rows * R * cb + (n * R + r) * 2
            assert torch.equal(pl[s:s + 2], blk[:2])
    codes, scales = split_planes(pl, fmt, rows, cols)
    assert codes.shape == (rows, R * cb) and scales.shape == (rows, R)


def test_q4_k_bytes_go_where_the_layout_says():
    """Q4_K: weight pair j of a row (2j low nibble, 2j + 1 high) at code byte _q4_byte(j),
    where ggml keeps weight 64g + i (i < 32) of a super-block in the low nibble of qs[32g + i] and
    64g + 32 + i in its high nibble; the scale entry of super-block (n, b) is ggml's d, dmin, then byte 4 + s =
    sc[s] | (m[s] >> 4) << 6 and byte 12 + j = the low nibbles of m[2j], m[2j + 1], with (sc, m)
    ggml's get_scale_min_k4 of its 12 bytes (strata.formats.kquants.q4_k_scale_min)."""
    from strata.formats.kquants import q4_k_scale_min
    rows, cols = 2, 512
    raw = _raw("Q4_K", rows, cols, 2, any_bytes=True)
    pl = to_planes(raw, "Q4_K", rows, cols)
    nb = cols // 256
    codes, scales = split_planes(pl, "Q4_K", rows, cols)
    assert codes.shape == (rows, cols // 2) and scales.shape == (rows, nb, 16)
    for n in range(rows):
        for b in range(nb):
            blk = raw[(n * nb + b) * 144:(n * nb + b + 1) * 144]
            for w in range(256):
                g = int(blk[16 + 32 * (w // 64) + w % 32]) >> (4 * (w % 64 // 32)) & 15
                k = 256 * b + w
                p = int(codes[n, _q4_byte(k // 2)]) >> (4 * (k % 2)) & 15
                assert g == p, (n, b, w)
            ent = scales[n, b]
            assert torch.equal(ent[:4], blk[:4])
            sc, mn = (v[0].tolist() for v in q4_k_scale_min(blk[4:16].reshape(1, 12)))
            for s in range(8):
                assert int(ent[4 + s]) == sc[s] | (mn[s] >> 4) << 6, (n, b, s)
                assert int(ent[12 + s // 2]) >> (4 * (s % 2)) & 15 == mn[s] & 15, (n, b, s)
    assert pl[rows * cols // 2:].numel() == rows * nb * 16


def _q4_k_extremes() -> torch.Tensor:
    """Q4_K super-blocks at the edges: d, dmin the largest fp16, the smallest subnormal,
    negative, zero; every sc and m 0 or 63; codes all 0 or all 15."""
    f16 = [65504.0, -65504.0, 2.0 ** -24, -(2.0 ** -24), 0.0, 1.0]
    blocks = []
    for i, (d, dmin) in enumerate([(a, b) for a in f16 for b in f16]):
        blk = torch.zeros(144, dtype=torch.uint8)
        blk[0:2] = torch.tensor([d], dtype=torch.float16).view(torch.uint8)
        blk[2:4] = torch.tensor([dmin], dtype=torch.float16).view(torch.uint8)
        blk[4:16] = 255 if i % 2 else 0                  # all sc = m = 63, or all 0
        if i % 3 == 1:
            blk[4:16] = torch.tensor([0x3F, 0xC0] * 6, dtype=torch.uint8)   # mixed 63 / 0 fields
        blk[16:] = 255 if i % 4 < 2 else 0               # codes all 15 or all 0
        blocks.append(blk)
    return torch.cat(blocks)


def test_q4_k_extreme_scales_decode_bit_exact():
    raw = _q4_k_extremes()
    rows = raw.numel() // 144
    pl = to_planes(raw, "Q4_K", rows, 256)
    assert torch.equal(to_ggml(pl, "Q4_K", rows, 256), raw)
    ref = dequantize(raw, get_format("Q4_K")).float().reshape(rows, 256)
    assert _same(dequantize_planes(pl, "Q4_K", rows, 256), ref)


@given(fmt=st.sampled_from(sorted(PLANE_FORMATS)), rows=st.integers(1, 9),
       blocks=st.integers(1, 6), lead=st.integers(0, 2), seed=st.integers(0, 2**16),
       any_bytes=st.booleans())
@example(fmt="Q8_0", rows=1, blocks=1, lead=0, seed=0, any_bytes=True)   # one block: no strides
@example(fmt="Q4_0", rows=7, blocks=3, lead=2, seed=5, any_bytes=True)   # odd rows, batched
@example(fmt="Q4_K", rows=5, blocks=3, lead=2, seed=6, any_bytes=True)   # inf/NaN/subnormal d
def test_relayout_inverts_and_decodes_bit_exact(fmt, rows, blocks, lead, seed, any_bytes):
    """to_ggml(to_planes(x)) == x (and the other way), same byte count, and the plane decoder
    equals ggml's decoder bit for bit, over shapes and leading (batch) dims."""
    cols = PLANE_FORMATS[fmt].block * blocks
    mats = [_raw(fmt, rows, cols, seed + i, any_bytes=any_bytes) for i in range(max(1, lead))]
    raw = torch.stack(mats) if lead else mats[0]
    pl = to_planes(raw, fmt, rows, cols)
    assert pl.shape == raw.shape and pl.dtype == torch.uint8
    assert torch.equal(to_ggml(pl, fmt, rows, cols), raw)
    assert torch.equal(to_planes(to_ggml(pl, fmt, rows, cols), fmt, rows, cols), pl)
    for i, m in enumerate(mats):
        ref = dequantize(m, get_format(fmt)).float().reshape(rows, cols)
        got = dequantize_planes(pl[i] if lead else pl, fmt, rows, cols)
        assert _same(got, ref), f"matrix {i}: plane decode differs from ggml's"


def test_bad_matrix_is_a_clear_error():
    with pytest.raises(StrataError, match="no plane layout"):
        to_planes(torch.zeros(210, dtype=torch.uint8), "Q6_K", 1, 256)
    with pytest.raises(StrataError, match="uint8 bytes"):
        to_planes(torch.zeros(33, dtype=torch.uint8), "Q8_0", 1, 32)
    with pytest.raises(StrataError, match="multiple of 256"):
        to_planes(torch.zeros(72, dtype=torch.uint8), "Q4_K", 1, 128)


def test_plane_layout_offsets_keep_the_blob():
    """Each plane matrix keeps its slot's offset and bytes; codes rows and the scale plane start
    16-byte aligned; BF16 matrices and the bias slot have no planes; the size is unchanged."""
    for fmts, bias in ((("Q8_0", "Q4_0", "BF16"), True), (("Q4_K", "Q4_K", "BF16"), False)):
        lay = BlobLayout.make(2048, 768, *fmts, bias=bias)
        pl = plane_layout(lay)
        assert pl.blob.size == lay.size and pl.down is None
        for m, p in zip(lay.matrices[:2], pl.matrices[:2]):
            assert p.codes_offset == m.offset and p.nbytes == m.nbytes
            assert p.codes_offset % 256 == 0 and p.codes_row_bytes % 16 == 0
            assert p.scales_offset % 16 == 0 and p.scales_row_bytes % 2 == 0
            assert p.scales_offset + p.rows * p.scales_row_bytes == m.offset + m.nbytes
        if fmts[0] == "Q4_K":     # 16 bytes of scales a super-block: scale rows aligned too
            assert pl.gate.codes_row_bytes == 1024 and pl.gate.scales_row_bytes == 128
        else:
            assert pl.gate.codes_row_bytes == 2048 and pl.up.codes_row_bytes == 1024


@pytest.mark.parametrize("fmts, bias", [(("Q8_0",), False), (("Q8_0", "Q4_0", "BF16"), True),
                                        (("Q4_K", "Q4_K", "Q8_0"), True)],
                         ids=["q8", "mixed+bias", "q4k-q8-down+bias"])
def test_expert_set_relayout(fmts, bias):
    """A layer's resident blobs re-laid in place: matrices decode as before bit for bit, BF16
    matrices, bias slots and absent experts' bytes untouched, the way back restores the arena."""
    d_model = 256 if "Q4_K" in fmts else 64
    ex = random_expert_set(4, d_model, 96, *fmts, seed=3, absent=(2,), bias=bias)
    ps = to_plane_set(ex)
    assert isinstance(ps, PlaneSet) and ps.arena.shape == ex.arena.shape
    lay = ex.layout
    for e in (0, 1, 3):
        off = int(ex.slot_offset[e])
        for m, p in zip(lay.matrices, ps.planes.matrices):
            a = ex.arena[off + m.offset: off + m.offset + m.nbytes]
            b = ps.arena[off + m.offset: off + m.offset + m.nbytes]
            if p is None:
                assert torch.equal(a, b), f"{m.name} ({m.fmt.name}) was touched"
            else:
                assert not torch.equal(a, b)
            assert _same(plane_matrix(ps, e, m.name), dequantize_matrix(ex, e, m.name))
        if lay.bias is not None:
            s = slice(off + lay.bias.offset, off + lay.bias.offset + lay.bias.nbytes)
            assert torch.equal(ex.arena[s], ps.arena[s])
    assert torch.equal(to_expert_set(ps).arena, ex.arena)


def test_relayout_blob_in_place_and_back():
    ex = random_expert_set(1, 64, 32, "Q8_0", seed=4, shuffle=False)
    blob = ex.arena[:ex.layout.size].clone()
    relayout_blob_(blob, ex.layout)
    assert not torch.equal(blob, ex.arena[:ex.layout.size])
    relayout_blob_(blob, ex.layout, to="ggml")
    assert torch.equal(blob, ex.arena[:ex.layout.size])
    with pytest.raises(StrataError, match="'planes' or 'ggml'"):
        relayout_blob_(blob, ex.layout, to="plane")
