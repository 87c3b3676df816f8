"""The stream word path of the decode-once kernel (MXFP4 through strata.kernels.decode.streams and
decode_matrix_into) against gguf-py, the torch reference and the byte path, bit for bit.

Raw blocks straight into an arena (random bytes: every e8m0 scale, 255's overflow to inf
included; the code sweep), outputs poisoned with NaN, an idle expert (dst_slot -1) that must
stay untouched, blobs in reverse order of the slot table. Shapes: gpt-oss's width 2880 (90
blocks, 1530-byte rows: odd rows start 2 bytes off a word), rows of 1, 3 and 5 blocks (odd row
bytes: rows start at every byte of a word), block counts that leave the last program partly
masked, matrices 4 bytes past their blob's start, a destination offset; offsets off a word take
the byte path.
"""
import gguf
import pytest
import torch

from strata.blob import MatrixSlot, align_up
from strata.errors import StrataError
from strata.experts import ExpertSet
from strata.formats import dequantize, get_format
from strata.kernels.decode.streams import STREAM_FORMATS, stream_words_fit
from strata.kernels.moe.expert_dequant import decode_launch, decode_matrix_into
from strata.kernels.moe.tiles import DEFAULT_STREAM_BLOCKS, TileConfig, pin_tile
from blocks import code_sweep_blocks
from tests.kernels.compiled import compile_lines

# random e8m0 = 255 (and 254) scales overflow to inf in gguf-py as in ggml and here
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

BYTES = dict(streams=False)   # the byte path, for the A/B
STREAMS = dict(streams=True)  # the stream path, pinned (the default since its H100 run)


def _raws(fmt, rows, cols, seed, n=3):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (rows, fmt.row_bytes(cols)), generator=gen,
                          dtype=torch.int32).to(torch.uint8) for _ in range(n)]


def _experts(raws, mat_off, device):
    """ExpertSet whose expert e's matrix is raws[e], mat_off bytes into its blob; blobs land in
    the arena in reverse order, so a kernel ignoring the slot table reads the wrong one."""
    size = align_up(mat_off + raws[0].numel())
    arena = torch.zeros(len(raws) * size, dtype=torch.uint8)
    slot = torch.empty(len(raws), dtype=torch.int64)
    for e, raw in enumerate(raws):
        at = (len(raws) - 1 - e) * size
        arena[at + mat_off:at + mat_off + raw.numel()] = raw.reshape(-1)
        slot[e] = at
    return ExpertSet(arena.to(device), slot.to(device), None)


