"""A prompt's KV saved and resumed (strata.engine.kv_state, kv_stores), on the CPU, tiny shapes.

Exactness: a resumed read restores the same bits into the same store and reads the new tokens
in the same chunks a full read of the concatenated prompt does (the saved prefix is a whole
number of chunks), so every operation sees the same operands: the logits of the new tokens are
equal bit for bit. Checked for the model's own KVCache (GQA, sliding) and MLACache, and the
engine's PromptKV with a host-held part (fp32, int8; GQA, MLA latent, sliding rings), and for
the hybrids (Qwen3-Next, Qwen3.5-MoE), whose linear layers' recurrent state (conv state and S)
is saved whole beside the full layers' KV and restored into the states the engine allocated:
the new tokens' chunks then start from the same state bits a full read's do.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from strata.cli import main
from strata.engine.kv_state import KVState, save_state
from strata.engine.kv_stores import layer_pieces, restore_states
from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.errors import StrataError
from strata.models.layer_state import RecurrentStates, linear_layers
from strata.packs import Pack
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import GptOssOptions, ModelShape, Window, get_preset
from tests.models.hf_family import DS_TINY

OSS = ModelShape("gpt-oss", n_layer=4, d_model=64, n_expert=4, top_k=2, d_expert=32,
                 n_head=4, n_kv_head=2, head_dim=16, vocab=128, opts=GptOssOptions(),
                 window=Window(5), max_pos=4096)
SHAPES = {"qwen3moe": get_preset("tiny"), "deepseek2": DS_TINY, "gpt-oss": OSS,
          "qwen3next": get_preset("tiny-qwen3next"), "qwen35moe": get_preset("tiny-qwen35moe")}
HYBRIDS = [a for a, s in SHAPES.items() if s.linear is not None]
N, CUT = 30, 16          # prompt tokens; the saved prefix (two chunks of 8)


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    d = tmp_path_factory.mktemp("packs")
    return {a: Pack.open(synth_pack(d / f"{a}.pack", s, ExpertFormats.of("Q8_0"),
                                    progress=False))
            for a, s in SHAPES.items()}


def tokens(arch):
    return torch.randint(0, SHAPES[arch].vocab, (N,), generator=torch.Generator().manual_seed(7))


def engine(pack, **kw):
    cfg = EngineConfig(vram=1 << 30, cache=24 * pack.max_blob, max_prompt=64, device="cpu",
                       chunk=8, ring=2, ffn="ref", **kw)
    return PrefillEngine(pack, cfg)


def save_after(path, pack, toks):
    return lambda s, out: save_state(path, s.kv, pack=pack, tokens=toks, logits=out[-1])


KINDS = {"model-cache": {}, "prompt-kv-host": {"kv_resident": 5},
         "int8-host": {"kv": "int8", "kv_resident": 5}}


@pytest.mark.parametrize("arch", list(SHAPES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_resume_equals_a_full_read(packs, arch, kind, tmp_path):
    pack, t = packs[arch], tokens(arch)
    eng = engine(pack, **KINDS[kind])
    full = eng.run(t, logits="all")
    path = tmp_path / "s.kv"
    first = eng.run(t[:CUT], logits="last", then=save_after(path, pack, t[:CUT].tolist()))
    info = first.then
    assert path.exists() and info.n_tokens == CUT and info.nbytes == path.stat().st_size
    state = KVState.open(path, pack=pack, kv=eng.kv.dtype)
    assert state.tokens == t[:CUT].tolist() and state.kv == eng.kv.dtype
    res = eng.run(t[CUT:], logits="all", resume=(state, CUT))
    assert res.restored == CUT and res.stats.tokens == N - CUT
    assert torch.equal(res.logits, full.logits[CUT:])
    # the plan counted the whole length: the KV the read allocated is the full read's
    assert res.kv_bytes == full.kv_bytes


def test_host_held_kv_is_written_from_its_host_tensor(packs, tmp_path):
    """The host-held part of a PromptKV goes to the file as the host tensor itself (no copy
    through the device); the resident part is its device view."""
    pack, t = packs["qwen3moe"], tokens("qwen3moe")
    eng = engine(pack, kv_resident=5)

    def look(session, out):
        kv = session.kv
        start, pieces = layer_pieces(kv, 0)
        assert start == 0 and len(pieces[0]) == 2
        assert pieces[0][0].data_ptr() == kv.hosted[0][0].data_ptr()
        assert pieces[0][1].data_ptr() == kv.resident[0][0].data_ptr()
        return save_state(tmp_path / "h.kv", kv, pack=pack, tokens=t.tolist(), logits=out[-1])
    info = eng.run(t, logits="last", then=look).then
    held = (N - 5) * SHAPES["qwen3moe"].kv_bytes(1, "fp32") * SHAPES["qwen3moe"].n_layer
    assert info.host_bytes >= held


@pytest.mark.parametrize("kind", ["prompt-kv-host", "int8-host"])
def test_a_resumed_read_is_planned_for_its_own_tokens(packs, tmp_path, kind):
    """A short read after a long restored prefix (a question after a document) is planned as a
    prompt of its own length: its chunk, ring and the bytes it borrows from the cache are a
    fresh prompt's of that length, not those of the whole length (a long chunk's buffers lent
    out of the cache for a few tokens); the KV holds every position, and the logits equal the
    full read's bit for bit (its last chunk is the same Q tokens after the same saved ones)."""
    pack, t = packs["qwen3moe"], tokens("qwen3moe")
    Q = 6
    eng = engine(pack, **KINDS[kind])
    whole = t[:CUT + Q]
    full = eng.run(whole, logits="all")
    path = tmp_path / "s.kv"
    eng.run(t[:CUT], logits="last", then=save_after(path, pack, t[:CUT].tolist()))
    res = eng.run(whole[CUT:], logits="all",
                  resume=(KVState.open(path, pack=pack, kv=eng.kv.dtype), CUT))
    own, long = eng.plan(Q), eng.plan(CUT + Q)
    assert res.chunk == own.chunk == Q and long.chunk == 8
    got = [(p.ring_slots, p.borrow, p.loan_slots) for p in res.plan.participants]
    assert got == [(p.ring_slots, p.borrow, p.loan_slots) for p in own.participants]
    assert got != [(p.ring_slots, p.borrow, p.loan_slots) for p in long.participants]
    assert torch.equal(res.logits, full.logits[CUT:])
    assert eng.warmup(CUT + Q, start=CUT) >= 0 and eng.warmup(CUT + Q, start=CUT) == 0.0
    with pytest.raises(StrataError, match="at least one token after"):
        eng.warmup(CUT, start=CUT)


