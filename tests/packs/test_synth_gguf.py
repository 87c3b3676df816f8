"""strata synth writes a GGUF llama.cpp-shaped; GGUF -> pack keeps expert bytes identical."""
import gguf
import numpy as np
import pytest
import torch

from strata.errors import StrataError
from strata.formats.table import get_format
from strata.packs import Pack, split_blobs
from strata.packs.from_gguf import gguf_to_pack
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


@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q5_0", "IQ4_NL", "Q2_0", "Q4_K", "Q6_K", "IQ3_S",
                                 "MXFP4", "BF16"])
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
    """A qwen3moe GGUF whose experts are Q4_1 (a ggml type outside strata's table) is refused by
    name, not packed into blobs no kernel decodes."""
    from strata.packs.names import dense_specs
    s = TINY
    w = gguf.GGUFWriter(str(tmp_path / "q41.gguf"), "qwen3moe")
    for k, v in {"block_count": s.n_layer, "embedding_length": s.d_model, "expert_count": s.n_expert,
                 "expert_used_count": s.top_k, "expert_feed_forward_length": s.d_expert,
                 "attention.head_count": s.n_head, "attention.head_count_kv": s.n_kv_head,
                 "attention.key_length": s.head_dim}.items():
        w.add_uint32(f"qwen3moe.{k}", v)
    w.add_float32("qwen3moe.attention.layer_norm_rms_epsilon", s.rms_eps)
    w.add_float32("qwen3moe.rope.freq_base", s.rope_theta)   # required (no silent 10000)
    for n, shp in dense_specs(s).items():
        w.add_tensor(n, np.zeros(shp, np.float32))
    q41 = gguf.GGMLQuantizationType.Q4_1   # 32 weights in 20 bytes
    for i in range(s.n_layer):
        for m, rows, cols in (("gate", s.d_expert, s.d_model), ("up", s.d_expert, s.d_model),
                              ("down", s.d_model, s.d_expert)):
            w.add_tensor(f"blk.{i}.ffn_{m}_exps.weight",
                         np.zeros((s.n_expert, rows, cols // 32 * 20), np.uint8), raw_dtype=q41)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(StrataError, match="Q4_1"):
        gguf_to_pack(tmp_path / "q41.gguf", tmp_path / "o.pack", progress=False)
    assert not (tmp_path / "o.pack").exists()
