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


def _dot_bound(n: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """D eps (|n| |w|) [T, V]: how far an fp32 D-term dot product n[t] . w[v], summed in any
    order, lies from the exact one (the classic bound); two orders lie within twice it."""
    D = n.shape[-1]
    return D * torch.finfo(torch.float32).eps * (n.abs() @ w.float().abs().t())


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
        assert ((got - want).abs() <= _dot_bound(x, full)).all(), name


def _head_inputs(model) -> list[torch.Tensor]:
    """The normed hidden states [T, D] each head() call of `model` multiplies (recorded)."""
    from strata.models.layers import rms_norm
    seen, head = [], model.head

    def spy(x, logits="all"):
        seen.append(rms_norm(x, model.out_norm, model.shape.rms_eps).float())
        return head(x, logits)
    model.head = spy
    return seen


@pytest.mark.parametrize("preset", ["tiny-glm4moe", "tiny-qwen3moe"])
def test_a_model_reading_through_blocks_gives_the_decoded_models_logits(tmp_path, preset):
    """The same model with its embeddings and head as blocks (the head in slices): the hidden
    states are the decoded model's bit for bit (the lookup is exact), the logits that within
    fp32's rounding of a D-term dot product (each of the two sums within D eps |n||w| of the
    exact one, so of each other within twice that), measured on the head's own inputs."""
    pk = _pack(tmp_path, preset)
    model = load_model(pk, device="cpu")          # every matrix decoded, fp32
    kept = _kept(pk)
    embd = _weight(kept["token_embd.weight"])
    head = _weight(kept["output.weight"]) if "output.weight" in kept else embd
    blocks = type(model)(model.shape, embd, model.layers, model.out_norm, head, ffn=model.ffn)
    tokens = torch.randint(0, model.shape.vocab, (23,), generator=torch.Generator().manual_seed(1))
    assert torch.equal(blocks.embed(tokens), model.embed(tokens))
    seen_want, seen_got = _head_inputs(model), _head_inputs(blocks)
    want = model.prefill(tokens, resident_provider(pk), chunk=8)
    got = blocks.prefill(tokens, resident_provider(pk), chunk=8)
    assert not got.isnan().any()
    n = torch.cat(seen_got)
    assert torch.equal(n, torch.cat(seen_want))     # the layers read alike: the head's inputs
    assert ((got - want).abs() <= 2 * _dot_bound(n, model.lm_head)).all()
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
    may take another GEMM kernel: each bf16 logit is its fp32 sum rounded once, 2^-8 of
    it, the two sums within twice D eps |n||w| of each other, measured on the head's inputs)."""
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
    seen_got, seen_want = _head_inputs(model), _head_inputs(plain)
    got = model.prefill(tokens, provider, chunk=8)
    want = plain.prefill(tokens, provider, chunk=8)
    assert not got.isnan().any()
    n = torch.cat(seen_got)
    assert torch.equal(n, torch.cat(seen_want))
    head = whole["output.weight"]
    bound = 2 ** -8 * (got.abs() + want.abs()) + 2 * _dot_bound(n, head) * (1 + 2 ** -8)
    assert ((got - want).abs() <= bound).all()


@pytest.mark.parametrize("preset", ["tiny-glm4moe", "tiny-deepseek2", "tiny-mixtral"])
def test_plan_of_a_preset_in_a_mix_counts_what_its_pack_keeps(tmp_path, capsys, preset):
    """`strata plan --preset P --quant MIX` counts the dense matrices as the blocks synth writes
    for that mix (MLA's attn_kv_b, stored split, decoded; Mixtral's permuted q/k kept): its
    JSON `blocks` equal kept_bytes of the pack `synth --pack` makes, and `--pack` of that pack
    says the same, with the layers' under the default --dense-layers blocks and without them
    under decoded; the table names them in a `blocks` line."""
    import json
    from strata.cli import main
    pk = _pack(tmp_path, preset, "Q4_K_M")
    for dl, layers in (("blocks", True), ("decoded", False)):
        want = kept_bytes(pk, "cuda", torch.bfloat16, layer_blocks=layers)
        assert any(n.startswith("blk.") for n in want) == layers
        for src in (["--preset", preset, "--quant", "Q4_K_M"], ["--pack", str(pk.path)]):
            assert main(["plan", *src, "--vram", "2GiB", "--json", "--device", "cuda",
                         "--dense-layers", dl]) == 0
            assert json.loads(capsys.readouterr().out)["blocks"] == want
    n = sum(k.startswith("blk.") for k in kept_bytes(pk, "cuda", torch.bfloat16,
                                                     layer_blocks=True))
    assert main(["plan", "--preset", preset, "--quant", "Q4_K_M", "--vram", "2GiB",
                 "--device", "cuda"]) == 0
    assert (f"  blocks    embeddings, LM head, {n} layer matrices kept as the pack's GGUF blocks"
            in capsys.readouterr().out)
    assert main(["plan", "--preset", preset, "--quant", "Q8_0", "--vram", "2GiB",
                 "--json", "--device", "cuda"]) == 0
    assert "blocks" not in json.loads(capsys.readouterr().out)      # plain quant: bf16 dense


def test_a_plain_head_beside_block_embeddings_counts_as_bf16():
    """Embeddings kept as blocks say nothing of the head: a head the pack stores plain is
    counted at DENSE_BYTES a weight (not as the embeddings' blocks)."""
    s = PRESETS["tiny-qwen3moe"]
    z, plain = model_sizes(s, kept={"token_embd.weight": 1000}), model_sizes(s)
    assert z.dense_first == 1000 and z.dense_last == plain.dense_last


def _decoder_tables() -> None:
    """The block decoders' value tables (126 KiB of IQ grids, made once a process per device on
    the first decode: strata.formats.tables.device_table), made before a test counts what a load
    allocates: the process's, not the load's (the RESERVE's allocator share)."""
    from strata.formats.tables import device_table
    device_table("iq", "cuda")


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
    _decoder_tables()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model = load_model(pk, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    slack = 512 * (len(pk.dense_names()) + 1)
    assert planned <= held <= planned + slack, (held, planned)
    del model


LAYER_PRESETS = [("tiny-deepseek2", "Q4_K_M"), ("tiny-qwen35moe", "Q4_K_M"),
                 ("tiny-gpt-oss", "MXFP4_MOE"), ("tiny-mixtral", "Q4_K_M")]


def _layer_blocks(pk, dtype=torch.float32) -> dict:
    """The pack's dense tensors with each layer matrix it holds as blocks a BlockWeight (as a
    CUDA load with layer blocks places them), the rest decoded."""
    out = {}
    for n in pk.dense_names():
        q = pk.dense_stored(n)
        out[n] = (BlockWeight(q.fmt, q.shape, q.raw.clone(), dtype)
                  if isinstance(q, QuantDense) and n.startswith("blk.") else pk.dense(n))
    return out


@pytest.mark.parametrize("preset,mix", LAYER_PRESETS)
def test_a_model_with_its_layers_as_blocks_reads_bit_for_bit(tmp_path, preset, mix):
    """A model whose layer matrices stay blocks, decoded for each layer's turn (MLA with a
    dense lead layer and shared experts, DeltaNet, biased attention under MXFP4_MOE's Q8_0,
    Mixtral's row-permuted q/k), reads the prompt exactly as the model decoded at load: the
    same decoded values through the same ops."""
    from strata.archs.registry import get_arch
    pk = _pack(tmp_path, preset, mix)
    s = pk.shape
    model = load_model(pk, device="cpu")
    tensors = _layer_blocks(pk)
    assert any(isinstance(t, BlockWeight) for t in tensors.values())
    blocks = get_arch(s.arch).build(s, tensors, device=torch.device("cpu"),
                                    dtype=torch.float32, ffn=model.ffn)
    tokens = torch.randint(0, s.vocab, (19,), generator=torch.Generator().manual_seed(1))
    want = model.prefill(tokens, resident_provider(pk), chunk=8)
    got = blocks.prefill(tokens, resident_provider(pk), chunk=8)
    assert not got.isnan().any() and torch.equal(got, want)
    ref = blocks.reference()                          # the twin decodes them whole
    assert not any(isinstance(t, BlockWeight) for lw in ref.layers for t in _leaves(lw))


def _leaves(lw) -> list:
    seen = []
    lw.map(lambda t: seen.append(t) or t)
    return seen


def _blocky(pk, dtype=torch.float32):
    """The pack's model on the CPU with its layer matrices as BlockWeights (_layer_blocks), and
    each BlockWeight's (layer, phase, name): phase "attn" where it is in the layer's attention
    weights (decode_phase's split), the name by its blocks' storage."""
    from strata.archs.registry import get_arch
    s = pk.shape
    tensors = _layer_blocks(pk, dtype)
    model = get_arch(s.arch).build(s, tensors, device=torch.device("cpu"), dtype=dtype,
                                   ffn=load_model(pk, device="cpu").ffn)
    name = {t.raw.data_ptr(): n for n, t in tensors.items() if isinstance(t, BlockWeight)}
    owner = {}
    for l, lw in enumerate(model.layers):
        attn = {id(t) for t in _leaves(lw.attn)}
        for t in _leaves(lw):
            if isinstance(t, BlockWeight):
                owner[id(t)] = (l, "attn" if id(t) in attn else "ffn", name[t.raw.data_ptr()])
    # a dense FFN's matrices decode inside the FFN phase (phase_of: "ffn_each")
    return model, owner


def _watched_read(pk, model, owner, monkeypatch) -> list[int]:
    """Read a prompt counting each layer's peak of live decoded bytes; at every decode no
    matrix of another layer or of the other phase may be alive (reference counts only: the
    cyclic GC off, as a GPU stream's allocator frees on the last reference)."""
    import gc
    import weakref
    alive: list = []           # ((layer, phase), weakref, bytes)
    peak = [0] * pk.shape.n_layer
    decoded = BlockWeight.decoded

    def watch(self):
        l, phase, _ = owner[id(self)]
        assert not [k for k, r, _ in alive if k != (l, phase) and r() is not None], (l, phase)
        out = decoded(self)
        alive.append(((l, phase), weakref.ref(out), out.numel() * out.element_size()))
        live = sum(b for k, r, b in alive if k == (l, phase) and r() is not None)
        peak[l] = max(peak[l], live)
        return out
    monkeypatch.setattr(BlockWeight, "decoded", watch)
    gc.disable()
    try:
        tokens = torch.randint(0, pk.shape.vocab, (9,), generator=torch.Generator().manual_seed(2))
        model.prefill(tokens, resident_provider(pk), chunk=8)
    finally:
        gc.enable()
    assert {k for k, _, _ in alive} == {(l, p) for l, p, _ in owner.values()}
    return peak


@pytest.mark.parametrize("preset", ["tiny-deepseek2", "tiny-gpt-oss", "tiny-qwen35moe",
                                    "tiny-qwen3next", "tiny-minimax-m2"])
def test_one_phases_decoded_matrices_live_at_a_time(tmp_path, monkeypatch, preset):
    """decode_phase's matrices are dropped when their phase is done: when a matrix decodes, no
    other layer's nor the other phase's decoded matrix is alive (the plan counts one phase's,
    the largest), and phase_of names each matrix's phase as the model splits them, for every
    wiring whose layers hold other blocks: MLA and a dense FFN, sinks, DeltaNet and shared
    experts, QK norms."""
    from strata.models.block_weight import phase_of
    pk = _pack(tmp_path, preset, "Q4_K_M")
    model, owner = _blocky(pk)
    _watched_read(pk, model, owner, monkeypatch)
    assert "attn" in {p for _, p, _ in owner.values()}
    assert all(phase_of(n).startswith(p) for _, p, n in owner.values())
    if preset in ("tiny-deepseek2", "tiny-qwen35moe", "tiny-qwen3next"):   # a dense FFN / shared
        assert any(phase_of(n) == "ffn_each" for _, _, n in owner.values())


def test_decode_layer_passes_a_layer_without_blocks():
    """A layer with no BlockWeight comes back as itself (nothing copied each turn)."""
    from strata.models.block_weight import decode_layer
    from strata.models.ffn import DenseFFN
    f = DenseFFN(torch.ones(2, 32), torch.ones(2, 32), torch.ones(32, 2))
    assert decode_layer(f) is f


@pytest.mark.parametrize("preset", ["tiny-deepseek2", "tiny-qwen35moe"])
def test_the_plan_counts_a_layers_blocks_and_its_decode(tmp_path, preset):
    """With layer blocks, kept_bytes names every layer matrix the pack holds as blocks at its
    blocks' bytes; model_sizes counts them in their layer's dense bytes in place of bf16 and
    each layer's larger phase of decoded matrices (decoded_bytes in the dense dtype, phase_of)
    as its scratch."""
    from strata.archs.names import layer_specs
    from strata.models.block_weight import decoded_bytes, phase_of
    pk = _pack(tmp_path, preset)
    s = pk.shape
    kept = kept_bytes(pk, "cuda", torch.bfloat16, layer_blocks=True)
    lay = {n for n in kept if n.startswith("blk.")}
    assert lay and lay == {n for n in pk.dense_names() if n.startswith("blk.")
                           and isinstance(pk.dense_stored(n), QuantDense)}
    assert all(kept[n] == pk.dense_stored(n).nbytes for n in lay)
    assert kept_bytes(pk, "cuda", torch.bfloat16).keys() == set(kept) - lay
    z, plain = model_sizes(s, kept=kept, act=torch.bfloat16), model_sizes(s)
    for l in range(s.n_layer):
        specs = layer_specs(s, l)
        mine = [n for n in specs if n in lay]
        assert z.dense_layers[l] == plain.dense_layers[l] - sum(
            decoded_bytes(specs[n], DENSE_BYTES) - kept[n] for n in mine)
        size = {n: decoded_bytes(specs[n], 2) for n in mine}
        attn = sum(b for n, b in size.items() if phase_of(n) == "attn")
        ffn = sum(b for n, b in size.items() if phase_of(n) == "ffn")
        each = max((b for n, b in size.items() if phase_of(n) == "ffn_each"), default=0)
        assert z.dense_scratch[l] == max(attn, ffn + each)
    assert plain.dense_scratch == (0,) * s.n_layer


@pytest.mark.gpu
@pytest.mark.parametrize("preset,mix", LAYER_PRESETS[:2])
def test_the_gpu_load_with_layer_blocks_reads_as_the_decoded_load(tmp_path, preset, mix):
    """On CUDA, `layer_blocks` keeps every layer matrix the pack holds as blocks (kept_bytes'
    names) and decodes each layer's for its turn, to the bf16 values the decoded load holds:
    the same logits bit for bit, and the load holds the plan's dense bytes less the two
    transients (the head's slice, one layer's decode) up to the allocator's rounding."""
    pk = _pack(tmp_path, preset, mix)
    kept = kept_bytes(pk, "cuda", torch.bfloat16, layer_blocks=True)
    z = model_sizes(pk.shape, kept=kept, act=torch.bfloat16)
    _decoder_tables()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model = load_model(pk, device="cuda", dtype=torch.bfloat16, layer_blocks=True)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - before
    head = kept["output.weight"] - _kept(pk)["output.weight"].nbytes
    planned = sum(z.dense_layers) + z.dense_first + z.dense_last - head
    assert planned <= held <= planned + 512 * (len(pk.dense_names()) + 1), (held, planned)
    blocks = [t for lw in model.layers for t in _leaves(lw) if isinstance(t, BlockWeight)]
    assert len(blocks) == sum(n.startswith("blk.") for n in kept)
    plain = load_model(pk, device="cuda", dtype=torch.bfloat16)
    tokens = torch.randint(0, pk.shape.vocab, (17,),
                           generator=torch.Generator().manual_seed(3)).cuda()
    provider = resident_provider(pk, device="cuda")
    got = model.prefill(tokens, provider, chunk=8)
    want = plain.prefill(tokens, provider, chunk=8)
    assert not got.isnan().any() and torch.equal(got, want)


@pytest.mark.parametrize("preset", ["tiny-deepseek2", "tiny-qwen35moe", "tiny-gpt-oss",
                                    "tiny-minimax-m2"])
def test_a_layers_decode_allocates_what_the_plan_counts(tmp_path, preset, monkeypatch):
    """The most each layer's turn holds decoded at once (bf16) is the plan's dense_scratch for
    that layer (model_sizes from kept_bytes, its phases by phase_of): one count; and phase_of
    agrees with the model's split for every matrix of these wirings."""
    from strata.models.block_weight import phase_of
    mix = "MXFP4_MOE" if preset == "tiny-gpt-oss" else "Q4_K_M"
    pk = _pack(tmp_path, preset, mix)
    model, owner = _blocky(pk, torch.bfloat16)
    peak = _watched_read(pk, model, owner, monkeypatch)
    z = model_sizes(pk.shape, kept=kept_bytes(pk, "cuda", torch.bfloat16, layer_blocks=True),
                    act=torch.bfloat16)
    assert any(peak) and tuple(peak) == z.dense_scratch
    assert all(phase_of(n).startswith(p) for _, p, n in owner.values())
