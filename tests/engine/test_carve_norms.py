"""The layer's norms in the engine's carve and its residual in place (strata.models.moe_decoder.
layer): a bf16 read embeds each chunk into the carve's x (cache.hidden), writes both RMSNorms of
every layer into the carve's xn (loan bytes the plan counted: strata.models.provider.
LayerWorkspace.xn) and adds each residual into x itself, and
reads the bits it reads with the norms allocated (norm_out answering None); a GQA layer's q, k
and v in the carve's q / k / v (strata.models.attention.attention, cache.proj)."""
from __future__ import annotations

import pytest
import torch


def place_x(res) -> int:
    """The offset of the carve's x in the first participant's loan."""
    return {p["name"]: p["offset"] for p in res.plan.participants[0].placements}["x"]


def _engine(shape, tmp_path, **cfg):
    from strata.engine.prefill import EngineConfig, PrefillEngine
    from strata.packs import Pack
    from strata.packs.memory import MemoryPack
    from strata.packs.synth import ExpertFormats
    tmp_path.mkdir(parents=True, exist_ok=True)
    mem = MemoryPack(shape, ExpertFormats.of("BF16"), distinct=2, variants=1, device="cpu")
    pack = Pack.open(mem.save(tmp_path / "m.pack", progress=False, tokenizer=False))
    return PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=24 * pack.max_blob, max_prompt=64,
                                            device="cpu", ffn="ref", chunk=4, ring=2,
                                            dtype=torch.bfloat16, **cfg))


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "deepseek2"])
def test_the_norms_write_the_carve_and_the_residual_adds_in_place(name, tmp_path, monkeypatch):
    import strata.models.moe_decoder as md
    from strata.shapes import get_preset
    from tests.models.hf_family import DS_TINY
    shape = DS_TINY if name == "deepseek2" else get_preset(name)
    outs, real = [], md.rms_norm

    def spy(x, w, eps, out=None):
        outs.append((None if out is None else out.data_ptr(), x.data_ptr()))
        return real(x, w, eps, out)
    monkeypatch.setattr(md, "rms_norm", spy)
    eng = _engine(shape, tmp_path / "a")
    tok = torch.arange(9) % shape.vocab
    res = eng.run(tok, logits="all")
    buf = eng.cache.buffer
    xn = {p["name"]: p["offset"] for p in res.plan.participants[0].placements}["xn"]
    n = 2 * shape.n_layer + 1                       # two norms a layer and the head's, a chunk
    assert len(outs) == n * 3                                  # 3 chunks
    chunks = [outs[i:i + n] for i in range(0, len(outs), n)]
    # every layer's norm into one buffer of the loan, the carve's xn (the loan begins at its
    # ring, offset 0; the head's output norm allocates its own)
    (o,) = {o for c in chunks for o, _ in c[:-1]}
    base, plan = o - xn, res.plan.participants[0]
    lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()
    assert lo <= base and base + plan.bytes_needed <= hi and (base - lo) % 256 == 0
    assert all(c[-1][0] is None for c in chunks)
    # one residual stream a chunk: every norm of a chunk reads the same x (added in place),
    # the carve's x, into which each chunk is embedded (cache.hidden)
    assert {x for c in chunks for _, x in c} == {base + place_x(res)}
    monkeypatch.setattr(md, "norm_out", lambda *a: None)
    monkeypatch.setattr(md, "buf_view", lambda *a: None)        # embed allocates x again
    monkeypatch.setattr(md, "rms_norm", real)
    assert torch.equal(_engine(shape, tmp_path / "b").run(tok, logits="all").logits,
                       res.logits)


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-glm4moe", "tiny-minimax-m2"])
def test_a_gqa_read_projects_q_k_v_into_its_carve(name, tmp_path, monkeypatch):
    """tiny-qwen3moe, tiny-glm4moe and tiny-minimax-m2 (GQA; GLM's biases and partial RoPE,
    MiniMax's q / k norms over all heads), bf16: every layer's normed and rotated q and k and
    its v projection lie in the carve's q / k / v (cache.proj, the plan's buffers), the raw q in
    its attn and the raw k in its v (before v is projected there), the read's bits are the
    read's with them allocated, and the maps are emptied when the prompt ends (a cache that
    outlives it must not write into the refilled loan)."""
    import strata.models.attention as att
    from strata.shapes import get_preset
    shape = get_preset(name)
    seen, real, raw, real_proj = [], att.attend, [], att.project

    def spy(q, k, v, cache, layer, **kw):
        seen.append((q.data_ptr(), k.data_ptr(), v.data_ptr()))
        spy.cache = cache
        return real(q, k, v, cache, layer, **kw)
    monkeypatch.setattr(att, "attend", spy)
    eng = _engine(shape, tmp_path / "a")
    ks = {id(eng.model.layers[l].attn.wk) for l in range(shape.n_layer)}
    qs = {id(eng.model.layers[l].attn.wq) for l in range(shape.n_layer)}

    def proj(x, wt, b, out=None):          # the raw projections: where each lands
        y = real_proj(x, wt, b, out)
        raw.append(("k" if id(wt) in ks else "q" if id(wt) in qs else "", y.data_ptr()))
        return y
    monkeypatch.setattr(att, "project", proj)
    tok = torch.arange(9) % shape.vocab
    res = eng.run(tok, logits="all")
    monkeypatch.setattr(att, "project", real_proj)
    place = {p["name"]: p["offset"] for p in res.plan.participants[0].placements}
    assert len(seen) == shape.n_layer * 3 and len(set(seen)) == 1     # one q, k, v: the carve's
    (q, k, v), = set(seen)
    assert (k - q, v - q) == (place["k"] - place["q"], place["v"] - place["q"])
    assert {p for n, p in raw if n == "k"} == {v}                       # the raw k in v
    assert {p for n, p in raw if n == "q"} == {q - place["q"] + place["attn"]}   # raw q in attn
    assert spy.cache.proj == {}
    monkeypatch.setattr(att, "attend", real)
    monkeypatch.setattr(att, "buf_view", lambda *a: None)
    monkeypatch.setattr(att, "norm_out", lambda *a: None)
    assert torch.equal(_engine(shape, tmp_path / "b").run(tok, logits="all").logits,
                       res.logits)


