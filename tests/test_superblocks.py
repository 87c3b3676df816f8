"""The super-block word path of the decode-once kernel (strata.kernels.decode.superblocks through
decode_matrix_into) against the torch reference and the byte path, bit for bit.

Raw blocks straight into an arena (random valid blocks, and the code sweep under every edge
scale), outputs poisoned with NaN, an idle expert (dst_slot -1) that must stay untouched, odd
row counts, rows of an odd number of 210/110-byte blocks (Q6_K/Q3_K super-blocks then start 2
bytes off a word every other row), several super-blocks a program with a masked last one.
"""
import pytest
import torch

from strata.blob import MatrixSlot, align_up
from strata.experts import ExpertSet
from strata.formats import dequantize, get_format
from strata.kernels.decode.superblocks import SUPERBLOCK_FORMATS, superblock_words_fit
from strata.kernels.moe.expert_dequant import decode_launch, decode_matrix_into
from strata.kernels.moe.tiles import TileConfig, pin_tile
from blocks import code_sweep_blocks, random_blocks

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


def _experts(fmt, raws, device):
    """ExpertSet whose expert e's matrix is raws[e] (uint8 [rows, row_bytes]); blobs land in
    the arena in reverse order, so a kernel ignoring the slot table reads the wrong one."""
    size = align_up(raws[0].numel())
    arena = torch.zeros(len(raws) * size, dtype=torch.uint8)
    slot = torch.empty(len(raws), dtype=torch.int64)
    for e, raw in enumerate(raws):
        pos = len(raws) - 1 - e
        arena[pos * size:pos * size + raw.numel()] = raw.reshape(-1)
        slot[e] = pos * size
    return ExpertSet(arena.to(device), slot.to(device), None)


def _decode(fmt, raws, rows, cols, device="cpu", **pin):
    """bf16 [E, rows, cols] from decode_matrix_into (expert 1 idle: dst_slot -1), NaN-poisoned;
    expert 0's blob sits after expert 1's (see _experts)."""
    experts = _experts(fmt, raws, device)
    mat = MatrixSlot("gate", fmt, rows, cols, 0, raws[0].numel())
    E = len(raws)
    out = torch.full((E, rows, cols), float("nan"), dtype=torch.bfloat16, device=device)
    step = rows * cols * 2
    dst_slot = torch.tensor([-1 if e == 1 else e * step for e in range(E)], device=device)
    with pin_tile(**pin):
        decode_matrix_into(experts, mat, dst_slot, out.view(torch.uint8).view(-1), 0)
    return out


def _want(fmt, raw):
    return dequantize(raw.cpu(), fmt).to(torch.bfloat16)


def _check(fmt, raws, rows, cols, device="cpu", wants=None, **pin):
    """decode_matrix_into == the torch reference (wants: precomputed, expert 1's ignored)."""
    got = _decode(fmt, raws, rows, cols, device, **pin).cpu()
    for e, raw in enumerate(raws):
        if e == 1:
            assert torch.isnan(got[1].float()).all(), "an idle expert must not be written"
            continue
        want = _want(fmt, raw) if wants is None else wants[e]
        bad = (got[e].view(torch.int16) != want.view(torch.int16)).nonzero()
        assert len(bad) == 0, (f"{fmt.name} {pin}: {len(bad)} of {want.numel()} differ, first "
                               f"at {bad[0].tolist()}: got {got[e][tuple(bad[0])].item()!r} "
                               f"want {want[tuple(bad[0])].item()!r}")
    return got


