"""strata.formats.dequantize / quantize against gguf-py (the oracle) and ggml's Q2_0, bitwise."""
import gguf
import numpy as np
import pytest
import torch
from hypothesis import example, given, strategies as st
from hypothesis.extra import numpy as hnp

from strata.errors import StrataError
from strata.formats import FORMATS, dequantize, get_format, quantize
from blocks import (EDGE_F16, assert_decoded_equal, code_sweep_blocks, random_blocks,
                    random_matrix, same_bits, set16, set_nibble16, set_scales)

# gguf-py 0.19 decodes every strata format but Q2_0 (ggml type 42, newer than gguf-py)
GGUF_DECODES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K",
                "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS",
                "IQ1_S", "IQ1_M", "MXFP4"]
GGUF_ENCODES = ["BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4"]

# gguf-py's own MXFP4 decode overflows to inf for e8m0 = 255 (so does ggml's); not a failure
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in multiply:RuntimeWarning")


def gguf_dequantize(raw: torch.Tensor, name: str) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[name]))


def gguf_quantize(x: np.ndarray, name: str) -> np.ndarray:
    return gguf.quants.quantize(x, gguf.GGMLQuantizationType[name])


# ---------------------------------------------------------------- Q2_0: numpy reference from SPEC

def q2_0_quantize_np(x: np.ndarray) -> np.ndarray:
    """ggml quantize_row_q2_0_ref, written from the layout: d = max|w| over 64 (fp32),
    q = clamp(roundf(w * (1/d)) + 1, 0, 3) with roundf halves away from zero, 1/d = 0 when d = 0;
    a non-finite w/d (subnormal d: C undefined, stored d is 0) stores code 1."""
    blocks = x.astype(np.float32).reshape(-1, 64)
    d = np.abs(blocks).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
        t = (blocks * inv).astype(np.float64)
    ok = np.isfinite(t)
    t = np.where(ok, t, 0.0)
    r = np.where(t >= 0, np.floor(t + 0.5), -np.floor(-t + 0.5))      # exact in float64
    q = np.where(ok, np.clip(r + 1, 0, 3), 1).astype(np.uint8).reshape(-1, 16, 4)
    qs = q[..., 0] | (q[..., 1] << 2) | (q[..., 2] << 4) | (q[..., 3] << 6)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), qs], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // 64 * 18)