@pytest.mark.parametrize("kind", ["prompt-kv-host", "int8-host"])
def test_a_state_saved_inside_a_chunk_resumes_to_the_full_read(packs, tmp_path, kind):
    """A state saved at a length inside one of the full read's chunks (13: chunk 8..15), then
    resumed: the new tokens' logits equal the full read's up to the order of the softmax's sums.
    The full read's chunk attends the keys and values it computes as the cache keeps them, int8
    codes too, so the resumed read, which attends them as stored, sees the same values (before,
    an int8 chunk attended its own keys unrounded: the gap was int8's, max rel ~1e-2 here)."""
    pack, t = packs["qwen3moe"], tokens("qwen3moe")
    eng = engine(pack, **KINDS[kind])
    cut = 13
    full = eng.run(t, logits="all")
    path = tmp_path / "s.kv"
    eng.run(t[:cut], logits="last", then=save_after(path, pack, t[:cut].tolist()))
    res = eng.run(t[cut:], logits="all", resume=(KVState.open(path, pack=pack,
                                                              kv=eng.kv.dtype), cut))
    gap = float((res.logits - full.logits[cut:]).abs().max() / full.logits.abs().max())
    assert gap <= 1e-6, gap


def test_shared_prefix(packs, tmp_path):
    """--reuse: the longest common prefix is restored and the rest read; the saved prompt
    itself reads nothing (its logits travel in the state); a shorter one reads its last token
    again."""
    pack, t = packs["qwen3moe"], tokens("qwen3moe")
    eng = engine(pack)
    path = tmp_path / "s.kv"
    eng.run(t[:CUT], logits="last", then=save_after(path, pack, t[:CUT].tolist()))
    state = KVState.open(path, pack=pack)
    other = t.clone()
    other[CUT - 3] = (other[CUT - 3] + 1) % SHAPES["qwen3moe"].vocab
    assert state.prefix(t.tolist()) == CUT
    assert state.prefix(other.tolist()) == CUT - 3
    assert state.prefix(t[:CUT].tolist()) == CUT
    assert state.prefix(t[:10].tolist()) == 9
    n = state.prefix(other.tolist())
    full = eng.run(other, logits="all")
    res = eng.run(other[n:], logits="all", resume=(state, n))
    assert torch.allclose(res.logits, full.logits[n:], rtol=0, atol=1e-5)
    same = eng.run(torch.zeros(0, dtype=torch.int64), logits="last", resume=(state, CUT))
    assert torch.equal(same.logits, state.logits()) and same.stats.tokens == 0