@pytest.mark.parametrize("name", ["tiny-qwen3moe", "deepseek2", "tiny-qwen35moe"])
def test_the_attention_and_ffn_outputs_take_the_normed_inputs_bytes(name, tmp_path, monkeypatch):
    """A bf16 read: every layer's attention output (GQA, MLA, Gated DeltaNet and gated
    attention) is written into the carve's xn, its own normed input, and so are a leading dense
    layer's and a shared expert's outputs (DenseFFN's into), their gate and up products in the
    carve's dense_gu and h; the read's bits are those with every output allocated (into_view
    answering None) and the shared experts' products too (spare answering None)."""
    import strata.models.layers as layers
    import strata.models.moe_decoder as md
    from strata.models.ffn import DenseFFN
    from strata.shapes import get_preset
    from tests.models.hf_family import DS_TINY
    shape = DS_TINY if name == "deepseek2" else get_preset(name)
    eng = _engine(shape, tmp_path / "a")
    attn, ffn = [], []
    real_attend, real_ffn = type(eng.model).attend, DenseFFN.__call__

    def attend_spy(self, xn, *a, into=None):
        y = real_attend(self, xn, *a, into=into)
        attn.append((xn.data_ptr(), into.data_ptr(), y.data_ptr()))
        return y

    def ffn_spy(self, x, buf=None, into=None):
        y = real_ffn(self, x, buf, into)
        ffn.append((x.data_ptr(), y.data_ptr(), None if buf is None else buf.data_ptr()))
        return y
    monkeypatch.setattr(type(eng.model), "attend", attend_spy)
    monkeypatch.setattr(DenseFFN, "__call__", ffn_spy)
    tok = torch.arange(9) % shape.vocab
    res = eng.run(tok, logits="all")
    place = {p["name"]: p["offset"] for p in res.plan.participants[0].placements}
    buf = eng.cache.buffer
    assert len(attn) == shape.n_layer * 3                                  # 3 chunks
    (xn, into, y), = set(attn)                                             # one buffer: xn's
    assert xn == into == y and buf.data_ptr() <= xn < buf.data_ptr() + buf.numel()
    dense = sum((getattr(lw, "dense", None) is not None) + (getattr(lw, "shared", None)
                                                           is not None) for lw in eng.model.layers)
    assert (dense > 0) == (name != "tiny-qwen3moe")        # qwen3moe has no dense FFN
    assert len(ffn) == 3 * dense and all(x == y == xn for x, y, _ in ffn)
    # the gate and up products: a leading dense layer's in the carve's dense_gu, a shared
    # expert's in the experts' spare h (LayerWorkspace.spare: their passes have run)
    base = xn - place["xn"]
    lead = {l for l, lw in enumerate(eng.model.layers) if getattr(lw, "dense", None) is not None}
    assert {b for _, _, b in ffn} == ({base + place["dense_gu"]} if lead else set()) | (
        {base + place["h"]} if dense > len(lead) else set())
    monkeypatch.setattr(layers, "into_view", lambda *a: None)
    monkeypatch.setattr("strata.models.attention.into_view", lambda *a: None)
    monkeypatch.setattr("strata.models.provider.LayerWorkspace.spare", lambda self: None)
    assert torch.equal(_engine(shape, tmp_path / "b").run(tok, logits="all").logits,
                       res.logits)


