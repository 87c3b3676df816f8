"""One expert's blob: its gate, up and down matrices back to back, each 256-byte aligned.

Shapes: gate and up are [F, D] (F outputs over D inputs), down is [D, F]; each row-major by
output feature in its own block format, exactly as GGUF stores `ffn_{gate,up,down}_exps`.
"""
from __future__ import annotations

from dataclasses import dataclass

from strata.formats.table import Format, get_format

ALIGN = 256


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class MatrixSlot:
    name: str       # "gate" | "up" | "down"
    fmt: Format
    rows: int       # output features
    cols: int       # inputs
    offset: int     # bytes from the blob's start (256-aligned)
    nbytes: int

    @property
    def row_bytes(self) -> int:
        return self.fmt.row_bytes(self.cols)


@dataclass(frozen=True)
class BlobLayout:
    """Where each matrix of one expert sits inside its blob. `size` is 256-aligned."""
    d_model: int
    d_expert: int
    gate: MatrixSlot
    up: MatrixSlot
    down: MatrixSlot
    size: int

    @classmethod
    def make(cls, d_model: int, d_expert: int, gate, up=None, down=None) -> "BlobLayout":
        """Layout for D=d_model, F=d_expert; `up`/`down` default to the gate's format."""
        fg = get_format(gate)
        fu = get_format(up if up is not None else fg)
        fd = get_format(down if down is not None else fg)
        off = 0
        mats = []
        for name, fmt, rows, cols in (("gate", fg, d_expert, d_model), ("up", fu, d_expert, d_model),
                                      ("down", fd, d_model, d_expert)):
            nbytes = fmt.nbytes(rows, cols)
            mats.append(MatrixSlot(name, fmt, rows, cols, off, nbytes))
            off = align_up(off + nbytes)
        return cls(d_model, d_expert, *mats, size=off)

    @property
    def matrices(self) -> tuple[MatrixSlot, MatrixSlot, MatrixSlot]:
        return (self.gate, self.up, self.down)

    def to_dict(self) -> dict:
        return {"d_model": self.d_model, "d_expert": self.d_expert, "size": self.size,
                **{m.name: {"format": m.fmt.name, "rows": m.rows, "cols": m.cols,
                            "offset": m.offset, "nbytes": m.nbytes} for m in self.matrices}}

    @classmethod
    def from_dict(cls, d: dict) -> "BlobLayout":
        lay = cls.make(d["d_model"], d["d_expert"], d["gate"]["format"], d["up"]["format"],
                       d["down"]["format"])
        if lay.to_dict() != d:
            from strata.errors import StrataError
            raise StrataError(f"blob layout in metadata disagrees with the formats it names: "
                              f"{d} vs {lay.to_dict()}")
        return lay
