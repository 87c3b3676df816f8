"""The VRAM the expanded int8 path works in, and how a long prefix is cut to fit it.

Legend: T chunk tokens, H query heads, Hkv kv heads, hd head width, R scratch rows (tokens),
BN the attention tile's BLOCK_N.

    k, v   bf16 [R, Hkv, hd] each   int8 codes of up to R prefix tokens, expanded (expand.py)
    state  fp32 [T·H·(hd + 2)]      the online softmax's (acc [T, H, hd], m, l [T, H]) between
                                    launches, when the prefix's int8 tokens exceed R

Why pieces and not a scratch of the whole prefix: the staged host segment and the resident
window are both int8; expanding them whole needs 4·Hkv·hd bytes per prefix token, 512 MiB at
262,144 tokens for qwen3-30b-a3b, where a small card is short of room. Cut into pieces of R
tokens, each launch expands one piece, attends it, and hands the softmax state (acc, m, l in
fp32: stored and reloaded bit for bit) to the next; the last launch attends the chunk's own keys
and normalizes. Pieces end on multiples of BN inside a segment, so the launches visit exactly the
key tiles one launch over the whole prefix visits, in the same order: the same result bit for bit
(tests/kernels/test_chunk_attention.py). R = EXPAND_ROWS = 32768 (the resident window of the
issue's 12 GiB rig): k + v scratch 64 MiB for qwen3-30b-a3b, plus the state, 68 MB at T = 4096,
only when a prompt is longer than R. Each extra launch moves the state twice (136 MB, ~35 µs
against ~5 ms of attention over a 32K piece at T = 4096: under 1%). A shorter prompt's scratch is
its own length and needs no state.

In the plan these buffers sit in the layout's attention phase, which shares its bytes with the
expert FFN's phase: `strata plan --preset qwen3-30b-a3b --vram 12GiB --kv int8 --kv-resident
32768 --prompt-tokens 131072` (chunk 32768) needs the same bytes with them as without (attention
phase 1.2 GB with the 64 MiB of codes and the 545 MB state, the FFN phase 2.9 GB).

`expand_rows` / `needs_state` / `state_floats` are the one count: the memory plan
(strata.planning: the kv_expand_k, kv_expand_v and attn_state buffers) and the launcher read them.
`pin_expand_rows(R)` sets R for a block of code (tests cut a tiny prompt into several pieces
through the engine's own plan; a ContextVar, restored on exit).
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from strata.errors import StrataError
from strata.kernels.pins import pinned

EXPAND_ROWS = 32768     # tokens of int8 prefix expanded per launch (see the module docstring)

_ROWS: ContextVar[int | None] = ContextVar("strata_expand_rows", default=None)


@contextlib.contextmanager
def pin_expand_rows(rows: int):
    """R = `rows` instead of EXPAND_ROWS inside the block (plan and launcher alike)."""
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise StrataError(f"pin_expand_rows takes a whole number of rows >= 1, got {rows!r}")
    with pinned(_ROWS, rows):
        yield


def expand_rows(max_prompt: int) -> int:
    """R: scratch rows for prompts of up to max_prompt tokens."""
    pinned = _ROWS.get()
    return min(EXPAND_ROWS if pinned is None else pinned, max_prompt)


def needs_state(max_prompt: int) -> bool:
    """Whether a prompt of up to max_prompt tokens may need more than one launch per chunk."""
    return max_prompt > expand_rows(max_prompt)


def state_floats(n_head: int, head_dim: int) -> int:
    """fp32 values of carried state per chunk token: acc (H·hd) and m, l (H each)."""
    return n_head * (head_dim + 2)


@dataclass(frozen=True)
class AttnScratch:
    """k, v bf16 [R, Hkv, hd]; state fp32 with at least T·state_floats(H, hd) values (None: the
    prefix must fit R)."""
    k: torch.Tensor
    v: torch.Tensor
    state: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        return self.k.shape[0]

    def carried(self, T: int, H: int, hd: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(acc fp32 [T, H, hd], ml fp32 [2, T, H]) views of the state."""
        need = T * state_floats(H, hd)
        if self.state is None or self.state.numel() < need or self.state.dtype != torch.float32:
            have = None if self.state is None else (self.state.dtype, self.state.numel())
            raise StrataError(f"the prefix needs more than one launch: its scratch needs a fp32 "
                              f"state of {need} values for T={T}, H={H}, hd={hd}; got {have}")
        flat = self.state.reshape(-1)
        return (flat[:T * H * hd].view(T, H, hd), flat[T * H * hd:need].view(2, T, H))

    @classmethod
    def of(cls, Hkv: int, hd: int, rows: int, device, *, T: int = 0, H: int = 0
           ) -> "AttnScratch":
        """Fresh scratch (tests, benchmarks, a launch given none); T, H > 0 adds the state."""
        mk = dict(dtype=torch.bfloat16, device=device)
        state = (torch.empty(T * state_floats(H, hd), dtype=torch.float32, device=device)
                 if T and H else None)
        return cls(torch.empty(rows, Hkv, hd, **mk), torch.empty(rows, Hkv, hd, **mk), state)


@dataclass(frozen=True)
class Piece:
    """Tokens start..start+n of prefix segment `seg`, at scratch row `at` (None: a bf16 segment,
    read where it lies)."""
    seg: int
    start: int
    n: int
    at: int | None


def plan_pieces(segments: list[tuple[int, bool]], rows: int, block_n: int
                ) -> list[list[Piece]]:
    """segments: (length, int8) of the prefix, oldest first -> the launches, each at most two
    pieces (the kernel's two segment slots), in key order. int8 pieces share `rows` scratch
    rows per launch; a piece that stops inside its segment stops on a multiple of block_n from
    the segment's start (so the tiles are those of one launch). Always at least one launch."""
    launches: list[list[Piece]] = []
    cur: list[Piece] = []
    used = 0
    for i, (length, int8) in enumerate(segments):
        o = 0
        while o < length:
            left = length - o
            if not int8:
                n = left
            elif left <= rows - used:
                n = left
            else:
                n = (rows - used) // block_n * block_n
            if n == 0 or len(cur) == 2:
                if not cur:
                    raise StrataError(f"an int8 prefix piece needs at least BLOCK_N={block_n} "
                                      f"scratch rows; the scratch has {rows}")
                launches.append(cur)
                cur, used = [], 0
                continue
            cur.append(Piece(i, o, n, used if int8 else None))
            used += n if int8 else 0
            o += n
    launches.append(cur)
    return launches