def test_a_gated_attention_layer_projects_into_its_carve(tmp_path, monkeypatch):
    """tiny-qwen35moe's full-attention layers (Qwen3.5 / Qwen3-Next gated attention), bf16: the
    query and gate projection lie in the carve's qg, the rotated q and k, v in its q / k / v and
    the attention's output in its attn, gated where it lies; the read's bits are those with
    each allocated."""
    import strata.models.qwen3_next as qn
    from strata.shapes import get_preset
    shape = get_preset("tiny-qwen35moe")
    seen, real, real_proj = [], qn.attend_cached, qn.project

    def proj(x, wt, b, out=None):
        if wt.shape[0] == 2 * shape.n_head * shape.head_dim:
            seen.append(("qg", None if out is None else out.data_ptr()))
        return real_proj(x, wt, b, out)
    monkeypatch.setattr(qn, "project", proj)

    def spy(q, k, v, cache, layer, **kw):
        o = real(q, k, v, cache, layer, **kw)
        seen.append((q.data_ptr(), k.data_ptr(), v.data_ptr()))
        seen.append(("o", o.data_ptr()))
        return o
    monkeypatch.setattr(qn, "attend_cached", spy)
    eng = _engine(shape, tmp_path / "a")
    tok = torch.arange(9) % shape.vocab
    res = eng.run(tok, logits="all")
    monkeypatch.setattr(qn, "project", real_proj)
    place = {p["name"]: p["offset"] for p in res.plan.participants[0].placements}
    full = sum(shape.layer_kind(l) != "linear" for l in range(shape.n_layer))
    qkv = {s for s in seen if s[0] not in ("o", "qg")}
    outs = {s[1] for s in seen if s[0] == "o"}
    qgs = {s[1] for s in seen if s[0] == "qg"}
    calls = [s for s in seen if s[0] == "o"]        # (qg counts the linear layers' too: the
    assert full and len(calls) == 3 * full and len(qkv) == 1 and len(outs) == 1   # same buffer)
    ((q, k, v),), (o,), (qg,) = qkv, outs, qgs
    assert (k - q, v - q, o - q, qg - q) == tuple(place[n] - place["q"]
                                                 for n in ("k", "v", "attn", "qg"))
    monkeypatch.setattr(qn, "attend_cached", real)
    monkeypatch.setattr(qn, "buf_view", lambda *a: None)
    monkeypatch.setattr(qn, "norm_out", lambda *a: None)
    monkeypatch.setattr("strata.models.attention.buf_view", lambda *a: None)
    assert torch.equal(_engine(shape, tmp_path / "b").run(tok, logits="all").logits,
                       res.logits)


