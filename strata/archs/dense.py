"""The dense tensors every architecture has (the embeddings, the output norm and head), and
the check of a dense set against what its architecture's name map wants.

Legend: D hidden, V vocabulary.
"""
from __future__ import annotations

from strata.errors import StrataError
from strata.shapes import ModelShape

# Dense tensors that may be absent: the LM head when the embeddings are tied.
OPTIONAL = ("output.weight",)


def global_specs(s: ModelShape) -> dict[str, tuple[int, ...]]:
    return {
        "token_embd.weight": (s.vocab, s.d_model),      # [V, D]
        "output_norm.weight": (s.d_model,),             # [D]
        "output.weight": (s.vocab, s.d_model),          # [V, D]  (absent when tied)
    }


def refuse_mismatch(want: dict[str, tuple[int, ...]], shapes: dict[str, tuple[int, ...]],
                    where: str) -> None:
    """Refuse a dense set `shapes` with tensors missing from, extra to or shaped otherwise than
    `want` (name -> torch shape), naming the first problems."""
    missing = [n for n in want if n not in shapes and n not in OPTIONAL]
    extra = [n for n in shapes if n not in want]
    wrong = [f"{n} is {list(shapes[n])}, expected {list(want[n])}"
             for n in want if n in shapes and tuple(shapes[n]) != want[n]]
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
    if extra:
        problems.append(f"unexpected {', '.join(extra[:5])}" + (" ..." if len(extra) > 5 else ""))
    if wrong:
        problems.append("; ".join(wrong[:5]))
    if problems:
        raise StrataError(f"{where}: dense tensors disagree with the model shape: "
                          + "; ".join(problems))
