"""strata synth writes a GGUF llama.cpp-shaped; GGUF -> pack keeps expert bytes identical."""
import gguf
import numpy as np
import pytest
import torch

from strata.errors import StrataError
from strata.formats.table import get_format
from strata.packs import Pack, split_blobs
from strata.packs.from_gguf import gguf_to_pack
from strata.packs.qdense import as_float
from strata.packs.randblocks import random_matrix
from strata.packs.synth import ExpertFormats, synth_dense, synth_gguf, synth_pack
from strata.shapes import PRESETS

TINY = PRESETS["tiny"]


def _fields(r):
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}


@pytest.mark.parametrize("fmts", [ExpertFormats.of("Q8_0"), ExpertFormats.of("Q4_0", down="Q8_0"),
                                  ExpertFormats.of("BF16")], ids=["Q8_0", "Q4_0-Q8_0down", "BF16"])
def test_synth_gguf_metadata_and_shapes(tmp_path, fmts):
    p = synth_gguf(tmp_path / "m.gguf", TINY, fmts, seed=3, progress=False)
    r = gguf.GGUFReader(str(p))
    f = _fields(r)
    s = TINY
    assert f["general.architecture"] == "qwen3moe"
    want = {"block_count": s.n_layer, "embedding_length": s.d_model, "expert_count": s.n_expert,
            "expert_used_count": s.top_k, "expert_feed_forward_length": s.d_expert,
            "attention.head_count": s.n_head, "attention.head_count_kv": s.n_kv_head,
            "attention.key_length": s.head_dim}
    for k, v in want.items():
        assert f[f"qwen3moe.{k}"] == v, k
    assert f["qwen3moe.rope.freq_base"] == pytest.approx(s.rope_theta)
    assert f["qwen3moe.attention.layer_norm_rms_epsilon"] == pytest.approx(s.rms_eps)
    assert len(r.fields["tokenizer.ggml.tokens"].data) == s.vocab
    t = {x.name: x for x in r.tensors}
    assert len(t) == 3 + s.n_layer * 12
    for i in range(s.n_layer):  # ggml shapes exactly as llama.cpp's qwen3moe
        assert [int(v) for v in t[f"blk.{i}.ffn_gate_exps.weight"].shape] == [s.d_model, s.d_expert, s.n_expert]
        assert [int(v) for v in t[f"blk.{i}.ffn_up_exps.weight"].shape] == [s.d_model, s.d_expert, s.n_expert]
        assert [int(v) for v in t[f"blk.{i}.ffn_down_exps.weight"].shape] == [s.d_expert, s.d_model, s.n_expert]
        assert t[f"blk.{i}.ffn_gate_exps.weight"].tensor_type.name == fmts.gate
        assert t[f"blk.{i}.ffn_down_exps.weight"].tensor_type.name == fmts.down
        assert [int(v) for v in t[f"blk.{i}.ffn_gate_inp.weight"].shape] == [s.d_model, s.n_expert]
        assert t[f"blk.{i}.ffn_gate_inp.weight"].tensor_type.name == "F32"
        assert [int(v) for v in t[f"blk.{i}.attn_q.weight"].shape] == [s.d_model, s.n_head * s.head_dim]
        assert [int(v) for v in t[f"blk.{i}.attn_k_norm.weight"].shape] == [s.head_dim]
    assert [int(v) for v in t["output.weight"].shape] == [s.d_model, s.vocab]


def test_gguf_to_pack_keeps_expert_bytes(tmp_path):
    fmts = ExpertFormats.of("Q4_0", down="Q8_0")
    p = synth_gguf(tmp_path / "m.gguf", TINY, fmts, seed=1, progress=False)
    pk = Pack.open(gguf_to_pack(p, tmp_path / "m.pack", progress=False), verify=True)
    assert pk.shape == TINY and pk.native
    t = {x.name: x for x in gguf.GGUFReader(str(p)).tensors}
    for i in range(TINY.n_layer):
        assert pk.layers[i].layout.down.fmt.name == "Q8_0"
        parts = split_blobs(pk.layers[i].layout, pk.experts(i))
        for w in ("gate", "up", "down"):
            assert np.array_equal(parts[w], t[f"blk.{i}.ffn_{w}_exps.weight"].data), (i, w)
    # dense: same draws as synth_dense, dtype kept (norms/router F32, matrices BF16)
    ref = synth_dense(TINY, seed=1)
    for n, x in ref.items():
        assert pk.dense(n).dtype == x.dtype and torch.equal(pk.dense(n), x), n