def test_a_sliding_layer_limits_the_prefix(packs, tmp_path):
    """GPT-OSS's sliding layers keep their last W - 1 = 4 positions: a prefix that ends more
    than that before the saved end cannot be rebuilt, so nothing is reused."""
    pack, t = packs["gpt-oss"], tokens("gpt-oss")
    eng = engine(pack)
    path = tmp_path / "s.kv"
    eng.run(t[:CUT], logits="last", then=save_after(path, pack, t[:CUT].tolist()))
    state = KVState.open(path, pack=pack)
    assert state.manifest["starts"] == [CUT - 4, 0, CUT - 4, 0]
    assert state.prefix(t.tolist()) == CUT
    assert state.prefix(t[:10].tolist()) == 0
    with pytest.raises(StrataError, match="sliding"):
        state.rows(0, 0, 0, 3)


@pytest.mark.parametrize("arch", HYBRIDS)
def test_a_hybrid_saves_its_recurrent_state(packs, arch, tmp_path):
    """Each linear layer's conv state and S go to the file as they stand after the prompt's
    last token, named in the manifest with their dtypes; the full layers keep their KV."""
    pack, t, shape = packs[arch], tokens(arch), SHAPES[arch]
    eng = engine(pack, kv="int8", kv_resident=5)
    path = tmp_path / "s.kv"

    def save(session, out):
        states = session.kv.states
        return (save_state(path, session.kv, pack=pack, tokens=t[:CUT].tolist(),
                           logits=out[-1]),
                {l: (states.conv[l].clone(), states.S[l].clone()) for l in states.S})
    _, live = eng.run(t[:CUT], logits="last", then=save).then
    state = KVState.open(path, pack=pack, kv="int8")
    lin = state.manifest["linear"]
    assert lin["layers"] == linear_layers(shape) == sorted(live)
    assert (lin["conv"]["dtype"], lin["S"]["dtype"]) == ("bf16", "fp32")
    for l, (conv, S) in live.items():
        assert torch.equal(state.state(l, "conv"), conv) and torch.equal(state.state(l, "S"), S)
        assert state.manifest["starts"][l] == CUT and f"kv.{l}.k" not in state._file.keys()
    full = [l for l in range(shape.n_layer) if l not in live]
    assert all(state.manifest["starts"][l] == 0 and f"kv.{l}.k_scale" in state._file.keys()
               for l in full)
    # a cache keeping another dtype is refused in one line
    other = type("Cache", (), {"states": RecurrentStates(shape, dtype=torch.float32,
                                                         devices="cpu")})()
    with pytest.raises(StrataError, match="saved conv state is bf16") as e:
        restore_states(other, state.state)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("arch", HYBRIDS)
def test_a_hybrid_reuses_only_the_whole_saved_prompt(packs, arch, tmp_path):
    """A recurrent state stands after the saved prompt's last token only: --reuse restores it
    when the saved prompt is a whole prefix of the new one (bit for bit a full read's logits),
    the saved prompt itself reads nothing, and any other prompt is read whole."""
    pack, t = packs[arch], tokens(arch)
    eng = engine(pack)
    path = tmp_path / "s.kv"
    eng.run(t[:CUT], logits="last", then=save_after(path, pack, t[:CUT].tolist()))
    state = KVState.open(path, pack=pack)
    other = t.clone()
    other[CUT - 3] = (other[CUT - 3] + 1) % SHAPES[arch].vocab
    assert state.prefix(t.tolist()) == CUT and state.prefix(t[:CUT].tolist()) == CUT
    assert state.prefix(other.tolist()) == 0 and state.prefix(t[:10].tolist()) == 0
    with pytest.raises(StrataError, match="after its 16 positions only"):
        state.restore(None, CUT - 3)
    full = eng.run(t, logits="all")
    res = eng.run(t[state.prefix(t.tolist()):], logits="all", resume=(state, CUT))
    assert torch.equal(res.logits, full.logits[CUT:]) and res.kv_bytes == full.kv_bytes
    same = eng.run(torch.zeros(0, dtype=torch.int64), logits="last", resume=(state, CUT))
    assert torch.equal(same.logits, state.logits()) and same.stats.tokens == 0
    # a prompt that leaves the saved one is read whole, from the zero state
    whole = eng.run(other, logits="all", resume=(state, state.prefix(other.tolist())))
    assert whole.restored == 0 and torch.equal(whole.logits, eng.run(other, logits="all").logits)


