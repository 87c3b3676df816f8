"""One expert's blob: its gate, up and down matrices back to back, each 256-byte aligned.

Shapes: gate and up are [F, D] (F outputs over D inputs), down is [D, F]; each row-major by
output feature in its own block format, exactly as GGUF stores `ffn_{gate,up,down}_exps`.
An architecture whose experts carry biases (GPT-OSS) adds one more region after down: fp32
gate bias [F], up bias [F], down bias [D] (`BiasSlot`), so the biases stream with the expert
and every size counted from the layout (cache slots, ring, plan) includes them. The layout also
records the experts' activation (`ExpertAct`): what the expert GEMM's epilogue applies.
`bf16_layout` is the same expert decoded to BF16 (the decode-once path's blob; the planner sizes
its buffer from it too).
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


ACTS = ("silu", "swiglu_oai")


@dataclass(frozen=True)
class ExpertAct:
    """h = act(g, u) of an expert, g = gate x (+ bias), u = up x (+ bias):
    silu:       silu(g) · u
    swiglu_oai: g' · sigmoid(alpha · g') · (u' + 1),  g' = min(g, limit), u' = clamp(u, ±limit)
                (GPT-OSS's clamped SwiGLU; alpha and limit unused by silu)"""
    name: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0

    def __post_init__(self):
        if self.name not in ACTS:
            from strata.errors import StrataError
            raise StrataError(f"expert activation {self.name!r} is not one of {', '.join(ACTS)}")

    @property
    def code(self) -> int:
        """The expert GEMM's ACT constexpr."""
        return ACTS.index(self.name)


@dataclass(frozen=True)
class BiasSlot:
    """fp32 biases of one expert: gate [F] at `offset`, up [F] after it, down [D] after that."""
    offset: int     # bytes from the blob's start (256-aligned)
    d_model: int
    d_expert: int

    @property
    def nbytes(self) -> int:
        return 4 * (2 * self.d_expert + self.d_model)

    def part(self, name: str) -> tuple[int, int]:
        """(byte offset from the blob's start, element count) of the `name` bias."""
        F, D = self.d_expert, self.d_model
        return {"gate": (self.offset, F), "up": (self.offset + 4 * F, F),
                "down": (self.offset + 8 * F, D)}[name]


@dataclass(frozen=True)
class BlobLayout:
    """Where each matrix of one expert sits inside its blob. `size` is 256-aligned."""
    d_model: int
    d_expert: int
    gate: MatrixSlot
    up: MatrixSlot
    down: MatrixSlot
    size: int
    bias: BiasSlot | None = None    # the experts' biases, None when they have none
    act: ExpertAct = ExpertAct()

    @classmethod
    def make(cls, d_model: int, d_expert: int, gate, up=None, down=None, *, bias: bool = False,
             act: ExpertAct | None = None) -> "BlobLayout":
        """Layout for D=d_model, F=d_expert; `up`/`down` default to the gate's format; `bias`:
        a BiasSlot after down; `act`: the activation (default silu)."""
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
        bslot = None
        if bias:
            bslot = BiasSlot(off, d_model, d_expert)
            off = align_up(off + bslot.nbytes)
        return cls(d_model, d_expert, *mats, size=off, bias=bslot, act=act or ExpertAct())

    @classmethod
    def for_shape(cls, shape, gate, up=None, down=None) -> "BlobLayout":
        """The layout of `shape`'s experts in these formats: biases and activation as the
        architecture's shape says (strata.shapes.ModelShape). Every importer, the synthesizer
        and the planner build layouts here, so they agree on the blob size."""
        return cls.make(shape.d_model, shape.d_expert, gate, up, down,
                        bias=shape.expert_bias, act=shape.expert_act_spec)

    @property
    def plain(self) -> bool:
        """No biases and the silu activation: the FFN every path (decoded GEMM included) runs."""
        return self.bias is None and self.act == ExpertAct()

    @property
    def matrices(self) -> tuple[MatrixSlot, MatrixSlot, MatrixSlot]:
        return (self.gate, self.up, self.down)

    def to_dict(self) -> dict:
        d = {"d_model": self.d_model, "d_expert": self.d_expert, "size": self.size,
             **{m.name: {"format": m.fmt.name, "rows": m.rows, "cols": m.cols,
                         "offset": m.offset, "nbytes": m.nbytes} for m in self.matrices}}
        if self.bias is not None:   # only when present: a plain layout's dict is unchanged
            d["bias"] = {"offset": self.bias.offset, "nbytes": self.bias.nbytes}
        if self.act != ExpertAct():
            d["act"] = {"name": self.act.name, "alpha": self.act.alpha, "limit": self.act.limit}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "BlobLayout":
        a = d.get("act")
        act = ExpertAct(a["name"], float(a["alpha"]), float(a["limit"])) if a else None
        lay = cls.make(d["d_model"], d["d_expert"], d["gate"]["format"], d["up"]["format"],
                       d["down"]["format"], bias="bias" in d, act=act)
        if lay.to_dict() != d:
            from strata.errors import StrataError
            raise StrataError(f"blob layout in metadata disagrees with the formats it names: "
                              f"{d} vs {lay.to_dict()}")
        return lay


def bf16_layout(layout: BlobLayout) -> BlobLayout:
    """The same expert with all three matrices in BF16: what decode-once writes. The source's
    bias slot (its fp32 biases copied as they are) and activation stay, so the BF16 GEMM's
    epilogue reads them as the fused kernel reads the source's. The decode buffer's slots are
    this layout's `size`, in the engine and in the planner alike."""
    return BlobLayout.make(layout.d_model, layout.d_expert, "BF16", "BF16", "BF16",
                           bias=layout.bias is not None, act=layout.act)