def _raws(fmt, rows, cols, seed, n=2):
    gen = torch.Generator().manual_seed(seed)
    return [random_blocks(fmt, rows * cols // 256, gen).reshape(rows, fmt.row_bytes(cols))
            for _ in range(n)]


@pytest.mark.parametrize("name", SUPERBLOCK_FORMATS)
def test_superblock_path_matches_reference(name):
    """Random valid blocks, 5 rows (the default tile's 32 rows mask 27), 2 super-blocks a row
    (the default tile's 2); the tile pinned to
    4 rows x 2 super-blocks a program over 3 rows of 3 super-blocks (the last program's second
    masked). The sweep below has rows of one block (odd rows of Q6_K/Q3_K 2 bytes off a word);
    the byte path (superblocks=False) meets the same reference in test_expert_dequant.py."""
    fmt = get_format(name)
    assert decode_launch(MatrixSlot("gate", fmt, 5, 512, 0, 0))["SUPER"]
    _check(fmt, _raws(fmt, 5, 512, seed=1), 5, 512)
    _check(fmt, _raws(fmt, 3, 768, seed=2), 3, 768, superblock_tile=(4, 2))


@pytest.mark.parametrize("name", SUPERBLOCK_FORMATS)
def test_superblock_path_every_code_under_edge_scales(name):
    """The code sweep of tests/blocks.py (every field value, fp16 scales +-0, subnormal,
    largest...) one super-block a row: 4096 rows, odd rows 2 bytes off a word for Q6_K/Q3_K.
    Tall programs (1024 rows) keep the interpreter's program count low."""
    fmt = get_format(name)
    blocks = code_sweep_blocks(fmt)
    _check(fmt, [blocks, blocks.flip(0)], blocks.shape[0], 256, superblock_tile=(1024, 1))


def test_superblock_alignment_rule():
    # word-aligned blocks need whole-word rows from an aligned matrix start; 210/110-byte blocks
    # never are (they take the two-word path), other formats have no super-block path
    assert superblock_words_fit("Q4_K", 144, 256) is True
    assert superblock_words_fit("Q4_K", 144, 2) is False
    assert superblock_words_fit("Q6_K", 420, 0) is False
    assert superblock_words_fit("Q3_K", 440, 0) is False
    assert superblock_words_fit("Q8_0", 136, 0) is None
    assert decode_launch(MatrixSlot("gate", get_format("Q6_K"), 4, 256, 0, 840))["ALIGNED"] is False
    with pin_tile(superblocks=False):
        assert not decode_launch(MatrixSlot("gate", get_format("Q4_K"), 4, 256, 0, 576))["SUPER"]
    with pin_tile(superblock_tile=(32, 2)):
        lc = decode_launch(MatrixSlot("gate", get_format("Q4_K"), 4, 256, 0, 576))
        assert (lc["BN"], lc["BK"]) == (32, 512)


def test_superblock_tile_is_validated():
    from strata.errors import StrataError
    for bad in ((3, 1), (32, 0), [32, 1], (32,)):
        with pytest.raises(StrataError, match="superblock_tile"):
            TileConfig(16, 64, 64, 4, 2, "dp", 1, superblock_tile=bad)


@pytest.mark.gpu
@pytest.mark.parametrize("name", SUPERBLOCK_FORMATS)
def test_superblock_path_gpu(name):
    """On the device: 1531 rows (odd, not a multiple of any tile), 3072 columns (12 super-blocks;
    Q6_K/Q3_K rows of whole words), then 2304 (9: rows alternate word parity), both paths, the
    default tile on both widths and one other tile (every tile is a compile of its own, the
    suite's time on the device; the interpreter runs the others), and the code sweep."""
    fmt = get_format(name)
    for cols, pins in ((3072, ({}, dict(superblocks=False))),
                       (2304, ({}, dict(superblock_tile=(32, 2))))):
        raws = _raws(fmt, 1531, cols, seed=cols, n=3)
        wants = [_want(fmt, r) for r in raws]
        for pin in pins:
            _check(fmt, raws, 1531, cols, "cuda", wants, **pin)
    blocks = code_sweep_blocks(fmt)
    raws = [blocks, blocks.flip(0), blocks]
    wants = [_want(fmt, r) for r in raws]
    for pin in ({}, dict(superblocks=False)):
        _check(fmt, raws, blocks.shape[0], 256, "cuda", wants, **pin)