def _cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr()


@pytest.mark.parametrize("arch", list(SHAPES))
def test_cli_resident_resume(packs, tmp_path, capsys, arch):
    """`strata prefill --save-kv` then `--resume` on the all-resident path (the model's own
    KVCache / MLACache, the resident provider): the logits equal a full read's bit for bit."""
    pack, t = packs[arch], tokens(arch).tolist()
    _resident_resume(pack, t, tmp_path, capsys)


def _resident_resume(pack, t, tmp_path, capsys):
    ids = lambda xs: ",".join(map(str, xs))   # noqa: E731
    st, a, b = tmp_path / "s.kv", tmp_path / "a.npy", tmp_path / "b.npy"
    common = ["--device", "cpu", "--experts", "ref", "--chunk", "8"]
    rc, _ = _cli(capsys, "prefill", pack.path, "--tokens", ids(t[:CUT]), "--save-kv", st, *common)
    assert rc == 0 and st.exists()
    rc, out = _cli(capsys, "prefill", pack.path, "--tokens", ids(t[CUT:]), "--resume", st,
                   "--dump-logits", a, "--json", *common)
    assert rc == 0
    r = json.loads(out.out)["kv_state"]
    assert (r["restored"], r["read"]) == (CUT, N - CUT)
    rc, _ = _cli(capsys, "prefill", pack.path, "--tokens", ids(t), "--dump-logits", b, *common)
    assert np.array_equal(np.load(a), np.load(b)[CUT:])
    return st, ids, common


def test_cli_refusals(packs, tmp_path, capsys):
    """A state of another pack, dtype or tokenizer, and a file that is no state, are refused
    in one line (exit 2)."""
    pack = packs["qwen3moe"]
    st, ids, common = _resident_resume(pack, tokens("qwen3moe").tolist(), tmp_path, capsys)
    for argv, what in [((packs["deepseek2"].path, "--resume", st), "another pack"),
                       ((pack.path, "--resume", st, "--kv", "bf16"), "keeps fp32 KV"),
                       ((pack.path, "--resume", pack.path), "not a saved KV state"),
                       ((pack.path, "--reuse", tmp_path / "none.kv"), "no such file")]:
        rc = main(["prefill", str(argv[0]), "--tokens", "1,2", *map(str, argv[1:]), *common])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and what in err and "\n" not in err, err
    state = KVState.open(st, pack=pack)
    state.manifest["tokenizer"] = {"source": "hf:other", "crc": "00000000"}
    with pytest.raises(StrataError, match="another tokenizer"):
        state.check(pack, "fp32")


def test_the_write_is_atomic(packs, tmp_path, monkeypatch):
    """A save that fails part way through the file (a full disk) leaves nothing at the path:
    the temp file is removed."""
    from strata.engine import kv_state
    pack, t = packs["qwen3moe"], tokens("qwen3moe")
    eng = engine(pack)
    real, calls = kv_state._host_bytes, []

    def full_disk(p):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real(p)
    monkeypatch.setattr(kv_state, "_host_bytes", full_disk)
    path = tmp_path / "s.kv"
    with pytest.raises(StrataError, match="no space left"):
        eng.run(t[:8], logits="last", then=save_after(path, pack, t[:8].tolist()))
    assert len(calls) == 3 and not path.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["prompt-kv-host", "int8-host"])