def _decode(fmt, raws, rows, cols, device="cpu", mat_off=0, dst_off=0, **pin):
    """bf16 [E, rows, cols] from decode_matrix_into (expert 1 idle: dst_slot -1), NaN-poisoned,
    written dst_off bytes into the destination; (output, the launch it took)."""
    experts = _experts(raws, mat_off, device)
    mat = MatrixSlot("gate", fmt, rows, cols, mat_off, raws[0].numel())
    E = len(raws)
    flat = torch.full((dst_off // 2 + E * rows * cols,), float("nan"), dtype=torch.bfloat16,
                      device=device)
    step = rows * cols * 2
    dst_slot = torch.tensor([-1 if e == 1 else e * step for e in range(E)], device=device)
    with pin_tile(**{**STREAMS, **pin}):
        lc = decode_launch(mat)
        decode_matrix_into(experts, mat, dst_slot, flat.view(torch.uint8), dst_off)
    assert torch.isnan(flat[:dst_off // 2].float()).all(), "wrote before dst_off"
    return flat[dst_off // 2:].view(E, rows, cols).cpu(), lc


def _gguf(fmt, raw):
    w = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[fmt.name])
    return torch.from_numpy(w).to(torch.bfloat16)


def _same(got, want, what):
    bad = (got.view(torch.int16) != want.view(torch.int16)).nonzero()
    assert len(bad) == 0, (f"{what}: {len(bad)} of {want.numel()} differ, first at "
                           f"{bad[0].tolist()}: got {got[tuple(bad[0])].item()!r} "
                           f"want {want[tuple(bad[0])].item()!r}")


def _check(fmt, raws, rows, cols, device="cpu", wants=None, stream=True, **kw):
    """The stream path (`stream`: else the byte path, the offsets being off a word) == gguf-py
    == the torch reference == the byte path, bit for bit; expert 1 untouched."""
    got, lc = _decode(fmt, raws, rows, cols, device, **kw)
    assert lc["STREAM"] is stream
    byte, lc_b = _decode(fmt, raws, rows, cols, device, **kw, **BYTES)
    assert not lc_b["STREAM"]
    for e, raw in enumerate(raws):
        if e == 1:
            assert torch.isnan(got[1].float()).all(), "an idle expert must not be written"
            assert torch.isnan(byte[1].float()).all(), "an idle expert must not be written"
            continue
        want = _gguf(fmt, raw) if wants is None else wants[e]
        _same(got[e], want, f"{fmt.name} {lc} vs gguf-py")
        _same(byte[e], want, f"{fmt.name} byte path vs gguf-py")
        if wants is None:
            _same(dequantize(raw, fmt).to(torch.bfloat16), want, "reference vs gguf-py")


@pytest.mark.parametrize("name", STREAM_FORMATS)
def test_stream_path_gpt_oss_width(name):
    """gpt-oss's experts are 2880 x 2880 (1530-byte rows, odd rows 2 bytes off a word); 3 rows
    are 270 blocks: the default program's 256 and a second one masked but for 14."""
    fmt = get_format(name)
    assert 2880 % 128 and fmt.row_bytes(2880) % 4 == 2
    _check(fmt, _raws(fmt, 3, 2880, seed=1), 3, 2880)


@pytest.mark.parametrize("name", STREAM_FORMATS)
@pytest.mark.parametrize("cols", [32, 96, 160, 64 * 32])
def test_stream_path_any_row_length(name, cols):
    """Rows of 1, 3, 5 blocks (odd row bytes: row starts fall on every byte of a word) and of 64;
    programs of 16 blocks, the last one partly masked (7 rows: 7, 21, 35, 448 blocks)."""
    fmt = get_format(name)
    _check(fmt, _raws(fmt, 7, cols, seed=cols), 7, cols, stream_blocks=16)


@pytest.mark.parametrize("name", STREAM_FORMATS)
def test_stream_path_offsets(name):
    """A matrix 4 bytes into its blob (on a word, not 16-aligned) and a destination 48 bytes in
    take the stream path; 2 and 1 bytes in, the byte path, with the same bits."""
    fmt = get_format(name)
    raws = _raws(fmt, 5, 96, seed=3)
    _check(fmt, raws, 5, 96, mat_off=4, dst_off=48, stream_blocks=16)
    for off in (2, 1):
        _check(fmt, raws, 5, 96, stream=False, mat_off=off)


@pytest.mark.parametrize("name", STREAM_FORMATS)
def test_stream_path_every_code_under_every_scale(name):
    """The code sweep of tests/blocks.py (each e8m0 scale 0..255 under every nibble pattern),
    one block a row, then the same blocks as rows of 8 blocks (block order within rows)."""
    fmt = get_format(name)
    blocks = code_sweep_blocks(fmt)                                     # [512, 17]
    _check(fmt, [blocks, blocks.flip(0)], blocks.shape[0], 32, stream_blocks=128)
    rows = blocks.reshape(64, 8 * fmt.block_bytes)
    _check(fmt, [rows, rows.flip(0)], 64, 256)


def test_stream_rule():
    """One statement of the precondition (stream_words_fit); streams=True turns the path on;
    stream_blocks is the program's size."""
    assert stream_words_fit("MXFP4", 0) and stream_words_fit("MXFP4", 4)
    assert not stream_words_fit("MXFP4", 2) and not stream_words_fit("MXFP4", 1)
    assert not stream_words_fit("Q4_0", 0) and not stream_words_fit("Q4_K", 0)
    mat = MatrixSlot("gate", get_format("MXFP4"), 2880, 2880, 0, 2880 * 1530)
    assert decode_launch(mat)["STREAM"]              # on by default (tiles.DEFAULT_STREAMS)
    with pin_tile(streams=False):
        assert not decode_launch(mat)["STREAM"]      # the byte path, pinned
    with pin_tile(**STREAMS):
        lc = decode_launch(mat)
    assert lc["STREAM"] and (lc["BN"], lc["BK"]) == (DEFAULT_STREAM_BLOCKS, 32)
    with pin_tile(**STREAMS, stream_blocks=64):
        assert decode_launch(mat)["BN"] == 64
    for bad in (8, 48, 64.0, True, "256"):
        with pytest.raises(StrataError, match="stream_blocks"):
            TileConfig(16, 64, 64, 4, 2, "dp", 1, stream_blocks=bad)


def test_stream_path_compiles_for_h100():
    """The decode-once kernel's MXFP4 variants (bytes; the stream at the default program and
    at 64 blocks) compile for sm_90 with triton's passes and its ptxas (no GPU), no spills."""
    lines, out = compile_lines("compile_moe.py", "--decode-once", *STREAM_FORMATS, timeout=600)
    streams = [ln for ln in lines if "stream blocks=" in ln]
    assert len(streams) == 2 * len(STREAM_FORMATS), out
    for line in streams:
        assert "spill 0/0" in line, line


@pytest.mark.gpu
@pytest.mark.parametrize("name", STREAM_FORMATS)
def test_stream_path_gpu(name):
    """On the device: gpt-oss's 2880 x 2880 at the default program, then 1531 rows of 3 blocks
    (odd row bytes, a ragged last program) at 64 blocks a program and a matrix 4 bytes in;
    both paths against the torch reference (gguf-py on the CPU tests: the same bits)."""
    fmt = get_format(name)
    for rows, cols, kw in ((2880, 2880, {}), (1531, 96, dict(stream_blocks=64, mat_off=4))):
        raws = _raws(fmt, rows, cols, seed=rows, n=3)
        wants = [dequantize(r, fmt).to(torch.bfloat16) for r in raws]
        _check(fmt, raws, rows, cols, "cuda", wants, **kw)
