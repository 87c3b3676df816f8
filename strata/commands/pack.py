"""`strata pack SOURCE -o OUT`: a GGUF file or a Hugging Face folder -> a pack."""
from __future__ import annotations

from pathlib import Path

from strata.errors import StrataError


def add_parser(sub):
    p = sub.add_parser("pack", help="turn a GGUF file or a Hugging Face folder into a pack",
                       description=__doc__)
    p.add_argument("source", help="qwen3moe .gguf file, or a folder with config.json + *.safetensors")
    p.add_argument("-o", "--out", required=True, help="output pack file")
    p.add_argument("--quant", default="BF16",
                   help="expert format for Hugging Face weights (default BF16; GGUF keeps its own)")
    for m in ("gate", "up", "down"):
        p.add_argument(f"--quant-{m}", default=None, help=f"format of the {m} matrices (default --quant)")
    p.add_argument("--verify", action="store_true", help="re-open the pack and check every checksum")
    return p


def run(args) -> int:
    from strata.packs.file import Pack
    src = Path(args.source)
    if src.is_dir():
        from strata.packs.from_hf import hf_to_pack
        out = hf_to_pack(src, args.out, args.quant, args.quant_gate, args.quant_up, args.quant_down)
    elif src.is_file():
        if args.quant != "BF16" or args.quant_gate or args.quant_up or args.quant_down:
            raise StrataError("--quant applies to Hugging Face weights; a GGUF's experts are packed "
                              "as they are (native)")
        from strata.packs.from_gguf import gguf_to_pack
        out = gguf_to_pack(src, args.out)
    else:
        raise StrataError(f"no such file or folder: {src}")
    pk = Pack.open(out, verify=args.verify)
    print(f"{out}: {pk!r}")
    return 0
