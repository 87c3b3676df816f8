"""`strata perplexity` reads its windows as batches of packed sequences (strata.models.packed):
the PPL equals the one-window-at-a-time PPL within the fp32 order bound, resident and streamed,
and streamed, the experts cross once per batch instead of once per window (the report's
bytes_streamed falls by the windows a batch holds).

The model is a synth tiny Qwen3 GGUF (with its tokenizer) packed as is; both reads run the fp32
reference expert FFN on the CPU, so they differ only in the order of fp32 sums. The logit bound
b is derived as tests/models/fp32_bound.py does, through the fp32 reference forward of the
weights gguf-py decodes (tests/models/test_mix_prefill.reference), its sums as long as a batch.
A token's NLL is a log-softmax, which moves by at most twice the largest change of its row's
logits, so |ln PPL - ln PPL'| <= 2 b max|logit| (max over the windows' reference logits).

The hybrids (tiny-qwen3next, tiny-qwen35moe: Gated DeltaNet layers beside full ones) batch their
windows too, each window's recurrent state from zero: the same equality, the bound derived the
same way through their own fp32 reference forward (strata.models.qwen3_next).
"""
from __future__ import annotations

import argparse
import json
import math

import pytest

from strata.cli import main
from strata.instruments.windows import Windows
from strata.packs import Pack
from strata.packs.synth import ExpertFormats, synth_gguf
from strata.shapes import get_preset
from strata.models.qwen3_next import Qwen3Next
from strata.tokenize import pack_tokenizer
from tests.models.fp32_bound import order_bound
from tests.models.test_mix_prefill import gguf_weights, reference

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

