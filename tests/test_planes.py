"""The plane layout (strata.planes): where the bytes go, exact inversion, decoded values equal to
ggml's decoder (strata.formats.dequantize, itself bit-exact against gguf-py) bit for bit."""
import pytest
import torch
from hypothesis import example, given, strategies as st

from strata.blob import BlobLayout
from strata.errors import StrataError
from strata.formats import dequantize, get_format
from strata.kernels.moe import dequantize_matrix
from strata.kernels.synth import random_blocks, random_expert_set
from strata.planes import (PLANE_FORMATS, PlaneSet, dequantize_planes, plane_layout,
                           plane_matrix, relayout_blob_, split_planes, to_expert_set, to_ggml,
                           to_plane_set, to_planes)


def _raw(fmt, rows, cols, seed, *, any_bytes=False):
    """A matrix's ggml bytes: valid random blocks, or (any_bytes) any bytes at all (scales that
    are inf, NaN or subnormal: the relayout and both decoders must still agree)."""
    if any_bytes:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, 256, (get_format(fmt).nbytes(rows, cols),), generator=g,
                             dtype=torch.uint8)
    return random_blocks(get_format(fmt), rows, cols, seed=seed)


def _same(a, b):
    """Bit-equal fp32 tensors (NaNs compared by their bits too)."""
    return torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


@pytest.mark.parametrize("fmt", sorted(PLANE_FORMATS))
def test_each_byte_goes_where_the_layout_says(fmt):
    """scales[n, r] = block (n, r)'s fp16; Q8_0 codes[n, r·32 + j] = the block's q[j]; Q4_0
    code byte j of a row = weight 2j (low nibble) and 2j + 1 (high), where ggml's block keeps
    weight i < 16 in the low nibble of qs[i] and i >= 16 in the high nibble of qs[i - 16]."""
    rows, cols, cb = 3, 96, PLANE_FORMATS[fmt]
    raw = _raw(fmt, rows, cols, 1, any_bytes=True)
    pl = to_planes(raw, fmt, rows, cols)
    bb = cb + 2
    R = cols // 32
    for n in range(rows):
        for r in range(R):
            blk = raw[(n * R + r) * bb:(n * R + r + 1) * bb]
            at = n * R * cb + r * cb
            if fmt == "Q8_0":
                assert torch.equal(pl[at:at + cb], blk[2:])
            else:
                for i in range(32):   # weight i of the block, by both orders
                    g = int(blk[2 + i % 16]) >> (4 * (i // 16)) & 15
                    p = int(pl[at + i // 2]) >> (4 * (i % 2)) & 15
                    assert g == p, (n, r, i)
            s = rows * R * cb + (n * R + r) * 2
            assert torch.equal(pl[s:s + 2], blk[:2])
    codes, scales = split_planes(pl, fmt, rows, cols)
    assert codes.shape == (rows, R * cb) and scales.shape == (rows, R)


@given(fmt=st.sampled_from(sorted(PLANE_FORMATS)), rows=st.integers(1, 9),
       blocks=st.integers(1, 6), lead=st.integers(0, 2), seed=st.integers(0, 2**16),
       any_bytes=st.booleans())
@example(fmt="Q8_0", rows=1, blocks=1, lead=0, seed=0, any_bytes=True)   # one block: no strides
@example(fmt="Q4_0", rows=7, blocks=3, lead=2, seed=5, any_bytes=True)   # odd rows, batched
def test_relayout_inverts_and_decodes_bit_exact(fmt, rows, blocks, lead, seed, any_bytes):
    """to_ggml(to_planes(x)) == x (and the other way), same byte count, and the plane decoder
    equals ggml's decoder bit for bit, over shapes and leading (batch) dims."""
    cols = 32 * blocks
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
        to_planes(torch.zeros(64, dtype=torch.uint8), "Q4_K", 1, 256)
    with pytest.raises(StrataError, match="uint8 bytes"):
        to_planes(torch.zeros(33, dtype=torch.uint8), "Q8_0", 1, 32)


def test_plane_layout_offsets_keep_the_blob():
    """Each plane matrix keeps its slot's offset and bytes; codes rows and the scale plane start
    16-byte aligned; BF16 matrices and the bias slot have no planes; the size is unchanged."""
    lay = BlobLayout.make(2048, 768, "Q8_0", "Q4_0", "BF16", bias=True)
    pl = plane_layout(lay)
    assert pl.blob.size == lay.size and pl.down is None
    for m, p in zip(lay.matrices[:2], pl.matrices[:2]):
        assert p.codes_offset == m.offset and p.nbytes == m.nbytes
        assert p.codes_offset % 256 == 0 and p.codes_row_bytes % 16 == 0
        assert p.scales_offset % 16 == 0
        assert p.scales_offset + 2 * p.rows * p.scales_row == m.offset + m.nbytes
    assert pl.gate.codes_row_bytes == 2048 and pl.up.codes_row_bytes == 1024


@pytest.mark.parametrize("fmts, bias", [(("Q8_0",), False), (("Q8_0", "Q4_0", "BF16"), True)],
                         ids=["q8", "mixed+bias"])
def test_expert_set_relayout(fmts, bias):
    """A layer's resident blobs re-laid in place: matrices decode as before bit for bit, BF16
    matrices, bias slots and absent experts' bytes untouched, the way back restores the arena."""
    ex = random_expert_set(4, 64, 96, *fmts, seed=3, absent=(2,), bias=bias)
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
