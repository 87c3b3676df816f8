"""The embeddings and head kept as blocks on the GPU (strata.models.block_weight): a lookup and
the head's slices decode as the reader does, a model reading through them gives the decoded
model's logits, and the plan counts the bytes the load places (one count: kept_bytes)."""
import pytest
import torch

from strata.engine.load import dense_on_devices, kept_bytes, load_model, resident_provider
from strata.models.block_weight import (KEPT_AS_BLOCKS, BlockWeight, block_matrix_bytes,
                                        slice_rows)
from strata.packs import Pack
from strata.packs.qdense import QuantDense
from strata.packs.synth import Mix, synth_pack
from strata.planning import DENSE_BYTES, model_sizes
from strata.shapes import PRESETS


def _pack(tmp_path, preset="tiny-glm4moe", mix="Q4_K_M"):
    s = PRESETS[preset]
    return Pack.open(synth_pack(tmp_path / f"{preset}.pack", s, Mix.stock(mix, s), seed=1,
                                progress=False))


def _kept(pk) -> dict[str, QuantDense]:
    out = {n: pk.dense_stored(n) for n in KEPT_AS_BLOCKS if n in pk.dense_names()}
    assert out and all(isinstance(q, QuantDense) for q in out.values())
    return out


def _weight(q: QuantDense, dtype=torch.float32, slices: int = 3) -> BlockWeight:
    """A BlockWeight of the pack's blocks whose head runs in `slices` slices."""
    V, D = q.shape
    return BlockWeight(q.fmt, q.shape, q.raw.clone(), dtype,
                       slice_bytes=-(-V // slices) * D * dtype.itemsize)


def test_rows_and_head_decode_as_the_reader(tmp_path):
    """A lookup is the decoded matrix's rows bit for bit (fp32; bf16 those rounded), the head's
    slices cover every row once, and each logit is the same D-term dot product as the decoded
    matrix's: equal within fp32's rounding of such a sum."""
    g = torch.Generator().manual_seed(0)
    for name, q in _kept(_pack(tmp_path)).items():
        V, D = q.shape
        full = q.decode()
        w = _weight(q)
        assert slice_rows(V, D, 4, w.slice_bytes) < V           # more than one slice
        ids = torch.randint(0, V, (11,), generator=g)
        assert torch.equal(w[ids], full[ids]), name
        assert torch.equal(_weight(q, torch.bfloat16)[ids].view(torch.int16),
                           full[ids].to(torch.bfloat16).view(torch.int16)), name
        assert torch.equal(w.float(), full), name
        x = torch.randn(5, D, generator=g)
        got, want = w.matmul_t(x), x @ full.t()
        assert got.shape == (5, V) and not got.isnan().any()
        bound = D * torch.finfo(torch.float32).eps * (x.abs() @ full.abs().t())
        assert ((got - want).abs() <= bound).all(), name


@pytest.mark.parametrize("preset", ["tiny-glm4moe", "tiny-qwen3moe"])
def test_a_model_reading_through_blocks_gives_the_decoded_models_logits(tmp_path, preset):
    """The same model with its embeddings and head as blocks (the head in slices): the hidden
    states are the decoded model's bit for bit (the lookup is exact), the logits that within
    fp32's rounding of a D-term dot product."""
    pk = _pack(tmp_path, preset)
    model = load_model(pk, device="cpu")          # every matrix decoded, fp32
    kept = _kept(pk)
    embd = _weight(kept["token_embd.weight"])
    head = _weight(kept["output.weight"]) if "output.weight" in kept else embd
    blocks = type(model)(model.shape, embd, model.layers, model.out_norm, head, ffn=model.ffn)
    tokens = torch.randint(0, model.shape.vocab, (23,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(blocks.embed(tokens), model.embed(tokens))
    want = model.prefill(tokens, resident_provider(pk), chunk=8)
    got = blocks.prefill(tokens, resident_provider(pk), chunk=8)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    ref = blocks.reference()                          # the twin decodes them whole
    assert isinstance(ref.tok_embd, torch.Tensor) and torch.equal(ref.lm_head, model.lm_head)


def test_the_plan_counts_what_the_load_places(tmp_path):
    """kept_bytes (the plan's count) is each kept matrix's blocks, and for the head the decoded
    slice it multiplies at a time, as the BlockWeight the load places holds and decodes;
    model_sizes puts them in dense_first and dense_last in place of bf16 matrices; the CPU
    keeps none."""
    pk = _pack(tmp_path)
    s = pk.shape
    kept = kept_bytes(pk, "cuda", torch.bfloat16)
    assert set(kept) == set(_kept(pk)) == {"token_embd.weight", "output.weight"}
    for n, q in _kept(pk).items():
        w = BlockWeight(q.fmt, q.shape, q.raw, torch.bfloat16)
        step = slice_rows(*q.shape, 2, w.slice_bytes) if n == "output.weight" else 0
        assert kept[n] == w.nbytes + step * q.shape[1] * 2
        assert kept[n] == block_matrix_bytes(n, q.nbytes, *q.shape, 2)
    plain, blocks = model_sizes(s), model_sizes(s, kept=kept)
    assert plain.dense_first == s.vocab * s.d_model * DENSE_BYTES
    assert blocks.dense_first == kept["token_embd.weight"]
    assert blocks.dense_last - kept["output.weight"] == plain.dense_last - plain.dense_first
    assert blocks.dense_layers == plain.dense_layers
    assert kept_bytes(pk, "cpu", torch.bfloat16) == {}


def test_a_tied_head_is_the_embeddings_counted_again(tmp_path):
    """A tied pack (no output.weight: its reader serves the embeddings as the head) keeps one
    matrix of blocks; the plan counts it as the head too, with the head's slice, on the last GPU
    (untied, the worst case, as for plain weights)."""
    from types import SimpleNamespace
    pk = _pack(tmp_path)
    q = _kept(pk)["token_embd.weight"]
    tied = SimpleNamespace(tied=True, dense_names=lambda: ["token_embd.weight"],
                           dense_stored=lambda n: q)
    kept = kept_bytes(tied, "cuda", torch.bfloat16)
    assert kept == {"token_embd.weight": q.nbytes,
                    "output.weight": block_matrix_bytes("output.weight", q.nbytes, *q.shape, 2)}
    z = model_sizes(pk.shape, kept=kept)
    assert z.dense_first == q.nbytes
    assert z.dense_last == kept["output.weight"] + pk.shape.d_model * DENSE_BYTES


@pytest.mark.gpu
def test_the_gpu_load_keeps_blocks_and_reads_as_the_decoded_model(tmp_path):
    """On CUDA the load keeps the embeddings and head as BlockWeights of the pack's blocks (the
    bytes kept_bytes counts); the model reads as the same model with them decoded whole (the
    load's other path): hidden states bit for bit, logits within one bf16 rounding (a slice
    may take another GEMM kernel)."""
    from strata.engine.load import blocks_on_device
    pk = _pack(tmp_path)
    model = load_model(pk, device="cuda", dtype=torch.bfloat16)
    assert isinstance(model.tok_embd, BlockWeight) and isinstance(model.lm_head, BlockWeight)
    kept, qs = kept_bytes(pk, "cuda", torch.bfloat16), _kept(pk)
    for n, w in (("token_embd.weight", model.tok_embd), ("output.weight", model.lm_head)):
        assert torch.equal(w.raw.cpu(), qs[n].raw)
        assert kept[n] == block_matrix_bytes(n, w.nbytes, *w.shape, 2)
    whole = {n: blocks_on_device(q, "cuda", torch.bfloat16) for n, q in qs.items()}
    plain = type(model)(model.shape, whole["token_embd.weight"], model.layers, model.out_norm,
                        whole["output.weight"], ffn=model.ffn)
    tokens = torch.randint(0, pk.shape.vocab, (17,),
                           generator=torch.Generator().manual_seed(2)).cuda()
    assert torch.equal(model.embed(tokens), plain.embed(tokens))
    provider = resident_provider(pk, device="cuda")
    got = model.prefill(tokens, provider, chunk=8)
    want = plain.prefill(tokens, provider, chunk=8)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, rtol=2 ** -7, atol=2 ** -7 * want.abs().max().item())


def test_plan_of_a_preset_in_a_mix_counts_what_its_pack_keeps(tmp_path, capsys):
    """`strata plan --preset P --quant MIX` counts the embeddings and head as the blocks synth
    writes for that mix: its JSON `blocks` equal kept_bytes of the pack `synth --pack` makes,
    and `--pack` of that pack says the same; the table names them in a `blocks` line."""
    import json
    from strata.cli import main
    pk = _pack(tmp_path, "tiny-glm4moe", "Q4_K_M")
    want = kept_bytes(pk, "cuda", torch.bfloat16)
    for src in (["--preset", "tiny-glm4moe", "--quant", "Q4_K_M"], ["--pack", str(pk.path)]):
        assert main(["plan", *src, "--vram", "2GiB", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["blocks"] == want
    assert main(["plan", "--preset", "tiny-glm4moe", "--quant", "Q4_K_M", "--vram", "2GiB"]) == 0
    assert "  blocks    embeddings and LM head kept as the pack's GGUF blocks" in \
        capsys.readouterr().out
    assert main(["plan", "--preset", "tiny-glm4moe", "--quant", "Q8_0", "--vram", "2GiB",
                 "--json"]) == 0
    assert "blocks" not in json.loads(capsys.readouterr().out)      # plain quant: bf16 dense


def test_a_plain_head_beside_block_embeddings_counts_as_bf16():
    """Embeddings kept as blocks say nothing of the head: a head the pack stores plain is
    counted at DENSE_BYTES a weight (not as the embeddings' blocks)."""
    s = PRESETS["tiny-qwen3moe"]
    z, plain = model_sizes(s, kept={"token_embd.weight": 1000}), model_sizes(s)
    assert z.dense_first == 1000 and z.dense_last == plain.dense_last


@pytest.mark.gpu
def test_the_gpu_load_allocates_what_the_plan_counts(tmp_path):
    """The dense bytes a CUDA load holds are the plan's dense bytes (model_sizes with
    kept_bytes) less the head's decode slice, which is a transient of the head's run: equal up
    to the caching allocator's 512-byte rounding and upload's 256-byte offsets, a tensor each."""
    pk = _pack(tmp_path)
    kept = kept_bytes(pk, "cuda", torch.bfloat16)
    z = model_sizes(pk.shape, kept=kept)
    q = _kept(pk)["output.weight"]
    planned = (sum(z.dense_layers) + z.dense_first + z.dense_last
               - (kept["output.weight"] - q.nbytes))                 # the slice: not at load
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model = load_model(pk, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    slack = 512 * (len(pk.dense_names()) + 1)
    assert planned <= held <= planned + slack, (held, planned)
    del model