def test_restore_reads_the_file_once(packs, tmp_path, kind):
    """A restore's rows are views of the file mapped once (no copy before the one into the
    stores), equal to safetensors' own reads; a part whose offset does not align to its dtype
    falls back to safetensors' copy (that path is the state's own reader on the others)."""
    from safetensors import safe_open
    pack, toks = packs["qwen3moe"], tokens("qwen3moe")
    p = tmp_path / "s.kv"
    engine(pack, **KINDS[kind]).run(toks[:CUT], logits="last", then=save_after(p, pack,
                                                                            toks[:CUT].tolist()))
    st = KVState.open(p, pack=pack)
    f = safe_open(str(p), framework="pt")
    buf = None
    views = 0
    for name in f.keys():
        if not name.startswith("kv."):
            continue
        _, layer, part = name.split(".")
        i = st.manifest["kv"]["parts"].index(part)
        got = st.rows(int(layer), i, 2, CUT)
        assert torch.equal(got, f.get_slice(name)[2:CUT]), name
        buf = st._map[0]
        lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel()
        views += lo <= got.data_ptr() < hi
    assert views > 0           # the aligned parts (all of them here, but for odd-sized ones)


class _SlowRows:
    """A state's `rows`, each host-held read (positions from 0) held back until `go` is set,
    or raising `fail` for layer `fail_layer`: what a restore beside the read sees of a file."""

    def __init__(self, rows, *, fail_layer=None):
        import threading
        self.rows, self.go, self.fail_layer = rows, threading.Event(), fail_layer
        self.served = []

    def __call__(self, layer, part, a, b):
        if a == 0 and part == 0:
            if layer == self.fail_layer:
                raise StrataError(f"layer {layer}: unreadable rows")
            self.go.wait(30)
            self.served.append(layer)
        return self.rows(layer, part, a, b)


def _saved(pack, tmp_path, kw):
    toks = tokens("qwen3moe")
    eng = engine(pack, **kw)
    full = eng.run(toks, logits="all")
    p = tmp_path / "s.kv"
    eng.run(toks[:CUT], logits="last", then=save_after(p, pack, toks[:CUT].tolist()))
    return eng, toks, full, p


@pytest.mark.parametrize("kind", ["prompt-kv-host", "int8-host"])
def test_host_rows_are_restored_beside_the_read(packs, tmp_path, kind):
    """restore returns with the resident rows up and the host-held ones still being written
    (the read's first stage of each layer waits for its rows); the new tokens' logits are the
    full read's bit for bit, and every layer's rows were served in layer order."""
    import threading
    pack = packs["qwen3moe"]
    eng, toks, full, p = _saved(pack, tmp_path, KINDS[kind])
    st = KVState.open(p, pack=pack, kv=eng.kv.dtype)
    slow = _SlowRows(st.rows)
    st.rows = slow
    threading.Timer(0.3, slow.go.set).start()
    res = eng.run(toks[CUT:], logits="all", resume=(st, CUT))
    assert res.restore_s < 0.3            # it did not wait for the held-back host rows
    assert slow.served == list(range(SHAPES["qwen3moe"].n_layer))
    assert torch.equal(res.logits, full.logits[CUT:])


def test_a_failed_host_restore_fails_the_read_and_leaves_the_cache(packs, tmp_path):
    """A layer whose host-held rows cannot be read fails the read with its one line; the
    engine's expert cache ends as it began and the next read runs."""
    pack = packs["qwen3moe"]
    eng, toks, full, p = _saved(pack, tmp_path, KINDS["prompt-kv-host"])
    part = eng.parts[0]
    before, index = part.cache.buffer.clone(), dict(part.cache.index)
    st = KVState.open(p, pack=pack, kv=eng.kv.dtype)
    slow = _SlowRows(st.rows, fail_layer=1)
    slow.go.set()
    st.rows = slow
    with pytest.raises(StrataError, match="layer 1: unreadable rows"):
        eng.run(toks[CUT:], logits="all", resume=(st, CUT))
    assert torch.equal(part.cache.buffer, before) and part.cache.index == index
    again = eng.run(toks, logits="all")
    assert torch.equal(again.logits, full.logits)