@pytest.mark.parametrize("kv", ["int8", "bf16"])
def test_the_engines_kv_attends_into_the_carves_attn(kv, tmp_path, monkeypatch):
    """tiny-qwen3moe under the engine's own KV (PromptKV: --kv int8, or bf16 with a resident
    window), bf16: chunk_attention's output (every chunk's here, on the CPU; on CUDA a first
    chunk's SDPA returns its own) lies in the carve's attn, and the read's bits are those with
    it allocated."""
    import strata.models.attention as att
    import strata.models.kv as kvm
    from strata.shapes import get_preset
    shape = get_preset("tiny-qwen3moe")
    outs, real = set(), att.attend

    def spy(q, *a, **kw):
        o = real(q, *a, **kw)
        outs.add((q.data_ptr(), o.data_ptr()))
        return o
    monkeypatch.setattr(att, "attend", spy)
    cfg = dict(kv="int8") if kv == "int8" else dict(kv="bf16", kv_resident=4)
    eng = _engine(shape, tmp_path / "a", **cfg)
    tok = torch.arange(9) % shape.vocab
    res = eng.run(tok, logits="all")
    place = {p["name"]: p["offset"] for p in res.plan.participants[0].placements}
    ((q, o),) = outs                       # one q (the carve's) and one output, every layer
    assert o - q == place["attn"] - place["q"]
    monkeypatch.setattr(att, "attend", real)
    monkeypatch.setattr(kvm, "buf_view", lambda *a: None)
    assert torch.equal(_engine(shape, tmp_path / "b", **cfg).run(tok, logits="all").logits,
                       res.logits)



