"""`strata pack SOURCE -o OUT`: a GGUF file or a Hugging Face folder -> a pack.

The pack is written to a temp file beside OUT and renamed when whole; OUT must not be SOURCE
and must not be an existing file of another kind (a GGUF, a .npy) unless --force."""
from __future__ import annotations

from pathlib import Path

from strata import filekind
from strata.atomic import check_output
from strata.errors import StrataError


def add_parser(sub):
    p = sub.add_parser("pack", help="turn a GGUF file or a Hugging Face folder into a pack",
                       description=__doc__)
    p.add_argument("source", help="qwen3moe .gguf file, or a folder with config.json + *.safetensors")
    p.add_argument("-o", "--out", required=True, help="output pack file")
    p.add_argument("--quant", default=None,
                   help="expert format for Hugging Face weights (default BF16; GGUF keeps its own)")
    for m in ("gate", "up", "down"):
        p.add_argument(f"--quant-{m}", default=None, help=f"format of the {m} matrices (default --quant)")
    p.add_argument("--verify", action="store_true", help="re-open the pack and check every checksum")
    p.add_argument("--force", action="store_true",
                   help="replace OUT even when it is the source or a file of another kind")
    return p


def run(args) -> int:
    from strata.packs.file import Pack
    src = Path(args.source)
    if not src.exists():
        raise StrataError(f"no such file or folder: {src}")
    out = check_output(args.out, "-o", kind=filekind.PACK, inputs=[src], force=args.force)
    if src.is_dir():
        from strata.formats.table import get_format
        for q in (args.quant, args.quant_gate, args.quant_up, args.quant_down):
            if q is not None:
                get_format(q)    # an unknown format: one line, before any work
        from strata.packs.from_hf import hf_to_pack
        out = hf_to_pack(src, out, args.quant or "BF16", args.quant_gate, args.quant_up,
                         args.quant_down)
    else:
        if args.quant or args.quant_gate or args.quant_up or args.quant_down:
            raise StrataError("--quant applies to Hugging Face weights; a GGUF's experts are packed "
                              "as they are (native)")
        kind = filekind.kind(src)
        if kind == filekind.PACK:
            raise StrataError(f"{src} is already a strata pack; to check it run `strata verify "
                              f"{src}`")
        from strata.packs.from_gguf import gguf_to_pack
        out = gguf_to_pack(src, out)
    pk = Pack.open(out, verify=True if args.verify else None)
    print(f"{out}: {pk!r}" + ("; every checksum verified" if args.verify else ""))
    return 0
