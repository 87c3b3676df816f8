"""The tile heuristic: deterministic, pinnable, and the pin always restored."""
import pytest

from strata.errors import StrataError
from strata.kernels.moe.tiles import GemmProblem, TileConfig, choose_tile, pin_tile, resolve_tile

QWEN = dict(top_k=8, n_expert=128, d_model=2048, d_expert=768, n_sms=132)


@pytest.mark.parametrize("T", [1, 37, 512, 2048, 8192, 32768], ids=lambda t: f"T{t}")
def test_choice_is_deterministic_and_valid(T):
    p = GemmProblem(T, **QWEN)
    a, b = choose_tile(p), choose_tile(p)
    assert a == b and a.schedule in ("dp", "stream_k") and a.programs == 132
    # taller blocks as experts get more rows, never above 128
    assert 16 <= a.BLOCK_M <= 128


def test_block_m_follows_rows_per_expert():
    small = choose_tile(GemmProblem(64, **QWEN))       # 4 rows per expert
    big = choose_tile(GemmProblem(32768, **QWEN))      # 2048 rows per expert
    assert small.BLOCK_M == 16 and big.BLOCK_M == 128


def test_schedule_follows_the_wave_count():
    # 32768 tokens: dozens of waves on 132 SMs, the partial last one is a small share -> dp
    assert choose_tile(GemmProblem(32768, **QWEN)).schedule == "dp"
    # 2 assignments -> 2 row blocks x 1 column tile on 5 SMs: a lone partial wave -> stream-k
    tiny = GemmProblem(2, top_k=1, n_expert=4, d_model=64, d_expert=64, n_sms=5)
    assert choose_tile(tiny).schedule == "stream_k"
    # exactly full waves: nothing to balance
    full = GemmProblem(16, top_k=1, n_expert=1, d_model=128, d_expert=128, n_sms=2)
    assert choose_tile(full).schedule == "dp"


def test_decoded_formats_take_narrower_tiles_when_tall():
    p = GemmProblem(8192, **QWEN)
    assert choose_tile(p).BLOCK_N == 128
    assert choose_tile(GemmProblem(8192, **QWEN, decoded=True)).BLOCK_N == 64
    # BM = 64 (seed-512e at T = 2048): bf16 128 wide, decoded 64 (tiles.py's sweep note)
    seed = dict(top_k=10, n_expert=512, d_model=2560, d_expert=640, n_sms=132)
    assert choose_tile(GemmProblem(2048, **seed)).BLOCK_N == 128
    assert choose_tile(GemmProblem(2048, **seed, decoded=True)).BLOCK_N == 64


def test_pin_restores_previous_choice():
    p = GemmProblem(512, **QWEN)
    base = resolve_tile(p)
    forced = TileConfig(32, 64, 64, 4, 2, "stream_k", 7)
    with pin_tile(forced):
        assert resolve_tile(p) == forced
        with pin_tile(schedule="dp"):
            assert resolve_tile(p).schedule == "dp"
        assert resolve_tile(p) == forced
        assert resolve_tile(p, "dp") == forced.with_(schedule="dp")   # per-call schedule wins
    assert resolve_tile(p) == base
    with pytest.raises(RuntimeError):
        with pin_tile(BLOCK_N=32):
            raise RuntimeError("boom")
    assert resolve_tile(p) == base


def test_bad_tiles_are_clear():
    with pytest.raises(StrataError, match="power of two"):
        TileConfig(24, 64, 64, 4, 2, "dp", 1)
    with pytest.raises(StrataError, match="schedule"):
        TileConfig(32, 64, 64, 4, 2, "splitk", 1)
    with pytest.raises(StrataError, match="schedule must be"):
        resolve_tile(GemmProblem(4, 2, 4, 64, 32, 4), "fast")
    with pytest.raises(StrataError, match="dot must be one of"):
        TileConfig(32, 64, 64, 4, 2, "dp", 1, dot="pair")       # retired (measured slower)


def test_launch_choices_are_pinnable_data():
    """The dot variant and the decode-once word path are fields of the pinned config, restored
    on exit (no module global to assign)."""
    from strata.kernels.moe.expert_dequant import word_decode
    from strata.kernels.moe.tiles import DEFAULT_DOT, DEFAULT_WORDS, pinned_choice
    p = GemmProblem(512, **QWEN)
    assert resolve_tile(p).dot == DEFAULT_DOT and word_decode() is DEFAULT_WORDS
    assert pinned_choice("words") is None
    with pin_tile(dot="decode", words=False):
        assert resolve_tile(p).dot == "decode"
        assert word_decode() is False
        with pin_tile(resolve_tile(p).with_(words=True, dot="scaled")):
            assert word_decode() is True and resolve_tile(p).dot == "scaled"
        assert word_decode() is False
    assert resolve_tile(p).dot == DEFAULT_DOT and word_decode() is DEFAULT_WORDS