def q2_0_dequantize_np(raw: np.ndarray) -> np.ndarray:
    """ggml dequantize_row_q2_0: w_j = ((qs[j/4] >> 2*(j%4)) & 3) - 1) * d."""
    blocks = raw.reshape(-1, 18)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    j = np.arange(64)
    q = (blocks[:, 2 + j // 4] >> (2 * (j % 4))) & 3
    out = (q.astype(np.int32) - 1).astype(np.float32) * d
    return out.reshape(*raw.shape[:-1], raw.shape[-1] // 18 * 64)


def oracle_dequantize(raw: torch.Tensor, name: str) -> torch.Tensor:
    if name == "Q2_0":
        return torch.from_numpy(q2_0_dequantize_np(raw.numpy()))
    return gguf_dequantize(raw, name)


DECODES = GGUF_DECODES + ["Q2_0"]


# ---------------------------------------------------------------- dequantize

@pytest.mark.parametrize("name", DECODES)
def test_dequantize_random_blocks(name):
    fmt = get_format(name)
    raw = random_matrix(fmt, 7, 4 * max(fmt.block, 32), seed=3)
    assert_decoded_equal(dequantize(raw, name), oracle_dequantize(raw, name), name)


@pytest.mark.parametrize("name", DECODES)
def test_dequantize_every_code_under_edge_scales(name):
    raw = code_sweep_blocks(name)
    assert_decoded_equal(dequantize(raw, name), oracle_dequantize(raw, name), name)


def test_iq3_s_every_grid_point():
    # each of the 512 grid indices (qs low byte + qh high bit), both signs, every scale nibble
    fmt = get_format("IQ3_S")
    idx = torch.arange(512)
    raw = torch.zeros(512, fmt.block_bytes, dtype=torch.uint8)
    set16(raw, 0, EDGE_F16["one"])
    raw[:, 2:66] = (idx & 255)[:, None].to(torch.uint8)
    raw[:, 66:74] = torch.where(idx >= 256, 255, 0)[:, None].to(torch.uint8)
    raw[:, 74:106] = torch.where(idx % 2 == 1, 0xAA, 0x55)[:, None].to(torch.uint8)
    raw[:, 106:110] = (idx % 256)[:, None].to(torch.uint8)
    assert same_bits(dequantize(raw, fmt), gguf_dequantize(raw, "IQ3_S"))


def _u16s(raw: torch.Tensor, off: int, u: torch.Tensor) -> None:
    """Write u16 words u [n, m] little-endian from byte `off` of blocks raw [n, bytes]."""
    for j in range(u.shape[1]):
        set16(raw, off + 2 * j, u[:, j])


def grid_sweep(name: str) -> torch.Tensor:
    """Blocks in which the grid index of point g of block b is 32 b + g (64 per IQ3_XXS block,
    8-bit indices repeat): every grid point of the format, with random signs; one sub-block scale
    and a + delta throughout, so the |weights| of distinct points differ; fp16 d 'one'.
    Layouts written from gguf-py's dequantize_blocks."""
    fmt = get_format(name)
    points = {"IQ2_XXS": 256, "IQ2_XS": 512, "IQ2_S": 1024, "IQ3_XXS": 256, "IQ1_S": 2048,
              "IQ1_M": 2048}[name]
    per = 64 if name == "IQ3_XXS" else 32
    nb = points // per
    gen = torch.Generator().manual_seed(5)
    raw = random_blocks(fmt, nb, gen)                      # random signs / scales elsewhere
    idx = torch.arange(nb * per, dtype=torch.int32).reshape(nb, per) % points
    if name == "IQ2_XXS":                                  # first u32 of each pair: 4 index bytes
        pairs = raw[:, 2:66].reshape(nb, 8, 8)
        pairs[:, :, :4] = idx.reshape(nb, 8, 4).to(torch.uint8)
        pairs[:, :, 7] = (pairs[:, :, 7] & 0x0F) | 0x50    # scale 5 (bits 28..31)
        raw[:, 2:66] = pairs.reshape(nb, 64)
    elif name == "IQ2_XS":                                 # u16: 9-bit index | 7-bit signs
        _u16s(raw, 2, idx | ((idx * 37 % 128) << 9))
        raw[:, 66:74] = 0x55
    elif name == "IQ2_S":                                  # qs low byte, 2 bits in qh[g//4]
        raw[:, 2:34] = (idx & 255).to(torch.uint8)
        hi = (idx >> 8).reshape(nb, 8, 4) << torch.tensor([0, 2, 4, 6])
        raw[:, 66:74] = hi.sum(dim=2).to(torch.uint8)
        raw[:, 74:82] = 0x55
    elif name == "IQ3_XXS":
        raw[:, 2:66] = idx.to(torch.uint8)
        words = raw[:, 66:98].reshape(nb, 8, 4)
        words[:, :, 3] = (words[:, :, 3] & 0x0F) | 0x50    # scale 5 (bits 28..31)
        raw[:, 66:98] = words.reshape(nb, 32)
    elif name == "IQ1_S":                                  # qs low byte, 3 bits in qh[g//4]
        raw[:, 2:34] = (idx & 255).to(torch.uint8)
        hi = ((idx >> 8).reshape(nb, 8, 4) << torch.tensor([0, 3, 6, 9])).sum(dim=2)
        _u16s(raw, 34, 0x5000 | hi)                        # scale 5, delta +
    elif name == "IQ1_M":                                  # qs low byte, 3 bits per qh nibble
        raw[:, 0:32] = (idx & 255).to(torch.uint8)
        lo, hi = (idx >> 8)[:, 0::2], (idx >> 8)[:, 1::2]
        raw[:, 32:48] = (lo | (hi << 4)).to(torch.uint8)   # delta bits (3, 7) clear: +
        raw[:, 48:56] = torch.where(torch.arange(8) % 2 == 1, 0x20, 0x49).to(torch.uint8)
    set_scales(raw, fmt, EDGE_F16["one"])
    return raw


@pytest.mark.parametrize("name", ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ1_S", "IQ1_M"])
def test_every_grid_point(name):
    raw = grid_sweep(name)
    assert_decoded_equal(dequantize(raw, name), gguf_dequantize(raw, name), name)
    # one scale and one delta throughout: distinct |groups| are distinct points, so a layout
    # slip above (indices not reaching their high bits) shows as too few
    width = 4 if name == "IQ3_XXS" else 8
    groups = gguf_dequantize(raw, name).abs().reshape(-1, width)
    assert len(torch.unique(groups, dim=0)) == raw.shape[0] * (64 if name == "IQ3_XXS" else 32)


fp16_bits = st.one_of(st.sampled_from(sorted(EDGE_F16.values())),
                      st.integers(0, 0xFFFF).filter(lambda u: (u & 0x7C00) != 0x7C00))


@st.composite
def blocks_with_scales(draw, name):
    fmt = get_format(name)
    n = draw(st.integers(1, 4))
    raw = torch.tensor(draw(hnp.arrays(np.uint8, (n, fmt.block_bytes))))
    for off in fmt.fp16_fields if fmt.block > 1 else ():
        set16(raw, off, draw(st.lists(fp16_bits, min_size=n, max_size=n)))
    if fmt.f16_nibbles is not None:
        set_nibble16(raw, fmt.f16_nibbles, draw(st.lists(fp16_bits, min_size=n, max_size=n)))
    if fmt.block == 1:
        raw = raw.reshape(1, -1)
    return raw


@pytest.mark.parametrize("name", DECODES)
@given(data=st.data())
def test_dequantize_property(name, data):
    raw = data.draw(blocks_with_scales(name))
    assert_decoded_equal(dequantize(raw, name), oracle_dequantize(raw, name), name)


def test_dequantize_keeps_leading_dims_and_accepts_numpy():
    raw = random_matrix("Q4_K", 6, 512, seed=9).reshape(2, 3, -1)
    got = dequantize(raw.numpy(), "q4_k")                               # numpy in, name lowercase
    assert got.shape == (2, 3, 512) and got.dtype == torch.float32
    assert same_bits(got, gguf_dequantize(raw, "Q4_K"))
    f16 = torch.randn(3, 8).half()
    assert same_bits(dequantize(f16, gguf.GGMLQuantizationType.F16), f16.float())


# ---------------------------------------------------------------- quantize

weights = hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.just(64)),
                     elements=st.floats(-1e4, 1e4, width=32, allow_subnormal=True))


@pytest.mark.parametrize("name", GGUF_ENCODES)
@given(x=weights)
@example(x=np.zeros((1, 64), np.float32))                              # d == 0: 1/d must be 0
@example(x=np.tile(np.float32([3, -3]), (1, 32)))                      # |max| tie: first wins
@example(x=np.float32([[1e-40] * 64]))                                 # subnormal amax
@example(x=np.float32([[7e4] + [1] * 63]))                             # fp16 d overflows to inf
@example(x=np.float32([[np.nextafter(np.float32(8), 0)] + [0.5] * 63]))  # amax just under 2**k
@example(x=np.float32([[(i - 32) / 4 for i in range(64)]]))           # exact .5 ties in x/d
def test_quantize_matches_gguf(name, x):
    if name in ("Q4_1", "Q5_1"):
        # -0 -> +0: which zero numpy's min/max reduction returns when a block holds both depends
        # on its SIMD order; ggml's rule for that case is test_quantize_affine_zero_signs
        x = x + np.float32(0)
    with np.errstate(all="ignore"):
        want = gguf_quantize(x, name)
    assert np.array_equal(quantize(x, name).numpy(), want)


def ggml_affine_quantize_np(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml quantize_row_q{4,5}_1_ref's min/max loop and codes, for one block [32]:
    (d, m as fp16 bits, codes)."""
    mn, mx = np.float32(np.finfo(np.float32).max), np.float32(-np.finfo(np.float32).max)
    for v in x:
        mn = v if v < mn else mn
        mx = v if v > mx else mx
    d = np.float32((mx - mn) / np.float32(levels))
    inv = np.float32(0) if d == 0 else np.float32(1) / d
    q = np.clip(np.trunc((x - mn) * inv + np.float32(0.5)), 0, levels).astype(np.int32)
    return np.float16(d).view(np.uint16), np.float16(mn).view(np.uint16), q


@pytest.mark.parametrize("name, levels", [("Q4_1", 15), ("Q5_1", 31)])
@pytest.mark.parametrize("signs", [(0, 1), (1, 0), (1, 1), (0, 0)])
def test_quantize_affine_zero_signs(name, levels, signs):
    # a block of zeros of both signs (the first zero's sign is the one ggml keeps), and a block
    # whose min is a signed zero beside positive weights
    z = [np.float32(-0.0) if s else np.float32(0.0) for s in signs]
    for block in (np.array(z * 16, np.float32), np.array(z + [1.5] * 30, np.float32)):
        raw = quantize(block[None, :], name)[0].numpy()
        d, m, q = ggml_affine_quantize_np(block, levels)
        assert raw[:4].view(np.uint16).tolist() == [d, m]
        got_q = dequantize(torch.from_numpy(raw[None]), name)   # w = d*q + m with q decoded
        want = np.float32(np.float16(d.view(np.float16))) * q.astype(np.float32) + \
            np.float32(m.view(np.float16))
        assert same_bits(got_q[0], torch.from_numpy(want.astype(np.float32)))


@given(x=weights)
@example(x=np.zeros((1, 64), np.float32))                              # d == 0
@example(x=np.float32([[1e-40] * 64]))                                 # subnormal amax: 1/d = inf
@example(x=np.float32([[(i - 32) / 64 for i in range(64)]]))           # halves: away from zero
def test_quantize_q2_0_matches_ggml_reference(x):
    raw = quantize(x, "Q2_0")
    assert np.array_equal(raw.numpy(), q2_0_quantize_np(x))
    # in-range weights never take code 3 (+2d), and decoding is the SPEC formula
    codes = (raw[:, 2:].to(torch.int32)[..., None] >> torch.tensor([0, 2, 4, 6])) & 3
    assert int(codes.max()) <= 2
    assert same_bits(dequantize(raw, "Q2_0"), torch.from_numpy(q2_0_dequantize_np(raw.numpy())))


def test_quantize_bf16_specials_match_gguf():
    # NaNs forced quiet (payload kept in the top bits), infinities kept, the largest finite
    # fp32 rounding up to inf, a tie to even either way
    bits = np.array([0x7FC00000, 0xFFC00001, 0x7F800001, 0x7F800000, 0xFF800000, 0x7F7FFFFF,
                     0x3F808000, 0x3F818000, 0x00000001, 0x80000000], dtype=np.uint32)
    x = np.resize(bits, 32).view(np.float32).reshape(1, 32)
    assert np.array_equal(quantize(x, "BF16").numpy(), gguf_quantize(x, "BF16"))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 65520 -> inf
def test_quantize_f16_matches_numpy():
    x = np.float32([[1e5, -1e-8, 0.1, 65519, 65520, np.inf, -0.0, 3.14159]])
    want = gguf_quantize(x, "F16").view(np.uint8)                       # gguf-py: astype(float16)
    assert np.array_equal(quantize(x, "F16").numpy(), want)


def test_chunked_calls_agree(monkeypatch):
    # tensors larger than CHUNK_BLOCKS go through the family functions in pieces
    from strata.formats import codec
    x = torch.randn(10, 256, generator=torch.Generator().manual_seed(4))
    whole_q, whole_d = quantize(x, "MXFP4"), dequantize(random_matrix("Q4_K", 10, 256), "Q4_K")
    monkeypatch.setattr(codec, "CHUNK_BLOCKS", 3)
    assert torch.equal(quantize(x, "MXFP4"), whole_q)
    assert same_bits(dequantize(random_matrix("Q4_K", 10, 256), "Q4_K"), whole_d)


def test_quantize_shapes():
    x = torch.randn(2, 3, 256)
    for name in ["BF16", "F16", "Q8_0", "Q4_0", "Q5_0", "Q2_0", "MXFP4"]:
        fmt = get_format(name)
        assert quantize(x, name).shape == (2, 3, fmt.row_bytes(256)), name


# ---------------------------------------------------------------- errors

def test_errors_are_clear():
    with pytest.raises(StrataError, match="34-byte blocks"):
        dequantize(torch.zeros(2, 35, dtype=torch.uint8), "Q8_0")
    with pytest.raises(StrataError, match="unknown block format"):
        dequantize(torch.zeros(2, 34, dtype=torch.uint8), "Q9_0")
    with pytest.raises(StrataError, match="not a format strata reads"):
        dequantize(torch.zeros(2, 34, dtype=torch.uint8), gguf.GGMLQuantizationType.TQ2_0)
    with pytest.raises(StrataError, match="multiple of 32"):
        quantize(torch.zeros(2, 40), "Q8_0")
    with pytest.raises(StrataError, match="decode only"):
        quantize(torch.zeros(2, 256), "Q4_K")
    with pytest.raises(StrataError, match="floating-point"):
        quantize(torch.zeros(2, 32, dtype=torch.int32), "Q8_0")
    with pytest.raises(StrataError, match="torch tensor or numpy array"):
        dequantize([1, 2, 3], "Q8_0")


def test_every_table_format_has_a_dequantizer():
    from strata.formats.codec import DEQUANTIZERS
    assert set(DEQUANTIZERS) == set(FORMATS)


def test_family_names_the_reference_module():
    # Format.family says where a format's torch reference lives
    from strata.formats.codec import DEQUANTIZERS
    modules = {"plain": {"plain"}, "legacy": {"legacy"}, "kquant": {"kquants"},
               "iquant": {"iquants", "iq2", "iq1"}, "mx": {"mxfp4"}}
    for f in FORMATS.values():
        assert DEQUANTIZERS[f.name].__module__.rsplit(".", 1)[1] in modules[f.family], f.name



def test_every_codec_keeps_its_input_device():
    """Every quantizer and dequantizer builds its constants on its input's device: on "meta"
    (a device with no data, which any tensor made on the CPU beside it trips) each returns a
    meta tensor. A CPU constant among CUDA weights broke `experiments/quant_quality.py`'s Q5_0
    arm on the GPU. MXFP4's encoder takes its exponents through numpy (gguf-py's float32 log2)
    and moves them back, so it needs data: it is held to the device by the CUDA test instead."""
    from strata.formats import codec
    from strata.formats.rtn import RTN_QUANTIZERS
    for name, fn in [*codec.QUANTIZERS.items(), *RTN_QUANTIZERS.items()]:
        if name == "MXFP4":
            continue
        f = get_format(name)
        assert fn(torch.empty(4, f.block, device="meta")).device.type == "meta", name
    for name, fn in codec.DEQUANTIZERS.items():
        f = get_format(name)
        raw = torch.empty(4, f.block_bytes, dtype=torch.uint8, device="meta")
        assert fn(raw).device.type == "meta", name


@pytest.mark.gpu
def test_every_codec_runs_on_cuda():
    """The same on CUDA with data, MXFP4 included: bit for bit the CPU's bytes and values."""
    from strata.formats import codec
    from strata.formats.rtn import RTN_QUANTIZERS
    gen = torch.Generator().manual_seed(0)
    for name, fn in [*codec.QUANTIZERS.items(), *RTN_QUANTIZERS.items()]:
        f = get_format(name)
        x = torch.randn(64, f.block, generator=gen)
        got = fn(x.cuda())
        assert got.is_cuda and torch.equal(got.cpu(), fn(x)), name
