"""strata.kernels.dequantize (Triton, whole rows) against dequantize_torch, bit for bit."""
import pytest
import torch

from strata.errors import StrataError
from strata.formats import get_format
from strata.kernels import dequantize, dequantize_torch
from strata.kernels.dequant import DequantTiles, dequant_tiles
from blocks import assert_decoded_equal, code_sweep_blocks, random_matrix

from strata.kernels.decode import TRITON_FORMATS as FORMATS
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # e8m0 255


def assert_same(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert_decoded_equal(got.float(), want.float(), name)  # widening is exact; bits compared


@pytest.mark.parametrize("name", FORMATS)
def test_dequantize_runs_path(name):
    # the decode_tile_runs launch gives the same bits; BK 64 puts several tiles on a row
    fmt = get_format(name)
    k = 64 if fmt.block == 1 else 2 * max(fmt.block, 256)
    raw = random_matrix(fmt, 5, k, seed=8)
    tiles = DequantTiles(bn=4, bk=64, runs=True)
    got = dequantize(raw, name, torch.bfloat16, tiles=tiles)
    assert_same(got, dequantize_torch(raw, name, torch.bfloat16, tiles=tiles), name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["Q8_0", "Q4_0"])
def test_dequantize_words_path(name, dtype):
    """Q8_0/Q4_0 as aligned words (pair_tile): the same bits; rows of an odd number of pairs
    (K = 192) so pairs straddle 16-byte lines; BK 128 puts two pairs in a program."""
    fmt = get_format(name)
    raw = random_matrix(fmt, 5, 192, seed=9)
    want = dequantize_torch(raw, name, DTYPES[dtype])
    for bk in (64, 128):
        got = dequantize(raw, name, DTYPES[dtype], tiles=DequantTiles(bn=4, bk=bk, words=True))
        assert_same(got, want, name)
    # rows that are not whole 4-byte words (K = 32: one block) fall back to runs, same bits
    raw = random_matrix(fmt, 3, 32, seed=9)
    got = dequantize(raw, name, DTYPES[dtype], tiles=DequantTiles(bn=4, bk=64, words=True))
    assert_same(got, dequantize_torch(raw, name, DTYPES[dtype]), name)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", FORMATS)
def test_dequantize_matches_torch(name, dtype):
    fmt = get_format(name)
    k = 48 if fmt.block == 1 else 2 * max(fmt.block, 256)          # K not a power of two for plain
    raw = random_matrix(fmt, 5, k, seed=7).reshape(5, 1, -1)        # odd rows, a leading dim
    got = dequantize(raw, name, DTYPES[dtype])
    assert got.shape == (5, 1, k)
    assert_same(got, dequantize_torch(raw, name, DTYPES[dtype]), name)


@pytest.mark.parametrize("name", ["F16", "Q8_0", "Q4_K", "IQ3_S", "MXFP4"])
def test_dequantize_every_code_bf16(name):
    # bf16 rounding of every decodable value (ties to even included)
    fmt = get_format(name)
    k = 256 if fmt.block == 1 else fmt.block
    raw = code_sweep_blocks(fmt).reshape(-1, fmt.row_bytes(k))
    assert_same(dequantize(raw, fmt, torch.bfloat16), dequantize_torch(raw, fmt, torch.bfloat16),
                name)


def test_dequantize_empty():
    raw = torch.zeros(0, 34, dtype=torch.uint8)
    assert dequantize(raw, "Q8_0").shape == (0, 32)


def test_tile_heuristic_pinned():
    assert dequant_tiles(get_format("Q4_K"), 5, 256) == DequantTiles(bn=16, bk=256)
    assert dequant_tiles(get_format("Q8_0"), 4096, 4096) == DequantTiles(bn=8, bk=512, words=True)
    assert dequant_tiles(get_format("BF16"), 3, 48) == DequantTiles(bn=64, bk=64)


def test_dequantize_errors():
    with pytest.raises(StrataError, match="uint8 torch tensor"):
        dequantize(torch.zeros(2, 34), "Q8_0")
    with pytest.raises(StrataError, match="out_dtype"):
        dequantize(torch.zeros(2, 34, dtype=torch.uint8), "Q8_0", torch.int8)
    with pytest.raises(StrataError, match="34-byte blocks"):
        dequantize(torch.zeros(2, 36, dtype=torch.uint8), "Q8_0")
    with pytest.raises(StrataError, match="unknown block format"):
        dequantize(torch.zeros(2, 34, dtype=torch.uint8), "Q8_1")
    with pytest.raises(StrataError, match="no Triton decoder for F32"):
        dequantize(torch.zeros(2, 8, dtype=torch.uint8), "F32")
    odd = torch.zeros(35, dtype=torch.uint8)[1:].reshape(1, 34)      # storage starts mid-word
    with pytest.raises(StrataError, match="even address"):
        dequantize(odd, "Q8_0")


# every format at bf16 (the engine's dtype); the other stores on a block format and a K-quant:
# the output dtype changes only the final cast, the decoders are the same programs (GPU suite time)
GPU_CASES = [(name, "bf16") for name in FORMATS] + [
    (name, dt) for name in ("Q8_0", "Q4_K") for dt in ("fp32", "fp16")]


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", GPU_CASES)
def test_dequantize_gpu(name, dtype):
    fmt = get_format(name)
    raw = random_matrix(fmt, 1531, 3072, seed=2).cuda()
    want = dequantize_torch(raw.cpu(), name, DTYPES[dtype])
    for runs, words in ((False, False), (True, False), (False, True)):
        tiles = DequantTiles(bn=8, bk=512, runs=runs, words=words)
        got = dequantize(raw, name, DTYPES[dtype], tiles=tiles)
        assert_same(got.cpu(), want, name)
    assert_same(dequantize_torch(raw, name, DTYPES[dtype]).cpu(), want, name)  # torch on CUDA