def test_gguf_refusals(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "llama.gguf"), "llama")
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(StrataError, match="llama"):
        gguf_to_pack(tmp_path / "llama.gguf", tmp_path / "o.pack", progress=False)
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + bytes(20))
    with pytest.raises(StrataError):
        gguf_to_pack(tmp_path / "junk.gguf", tmp_path / "o.pack", progress=False)
    with pytest.raises(StrataError, match="synth_pack"):  # Q2_0 has no GGUF type in gguf-py
        synth_gguf(tmp_path / "q2.gguf", TINY, ExpertFormats.of("Q2_0"), progress=False)


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_0", "Q2_K",
                                 "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                                 "IQ3_XXS", "IQ3_S", "IQ4_XS", "IQ1_S", "IQ1_M", "MXFP4", "BF16"])
def test_random_blocks_decode_to_the_asked_scale(fmt):
    from strata.formats import dequantize
    f = get_format(fmt)
    cols = max(256, f.block)
    m = random_matrix(fmt, 64, cols, 0.02, seed=7)
    assert m.shape == (64, f.row_bytes(cols))
    w = dequantize(m, fmt).double().numpy()
    assert np.isfinite(w).all()
    tol = 0.25 if fmt == "MXFP4" else 0.05   # MXFP4 scales are powers of two
    assert abs(w.std() / 0.02 - 1) < tol
    assert abs(w.mean()) < 0.1 * 0.02       # centred: no shared direction in every row


def test_synth_pack_q2_0_and_mixed(tmp_path):
    s = TINY.with_(d_model=128, d_expert=64)
    fm = [ExpertFormats.of("Q2_0"), ExpertFormats.of("Q8_0", down="Q4_0")]
    pk = Pack.open(synth_pack(tmp_path / "m.pack", s, fm, progress=False), verify=True)
    assert [pk.layers[i].layout.gate.fmt.name for i in range(2)] == ["Q2_0", "Q8_0"]
    assert pk.max_blob == max(pk.layers[i].blob_size for i in range(2))
    # Q2_0 crumbs never read 3 (+2): the centring fix-up
    q = split_blobs(pk.layers[0].layout, pk.experts(0))["gate"].reshape(-1, 18)[:, 2:]
    crumbs = np.stack([(q >> (2 * j)) & 3 for j in range(4)])
    assert not (crumbs == 3).any() and (crumbs == 0).any() and (crumbs == 2).any()