# tiny's layers with 32 experts of 64: 0.8 MB of Q8_0 experts, more than the streamed cache holds
SHAPE = get_preset("tiny").with_(n_expert=32, d_expert=64)
CTX, N = 32, 6
READ = ["--ctx", str(CTX), "--chunks", str(N), "--json"]
STREAM = ["--vram", "2GiB", "--cache", "500KiB", "--ring", "2", "--no-warmup"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(pack, text file, the PPL bound on |ln PPL - ln PPL'|)."""
    d = tmp_path_factory.mktemp("batched")
    g = synth_gguf(d / "m.gguf", SHAPE, ExpertFormats.of("Q8_0"), seed=3, progress=False)
    pack = d / "m.pack"
    assert main(["pack", str(g), "-o", str(pack)]) == 0
    text = d / "a.txt"
    text.write_text(argparse.__doc__)
    tok = pack_tokenizer(Pack.open(pack))
    w = Windows.of(tok.encode(text.read_text(), specials=False), CTX, tok.add_bos)
    weights = gguf_weights(g, SHAPE)
    ids = [w.ids(i).tolist() for i in range(N)]
    b = order_bound(lambda x: reference(x, SHAPE, tokens=ids[0]), weights, tokens=N * CTX)
    top = max(reference(weights, SHAPE, tokens=t).abs().max().item() for t in ids)
    return pack, text, 2 * b * top


@pytest.fixture(scope="module", params=["tiny-qwen3next", "tiny-qwen35moe"])
def hybrid(request, tmp_path_factory):
    """(pack, text file, the PPL bound) of a synth hybrid, as `model` makes them."""
    shape = get_preset(request.param)
    d = tmp_path_factory.mktemp(request.param)
    g = synth_gguf(d / "m.gguf", shape, ExpertFormats.of("Q8_0"), seed=3, progress=False)
    pack = d / "m.pack"
    assert main(["pack", str(g), "-o", str(pack)]) == 0
    text = d / "a.txt"
    text.write_text(argparse.__doc__)
    tok = pack_tokenizer(Pack.open(pack))
    w = Windows.of(tok.encode(text.read_text(), specials=False), CTX, tok.add_bos)
    weights = gguf_weights(g, shape)
    ids = [w.ids(i).tolist() for i in range(N)]

    def forward(x, t=ids[0]):
        return reference(x, shape, tokens=t, chunk=CTX, cls=Qwen3Next)
    b = order_bound(forward, weights, tokens=N * CTX)
    top = max(forward(weights, t).abs().max().item() for t in ids)
    return pack, text, 2 * b * top


@pytest.mark.parametrize("how", ["resident", "streamed"])
def test_hybrid_batched_ppl_equals_one_window_at_a_time(hybrid, capsys, how):
    pack, text, bound = hybrid
    # the hybrids' experts (221 KB of Q8_0): a cache a batch's buffers leave too small for all
    extra = ["--vram", "2GiB", "--cache", "512KiB", "--ring", "2", "--no-warmup"] \
        if how == "streamed" else []
    single = ppl(capsys, pack, text, "--batch-windows", "1", *extra)
    batched = ppl(capsys, pack, text, *extra)
    assert single["windows_per_batch"] == 1 and batched["windows_per_batch"] == N
    assert batched["reader"].startswith(how)
    err = abs(math.log(batched["ppl"]) - math.log(single["ppl"]))
    print(f"hybrid {how}: PPL {batched['ppl']:.6f} vs {single['ppl']:.6f}: |d ln PPL| "
          f"{err:.2e}, bound {bound:.2e}")
    assert err <= bound
    if how == "streamed":
        assert (single["batches"], batched["batches"]) == (N, 1)
        assert batched["bytes_streamed"] > 0


def ppl(capsys, pack, text, *extra) -> dict:
    rc = main(["perplexity", str(pack), "--file", str(text), *READ, *extra])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out)


@pytest.mark.parametrize("how", ["resident", "streamed"])
def test_batched_ppl_equals_one_window_at_a_time(model, capsys, how):
    pack, text, bound = model
    extra = STREAM if how == "streamed" else []
    single = ppl(capsys, pack, text, "--batch-windows", "1", *extra)
    batched = ppl(capsys, pack, text, *extra)
    assert single["windows_per_batch"] == 1 and batched["windows_per_batch"] == N
    assert batched["reader"].startswith(how)
    err = abs(math.log(batched["ppl"]) - math.log(single["ppl"]))
    print(f"{how}: PPL {batched['ppl']:.6f} vs {single['ppl']:.6f}: |d ln PPL| {err:.2e}, "
          f"bound {bound:.2e}")
    assert err <= bound
    if how == "streamed":
        # one expert pass a batch instead of one a window: each window alone streams the same
        # bytes; the batch streams once (a little more than one window's pass: its larger
        # chunk's buffers borrow more of the cache's slots), far less than N passes
        assert (single["batches"], batched["batches"]) == (N, 1)
        assert single["bytes_streamed"] % N == 0
        assert 0 < batched["bytes_streamed"] < single["bytes_streamed"] / 2
        print(f"bytes streamed: {single['bytes_streamed']:,} one window a prompt, "
              f"{batched['bytes_streamed']:,} batched")


def test_batches_of_two_windows(model, capsys):
    pack, text, bound = model
    single = ppl(capsys, pack, text, "--batch-windows", "1", *STREAM)
    # with the warm-up: its dry prompt is read packed as the batches are
    two = ppl(capsys, pack, text, "--batch-windows", "2", *STREAM[:-1])
    assert two["windows_per_batch"] == 2 and two["batches"] == N // 2 and two["warmup_s"] > 0
    assert abs(math.log(two["ppl"]) - math.log(single["ppl"])) <= bound
    assert two["running_ppl"][-1] == pytest.approx(two["ppl"])


def test_a_batch_past_the_chunk_is_one_line(model, capsys):
    pack, text, _ = model
    rc = main(["perplexity", str(pack), "--file", str(text), *READ, *STREAM, "--chunk", "64",
               "--batch-windows", "3"])
    err = capsys.readouterr().err
    assert rc == 2 and "longer than the planned chunk of 64" in err and err.count("\n") == 1
    rc = main(["perplexity", str(pack), "--file", str(text), *READ, "--batch-windows", "0"])
    assert rc == 2 and "--batch-windows must be at least 1" in capsys.readouterr().err