@pytest.mark.parametrize("name", ["tiny-qwen3moe", "tiny-qwen35moe"])
def test_attention_outputs_in_groups_of_heads_read_the_same(name, tmp_path, monkeypatch):
    """A bf16 read whose attention launches would each pass the bound on one launch's output
    (strata.kernels.attention.flash.OUT_BYTES, made 1 byte here): every GQA / gated layer's
    SDPA goes over groups of heads (one key head's query heads a launch) into the carve's attn,
    a gated layer gates its output where it lies; the logits are the one-launch read's bits."""
    import strata.kernels.attention.flash as fl
    from strata.shapes import get_preset
    shape = get_preset(name)
    tok = torch.arange(9) % shape.vocab
    whole = _engine(shape, tmp_path / "a").run(tok, logits="all").logits
    launches, real = [], fl.head_groups

    def spy(attend, q, k, v, *, out=None, out_bytes=None):
        heads = []

        def counted(qg, kg, vg):
            heads.append(qg.shape[1])
            return attend(qg, kg, vg)
        o = real(counted, q, k, v, out=out, out_bytes=out_bytes)
        launches.append((q.shape[0], k.shape[0], heads, None if out is None else
                         out.data_ptr(), o.data_ptr()))
        return o
    monkeypatch.setattr(fl, "OUT_BYTES", 1)
    monkeypatch.setattr("strata.models.attention.head_groups", spy)
    eng = _engine(shape, tmp_path / "b")
    res = eng.run(tok, logits="all")
    full = [l for l in range(shape.n_layer) if shape.layer_kind(l) != "linear"]
    assert len(launches) == 3 * len(full)                      # 3 chunks, each full layer
    for H, Hkv, heads, out, o in launches:   # a launch a key head, into attn (one buffer)
        assert Hkv > 1 and heads == [H // Hkv] * Hkv and out is not None and o == out
    assert len({o for *_, o in launches}) == 1
    assert torch.equal(res.logits, whole)


def test_a_linear_layer_computes_in_the_carve_a_full_layer_uses(tmp_path, monkeypatch):
    """tiny-qwen35moe's Gated DeltaNet layers, bf16: the q / k / v projection lies in the
    carve's qg, the conv's q and k in its q and v in its attn, the rule's output and the gate z
    in qg (the projection read), the gated norm in q (q and k read); the read's bits are those
    with each allocated."""
    import strata.models.qwen3_next as qn
    from strata.shapes import get_preset
    shape = get_preset("tiny-qwen35moe")
    lin = shape.linear
    qk_w, v_w = 2 * lin.n_k_head * lin.k_head_dim, lin.n_v_head * lin.v_head_dim
    seen = {"proj": [], "conv": [], "rule": [], "norm": []}
    real_proj, real_conv, real_rule, real_norm = (qn.project, qn.causal_conv1d_torch,
                                                  qn.delta_rule_on, qn.gated_rms_norm_torch)

    def proj(x, wt, b, out=None):
        y = real_proj(x, wt, b, out)
        if proj.linear:                              # a linear layer's, not a full one's
            seen["proj"].append((wt.shape[0], y.data_ptr()))
        return y
    proj.linear = False

    def conv(*a, out=None, **kw):
        (y1, y2), s = real_conv(*a, out=out, **kw)
        seen["conv"].append((y1.data_ptr(), y2.data_ptr()))
        return (y1, y2), s

    def rule_on(x):
        rule = real_rule(x)

        def spied(*a, out=None, **kw):
            o, S = rule(*a, out=out, **kw)
            seen["rule"].append(o.data_ptr())
            return o, S
        return spied

    def norm(x, z, w, eps, out=None):
        y = real_norm(x, z, w, eps, out)
        seen["norm"].append(y.data_ptr())
        return y
    for name, fn in (("project", proj), ("causal_conv1d_torch", conv),
                     ("delta_rule_on", rule_on), ("gated_rms_norm_torch", norm)):
        monkeypatch.setattr(qn, name, fn)
    eng = _engine(shape, tmp_path / "a")
    real_rows = type(eng.model).delta_rows

    def rows(self, *a, **kw):
        proj.linear = True
        try:
            return real_rows(self, *a, **kw)
        finally:
            proj.linear = False
    monkeypatch.setattr(type(eng.model), "delta_rows", rows)
    tok = torch.arange(9) % shape.vocab
    res = eng.run(tok, logits="all")
    monkeypatch.setattr(type(eng.model), "delta_rows", real_rows)
    place = {p["name"]: p["offset"] for p in res.plan.participants[0].placements}
    linear = sum(shape.layer_kind(l) == "linear" for l in range(shape.n_layer))
    assert linear and len(seen["conv"]) == len(seen["rule"]) == len(seen["norm"]) == 3 * linear
    qkv = {p for rows, p in seen["proj"] if rows == qk_w + v_w}
    gate = {p for rows, p in seen["proj"] if rows == v_w}
    (qg,) = qkv
    base = qg - place["qg"]
    assert set(seen["conv"]) == {(base + place["q"], base + place["attn"])}
    assert set(seen["rule"]) == {base + place["qg"]}
    assert set(seen["norm"]) == {base + place["q"]}
    # z right after the rule's output [T, Hv, dv] in qg: T 4, 4, then 1 (9 in chunks of 4)
    assert gate == {base + place["qg"] + n * v_w * 2 for n in (4, 1)}
    for name in ("project", "causal_conv1d_torch", "delta_rule_on", "gated_rms_norm_torch"):
        monkeypatch.setattr(qn, name, {"project": real_proj, "causal_conv1d_torch": real_conv,
                                       "delta_rule_on": real_rule,
                                       "gated_rms_norm_torch": real_norm}[name])
    monkeypatch.setattr(qn, "buf_view", lambda *a: None)
    assert torch.equal(_engine(shape, tmp_path / "b").run(tok, logits="all").logits,
                       res.logits)
