"""`strata verify PACK [--source SRC]`: check a pack's header checksum, every tensor's CRC32 and
its record of the source's metadata; with --source, that SRC (the GGUF or HF folder it was made
from) has that metadata and gives the pack's shape (strata.packs.provenance).

Exits 0 with a summary when everything matches; otherwise one line naming the tensor, the header,
the key or the shape field that fails, and exit 2. Reads the whole file (CRC32 at ~1.8 GB/s per
core here); --source reads SRC's metadata, not its tensors."""
from __future__ import annotations

import sys
import time


def add_parser(sub):
    p = sub.add_parser("verify", help="check a pack's checksums (header and every tensor)",
                       description=__doc__)
    p.add_argument("pack", help="a pack file")
    p.add_argument("--source", metavar="SRC", default=None,
                   help="the GGUF file or HF folder the pack was made from: its metadata must be "
                        "the one recorded and give the pack's hyperparameters")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def run(args) -> int:
    import json

    from strata.packs import Pack
    from strata.packs.provenance import check_record
    from strata.packs.source_check import check_source
    from strata.units import fmt_bytes
    t0 = time.perf_counter()
    pack = Pack.open(args.pack, verify=False)     # the header checksum and the tensor table
    rec = check_source(pack, args.source) if args.source else check_record(pack)
    bar = None
    if not args.json:
        from tqdm import tqdm
        bar = tqdm(total=pack.path.stat().st_size, unit="B", unit_scale=True, file=sys.stderr,
                   desc="verify", leave=False)
    try:
        n = pack.verify(progress=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    dt = time.perf_counter() - t0
    names = len(pack._names())
    src = ({"kind": rec["kind"], "sha256": rec["sha256"], "keys": rec["keys"],
            "checked_against": args.source} if rec else None)
    if args.json:
        print(json.dumps({"pack": str(args.pack), "ok": True, "tensors": names, "bytes": n,
                          "seconds": dt, "source_meta": src}))
    else:
        how = ("no source metadata recorded (synth / memory pack, or an older strata)" if not rec
               else f"source {pack.meta.get('source', '?')} metadata sha256 "
                    f"{rec['sha256'][:12]}… ({rec['keys']} keys)"
                    + (f", equal to {args.source}'s, which gives this shape" if args.source
                       else "; --source FILE checks it against the file"))
        print(f"{args.pack}: OK, header checksum and {names} tensor checksums "
              f"({fmt_bytes(n)}) in {dt:.2f} s; {how}")
    return 0