@pytest.mark.parametrize("flag", ["--resume", "--reuse"])
def test_cli_questions_after_one_saved_document(packs, tmp_path, capsys, flag):
    """`strata prefill --prompts-file Q --resume DOC` (or --reuse with the whole prompts): each
    question is read after the saved document, restored for each, in one engine; each one's
    last logits equal a full read of document + question (the streaming engine, KV partly in
    host memory). --save-kv and --pack-prompts with it are refused in one line."""
    pack, t = packs["qwen3moe"], tokens("qwen3moe").tolist()
    ids = lambda xs: ",".join(map(str, xs))   # noqa: E731
    common = ["--device", "cpu", "--experts", "ref", "--chunk", "8", "--ring", "2", "--vram",
              "1GiB", "--cache", 24 * pack.max_blob, "--kv-resident", "5", "--max-prompt", "64",
              "--no-warmup"]
    doc, qs = t[:CUT], [t[CUT:CUT + 3], t[CUT + 3:], t[CUT + 5:CUT + 13]]
    st = tmp_path / "doc.kv"
    rc, _ = _cli(capsys, "prefill", pack.path, "--tokens", ids(doc), "--save-kv", st, *common)
    assert rc == 0
    f = tmp_path / "q.txt"
    f.write_text("\n".join(ids(doc + q if flag == "--reuse" else q) for q in qs) + "\n")
    rc, out = _cli(capsys, "prefill", pack.path, "--prompts-file", f, flag, st, "--json",
                   *common)
    assert rc == 0, out.err
    reports = json.loads(out.out)
    assert [(r["kv_state"]["restored"], r["kv_state"]["read"]) for r in reports] == \
        [(CUT, len(q)) for q in qs]
    # each question's whole run (set-up, restore, read, tear-down) holds its read and restore
    assert all(r["run_s"] >= r["setup_s"] + r["kv_state"]["restore_s"] + r["seconds"]
               + r["teardown_s"] > 0 for r in reports)
    eng = PrefillEngine(Pack.open(pack.path), EngineConfig(
        vram=1 << 30, cache=24 * pack.max_blob, max_prompt=64, device="cpu", chunk=8, ring=2,
        ffn="ref", kv_resident=5))
    for r, q in zip(reports, qs):
        full = eng.run(torch.tensor(doc + q), logits="last").logits
        assert r["next_token"] == int(full[-1].argmax()), r
    for extra in (["--save-kv", tmp_path / "x.kv"], ["--pack-prompts"]):
        rc, out = _cli(capsys, "prefill", pack.path, "--prompts-file", f, flag, st, *extra,
                       *common)
        assert rc == 2 and "--prompts-file give --resume or --reuse alone" in out.err
        assert "\n" not in out.err.strip()


GPU_KINDS = {"model-cache-bf16": {}, "prompt-kv-host-bf16": {"kv_resident": 40},
             "int8-host": {"kv": "int8", "kv_resident": 40}}


@pytest.mark.gpu
@pytest.mark.parametrize("kind", list(GPU_KINDS))
def test_resume_equals_a_full_read_on_the_gpu(tmp_path, kind):
    """Issue 41 item 2 on the GPU: a saved prompt whose length is a whole number of the full
    read's chunks, resumed on the streaming engine (Triton FFNs and attention, CUDA copy lanes,
    the host part staged back), reads the new tokens from the same operands in the same order as
    the full read: the bound is 0, logits equal bit for bit (bf16 model cache; PromptKV bf16 and
    int8 with a host-held part). The KV's save and restore go through the GPU (the resident part)
    and pinned host memory (the rest)."""
    shape = get_preset("small")
    pack = Pack.open(synth_pack(tmp_path / "s.pack", shape, ExpertFormats.of("Q8_0"),
                                progress=False))
    n, cut, chunk = 160, 128, 64
    eng = PrefillEngine(pack, EngineConfig(vram=1 << 30, cache=40 * pack.max_blob,
                                           max_prompt=n, chunk=chunk, ring=5, ffn="auto",
                                           **GPU_KINDS[kind]))
    t = torch.randint(0, shape.vocab, (n,), generator=torch.Generator().manual_seed(11))
    full = eng.run(t, logits="all")
    path = tmp_path / "s.kv"
    eng.run(t[:cut], logits="last", then=save_after(path, pack, t[:cut].tolist()))
    res = eng.run(t[cut:], logits="all", resume=(KVState.open(path, pack=pack, kv=eng.kv.dtype),
                                                 cut))
    assert res.restored == cut and torch.isfinite(res.logits).all()
    assert torch.equal(res.logits, full.logits[cut:])