def test_gguf_expert_type_strata_cannot_read_is_refused(tmp_path):
    """A qwen3moe GGUF whose experts are Q8_1 (a ggml type outside strata's table) is refused by
    name, not packed into blobs no kernel decodes."""
    from strata.archs.names import dense_specs
    s = TINY
    w = gguf.GGUFWriter(str(tmp_path / "q81.gguf"), "qwen3moe")
    for k, v in {"block_count": s.n_layer, "embedding_length": s.d_model, "expert_count": s.n_expert,
                 "expert_used_count": s.top_k, "expert_feed_forward_length": s.d_expert,
                 "attention.head_count": s.n_head, "attention.head_count_kv": s.n_kv_head,
                 "attention.key_length": s.head_dim}.items():
        w.add_uint32(f"qwen3moe.{k}", v)
    w.add_float32("qwen3moe.attention.layer_norm_rms_epsilon", s.rms_eps)
    w.add_float32("qwen3moe.rope.freq_base", s.rope_theta)   # required (no silent 10000)
    for n, shp in dense_specs(s).items():
        w.add_tensor(n, np.zeros(shp, np.float32))
    q81 = gguf.GGMLQuantizationType.Q8_1   # 32 weights in 40 bytes
    for i in range(s.n_layer):
        for m, rows, cols in (("gate", s.d_expert, s.d_model), ("up", s.d_expert, s.d_model),
                              ("down", s.d_model, s.d_expert)):
            w.add_tensor(f"blk.{i}.ffn_{m}_exps.weight",
                         np.zeros((s.n_expert, rows, cols // 32 * 40), np.uint8), raw_dtype=q81)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(StrataError, match="Q8_1"):
        gguf_to_pack(tmp_path / "q81.gguf", tmp_path / "o.pack", progress=False)
    assert not (tmp_path / "o.pack").exists()


# ---------------------------------------------------------------- stock mixes, mixed imports

from strata.packs import mixes                                    # noqa: E402
from strata.packs.synth import Mix                                # noqa: E402

MIX_SHAPE = TINY.with_(n_layer=8, d_model=256, d_expert=256, n_expert=4, top_k=2)


def test_mix_rules_follow_llama_cpp():
    # qwen3-30b-a3b: 48 layers, D 2048, F 768, 32 q heads over 4 kv heads (n_gqa 8), E 128
    s = PRESETS["qwen3-30b-a3b"]
    more = [i for i in range(48) if mixes.use_more_bits(i, 48)]
    assert more[:8] == [0, 1, 2, 3, 4, 5, 8, 11] and more[-7:] == [41, 42, 43, 44, 45, 46, 47]
    assert len(more) == 24                                        # "about half the layers"
    q4 = Mix.stock("Q4_K_M", s)
    assert [f.down for f in q4.experts] == ["Q6_K" if i in more else "Q4_K" for i in range(48)]
    assert {(f.gate, f.up) for f in q4.experts} == {("Q4_K", "Q4_K")}
    assert q4.dense["output.weight"] == "Q6_K" and q4.dense["blk.8.attn_v.weight"] == "Q6_K"
    assert q4.dense["blk.9.attn_v.weight"] == "Q4_K" and q4.dense["blk.9.attn_q.weight"] == "Q4_K"
    assert q4.dense["blk.0.ffn_gate_inp.weight"] == "F32" and q4.dense["blk.0.attn_norm.weight"] == "F32"
    q3 = Mix.stock("Q3_K_M", s)
    assert [f.down for f in q3.experts[:4]] == ["Q5_K", "Q5_K", "Q5_K", "Q4_K"]   # i < 48/16
    assert q3.dense["blk.1.attn_v.weight"] == "Q5_K" and q3.dense["blk.2.attn_v.weight"] == "Q4_K"
    assert q3.dense["blk.0.attn_output.weight"] == "Q4_K" and q3.experts[0].gate == "Q3_K"
    q2 = Mix.stock("Q2_K", s)
    assert {(f.gate, f.down) for f in q2.experts} == {("Q2_K", "Q3_K")}
    assert q2.dense["blk.0.attn_v.weight"] == "Q4_K"                              # n_gqa >= 4
    assert q2.dense["blk.0.attn_output.weight"] == "Q3_K"
    q5 = Mix.stock("Q5_K_M", s)
    assert [f.down for f in q5.experts] == ["Q6_K" if i in more else "Q5_K" for i in range(48)]
    iq = Mix.stock("IQ4_XS", s)
    assert [f.down for f in iq.experts[:7]] == ["Q5_K"] * 6 + ["IQ4_XS"]           # i < 48/8
    assert {f.down for f in Mix.stock("IQ4_XS", s, imatrix=True).experts} == {"IQ4_XS"}
    assert iq.dense["blk.0.attn_v.weight"] == "Q5_K"
    # Mixtral's 8 experts: attn_v and attn_k Q8_0, attn_output Q5_K
    m8 = Mix.stock("Q4_K_M", s.with_(n_expert=8))
    assert m8.dense["blk.3.attn_v.weight"] == "Q8_0" and m8.dense["blk.3.attn_k.weight"] == "Q8_0"
    assert m8.dense["blk.3.attn_output.weight"] == "Q5_K"
    # the hybrids' DeltaNet conv is never quantized (llama.cpp's CUDA ssm_conv asserts an F32
    # weight: a quantized or F16 one aborts llama-bench), every mix alike
    for preset in ("qwen3.5-35b-a3b", "qwen3-next-80b-a3b"):
        for mix in ("Q4_K_M", "Q2_K", "IQ4_XS", "MXFP4_MOE"):
            d = Mix.stock(mix, PRESETS[preset]).dense
            convs = {v for k, v in d.items() if k.endswith("ssm_conv1d.weight")}
            assert convs == {"F32"}, (preset, mix, convs)


def test_mix_row_fallbacks():
    # rows that are not whole 256-weight blocks: llama.cpp's tensor_type_fallback
    assert mixes.fallback("Q4_K", 64) == "Q5_0" and mixes.fallback("Q5_K", 96) == "Q5_1"
    assert mixes.fallback("Q6_K", 32) == "Q8_0" and mixes.fallback("Q2_K", 64) == "Q4_0"
    assert mixes.fallback("IQ4_XS", 96) == "IQ4_NL" and mixes.fallback("Q6_K", 48) == "F16"
    assert mixes.fallback("Q4_K", 512) == "Q4_K"
    tiny = Mix.stock("Q4_K_M", TINY)                            # D 64, F 32: every expert falls back
    assert {(f.gate, f.down) for f in tiny.experts} == {("Q5_0", "Q8_0"), ("Q5_0", "Q5_0")}
    with pytest.raises(StrataError, match="unknown mix"):
        Mix.stock("Q4_K_X", TINY)


def _tensor_types(path):
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("mix", mixes.MIXES)
def test_synth_mix_gguf_to_pack(tmp_path, mix):
    """`strata synth --mix` writes every tensor in the mix's type; the pack keeps each layer's own
    expert layout and blob size, max_blob the largest, expert bytes unchanged."""
    p = tmp_path / "m.gguf"
    s = MIX_SHAPE
    want = Mix.stock(mix, s)
    synth_gguf(p, s, want, seed=4, progress=False)
    types = _tensor_types(p)
    for i, f in enumerate(want.experts):
        assert [types[f"blk.{i}.ffn_{w}_exps.weight"] for w in ("gate", "up", "down")] == \
            [f.gate, f.up, f.down]
    for name, t in want.dense.items():
        assert types[name] == t, name
    assert gguf.GGUFReader(str(p)).fields["general.file_type"].contents() == \
        int(gguf.LlamaFileType[f"MOSTLY_{mix}"])
    pk = Pack.open(gguf_to_pack(p, tmp_path / "m.pack", progress=False), verify=True)
    sizes = [pl.blob_size for pl in pk.layers]
    assert sizes == [f.layout(s).size for f in want.experts]
    assert pk.max_blob == max(sizes)
    t = {x.name: x for x in gguf.GGUFReader(str(p)).tensors}
    for i in range(s.n_layer):
        parts = split_blobs(pk.layers[i].layout, pk.experts(i))
        for w in ("gate", "up", "down"):
            assert np.array_equal(parts[w], t[f"blk.{i}.ffn_{w}_exps.weight"].data), (i, w)
    # dense: the mix's random blocks, as synth_dense gives them (kept as blocks, decoded F32)
    ref = synth_dense(s, seed=4, dense_types=want.dense)
    for n, x in ref.items():
        assert torch.equal(pk.dense(n).float(), as_float(x).float()), n


def test_synth_cli_mix(tmp_path, capsys):
    from strata.cli import main
    p = tmp_path / "m.gguf"
    assert main(["synth", "--preset", "tiny", "-o", str(p), "--mix", "q4_k_m", "--seed", "2"]) == 0
    assert "Q4_K_M mix" in capsys.readouterr().out
    want = Mix.stock("Q4_K_M", TINY)
    types = _tensor_types(p)
    assert [types[f"blk.{i}.ffn_down_exps.weight"] for i in range(TINY.n_layer)] == \
        [f.down for f in want.experts]
    assert main(["synth", "--preset", "tiny", "-o", str(p), "--mix", "Q4_K_M", "--quant",
                 "Q8_0"]) == 2
    assert "--mix sets every tensor" in capsys.readouterr().err
    assert main(["synth", "--preset", "tiny", "-o", str(p), "--imatrix"]) == 2
    assert main(["synth", "--preset", "tiny", "-o", str(p), "--mix", "Q9_K"]) == 2
    assert "unknown mix" in capsys.readouterr().err


def _rewrite_gguf(src, dst, edit):
    """Copy GGUF `src` to `dst` (metadata as is), tensors through edit(name, type, data) ->
    [(name, type, data)] (data: the tensor's raw bytes in ggml row order)."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        vt = f.types[0]
        w.add_key_value(f.name, f.contents(), vt,
                        sub_type=f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        for name, qt, data in edit(t.name, t.tensor_type, np.asarray(t.data)):
            w.add_tensor(name, np.ascontiguousarray(data), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _fuse_gate_up(src, dst):
    held = {}

    def edit(name, qt, data):
        if "_exps" in name and ("ffn_gate_exps" in name or "ffn_up_exps" in name):
            i = name.split(".")[1]
            held[(i, "gate" if "gate" in name else "up")] = (qt, data)
            if (i, "gate") in held and (i, "up") in held:
                (qg, g), (qu, u) = held[(i, "gate")], held[(i, "up")]
                assert qg == qu
                return [(f"blk.{i}.ffn_gate_up_exps.weight", qg, np.concatenate([g, u], axis=1))]
            return []
        return [(name, qt, data)]
    return _rewrite_gguf(src, dst, edit)


def test_fused_gate_up_import_equals_separate(tmp_path):
    s = MIX_SHAPE.with_(n_layer=3)
    p = synth_gguf(tmp_path / "sep.gguf", s, Mix.stock("Q4_K_M", s), seed=6, progress=False)
    f = _fuse_gate_up(p, tmp_path / "fused.gguf")
    assert "blk.0.ffn_gate_up_exps.weight" in _tensor_types(f)
    assert "blk.0.ffn_gate_exps.weight" not in _tensor_types(f)
    a = Pack.open(gguf_to_pack(p, tmp_path / "a.pack", progress=False), verify=True)
    b = Pack.open(gguf_to_pack(f, tmp_path / "b.pack", progress=False), verify=True)
    for i in range(s.n_layer):
        assert a.layers[i].layout == b.layers[i].layout
        assert np.array_equal(np.asarray(a.experts(i)), np.asarray(b.experts(i))), i


def test_import_refuses_disagreeing_tensors(tmp_path):
    s = MIX_SHAPE.with_(n_layer=2)
    p = synth_gguf(tmp_path / "m.gguf", s, Mix.stock("Q4_K_M", s), seed=1, progress=False)

    def case(edit, match):
        bad = _rewrite_gguf(p, tmp_path / "bad.gguf", edit)
        with pytest.raises(StrataError, match=match):
            gguf_to_pack(bad, tmp_path / "o.pack", progress=False)
        assert not (tmp_path / "o.pack").exists()

    # a dense matrix of the wrong width: named, with both shapes
    case(lambda n, q, d: [(n, q, d[:32] if n == "blk.1.attn_q.weight" else d)],
         r"blk\.1\.attn_q\.weight has ggml shape \[256, 32\], expected \[256, 64\]")
    # an expert tensor with one expert too few
    case(lambda n, q, d: [(n, q, d[:-1] if n == "blk.0.ffn_down_exps.weight" else d)],
         r"blk\.0\.ffn_down_exps\.weight has ggml shape \[256, 256, 3\], expected \[256, 256, 4\]")
    # an expert tensor relabelled Q8_0 (its rows cut to whole 34-byte blocks): half the width
    q80 = gguf.GGMLQuantizationType.Q8_0
    case(lambda n, q, d: [(n, q80 if n == "blk.1.ffn_up_exps.weight" else q,
                           d[..., :d.shape[-1] // 144 * 136] if n == "blk.1.ffn_up_exps.weight"
                           else d)],
         r"blk\.1\.ffn_up_exps\.weight has ggml shape")
    # a type strata cannot read, named
    tq = gguf.GGMLQuantizationType.TQ2_0
    case(lambda n, q, d: [(n, tq if n == "blk.0.ffn_gate_exps.weight" else q,
                           np.zeros(d.shape[:-1] + (d.shape[-1] // 144 * 66,), np.uint8)
                           if n == "blk.0.ffn_gate_exps.weight" else d)],
         r"blk\.0\.ffn_gate_exps\.weight is stored as TQ2_0")
    # both a fused and separate gate/up
    def both(n, q, d):
        out = [(n, q, d)]
        if n == "blk.0.ffn_up_exps.weight":
            out.append(("blk.0.ffn_gate_up_exps.weight", q, np.concatenate([d, d], axis=1)))
        return out
    case(both, r"both blk\.0\.ffn_gate_up_exps\.weight and separate")


TINY_ARCHS = sorted(k for k in PRESETS if k.startswith("tiny-"))


@pytest.mark.parametrize("preset,mix", [(p, None) for p in TINY_ARCHS]
                         + [("tiny-glm4moe", "Q4_K_M"), ("tiny-gpt-oss", "MXFP4_MOE")])
def test_synth_pack_is_the_pack_of_synth_gguf(tmp_path, preset, mix):
    """`synth --pack` draws every tensor from the seed synth's GGUF draws it from, so it writes the
    pack that `strata pack` makes of that GGUF: a full-size side-by-side (llama.cpp on the GGUF,
    strata on the pack) needs only one of the two files on the machine at a time."""
    s = PRESETS[preset]
    fmts = Mix.stock(mix, s) if mix else ExpertFormats.of("Q8_0")
    a = Pack.open(gguf_to_pack(synth_gguf(tmp_path / "m.gguf", s, fmts, seed=5, progress=False),
                               tmp_path / "a.pack", progress=False), verify=True)
    b = Pack.open(synth_pack(tmp_path / "b.pack", s, fmts, seed=5, progress=False), verify=True)
    assert a.shape == b.shape and a.native and b.native
    assert [pl.layout for pl in a.layers] == [pl.layout for pl in b.layers]
    for i in range(s.n_layer):
        assert np.array_equal(np.asarray(a.experts(i)), np.asarray(b.experts(i))), i
    assert sorted(a.dense_names()) == sorted(b.dense_names())
    for n in a.dense_names():
        x, y = a.dense(n), b.dense(n)
        assert x.dtype == y.dtype and torch.equal(x, y), n
    # and a different seed draws other experts (the comparison above can fail)
    c = Pack.open(synth_pack(tmp_path / "c.pack", s, fmts, seed=6, progress=False), verify=True)
    last = s.moe_layers[-1]
    assert not np.array_equal(np.asarray(a.experts(last)), np.asarray(c.experts(last)))
