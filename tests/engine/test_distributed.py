"""The layer split as a torch.distributed pipeline (strata.engine.distributed), on CPU gloo.

Cases and why each exists:
- two ranks, both schedules, chunk 16 over 37 tokens (an uneven last chunk): the last rank's
  logits equal the single-process split engine's bit for bit (same dtype, same cache, ring and
  passes: the same expert path), and each rank's cache ends byte for byte as it started;
- the agreed chunk (min of each rank's own scan, then forced) equals the single-process plan
  of the whole rig, participant by participant, over random rigs (plan = engine per rank);
- rank 1 fails mid-prompt (an injected allocation failure): both ranks raise the same line,
  both caches are restored, nothing hangs (the spawn is bounded by a timeout); each schedule
  spawns its two ranks once for both reads (a fresh engine per read, one process group);
- the CLI under torchrun: the two ranks' logits equal the one-process read's; and when one
  rank's budget does not fit, both rank processes print the same one-line error and exit 2.
  That failure case launches the two ranks itself with torchrun's environment contract (RANK,
  WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT): torchrun's agent SIGTERMs the surviving rank 0.1 s
  after the first one exits, so on a loaded machine the slower rank's line could be cut before
  it was printed (a flaky count of one line, not a strata fault); each rank's own exit code and
  stderr are checked instead.
"""
import json
import os
import socket
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from strata.engine.prefill import EngineConfig, PrefillEngine
from strata.packs.synth import ExpertFormats, synth_pack
from strata.shapes import get_preset

SHAPE = get_preset("tiny").with_(n_layer=4)
T = 37
SPAWN_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    fmts = [ExpertFormats.of("Q8_0"), ExpertFormats.of("Q4_0", down="Q8_0")] * 2
    return synth_pack(tmp_path_factory.mktemp("p") / "tiny4.pack", SHAPE, fmts, progress=False)


def tokens():
    return torch.randint(0, SHAPE.vocab, (T,), generator=torch.Generator().manual_seed(7))


def config(pack, vram=1 << 30, **kw):
    from strata.packs import Pack
    kw.setdefault("chunk", 16)
    kw.setdefault("ring", 3)    # < E = 8: a layer streams in several passes
    return EngineConfig(vram=vram, cache=16 * Pack.open(pack).max_blob, max_prompt=64,
                        device="cpu", ffn="ref", **kw)


def _worker(rank, world, port, pack, out, schedule, fail_ranks, threads):
    """One rank: a read per entry of `fail_ranks` (the rank that fails it, -1: none), each on a
    fresh StageEngine in one process group; rank{r}-{i}.json per read."""
    from strata.engine.distributed import DistConfig, StageEngine, init, leave
    done = 0
    try:
        torch.set_num_threads(threads)   # the parent's: a CPU GEMM's sums split by thread
        r, w, dev = init("gloo", 60, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                         world=world)
        for i, fail_rank in enumerate(fail_ranks):
            eng = StageEngine(pack, config(pack), DistConfig(schedule=schedule, timeout_s=60),
                              rank=r, world=w, device=dev)
            before = eng.cache.buffer.clone()
            res = {"rank": r, "layers": [eng.layers.start, eng.layers.stop]}
            try:
                got = eng.run(tokens(), logits="all",
                              fail_after_layers=3 if r == fail_rank else None)
                res["chunk"] = got.chunk
                if got.logits is not None:
                    torch.save(got.logits, Path(out) / f"logits-{i}.pt")
            except Exception as e:   # noqa: BLE001 — the test compares what every rank raised
                res["error"] = f"{type(e).__name__}: {e}"
            res["restored"] = bool(torch.equal(before, eng.cache.buffer))
            (Path(out) / f"rank{r}-{i}.json").write_text(json.dumps(res))
            done += 1
            del eng
    except Exception:   # noqa: BLE001
        for i in range(done, len(fail_ranks)):
            (Path(out) / f"rank{rank}-{i}.json").write_text(
                json.dumps({"crash": traceback.format_exc()}))
        raise
    # as `strata prefill --distributed` leaves: no interpreter teardown (gloo's worker threads
    # aborted a rank there after every file here was written: two spawns of one full run)
    leave()


def spawn(pack, out, schedule="sequential", fail_ranks=(-1,), world=2):
    """[[rank 0's result, rank 1's, ...] per read]: one spawn of `world` ranks for all reads
    (the spawn and the imports are most of a read's cost on the CPU)."""
    ctx = mp.start_processes(_worker, args=(world, free_port(), str(pack), str(out), schedule,
                                            list(fail_ranks), torch.get_num_threads()),
                             nprocs=world, join=False, start_method="spawn")
    import time
    t0 = time.time()
    while not ctx.join(timeout=5):
        if time.time() - t0 > SPAWN_TIMEOUT_S:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the ranks did not finish within {SPAWN_TIMEOUT_S} s (a hang)")
    return [[json.loads((Path(out) / f"rank{r}-{i}.json").read_text()) for r in range(world)]
            for i in range(len(fail_ranks))]


CLEAN, RANK1_FAILS = 0, 1    # the reads of one spawn per schedule: fail_ranks (-1, 1)


@pytest.fixture(scope="module")
def spawned(pack, tmp_path_factory):
    """schedule -> (its reads' per-rank results, their folder): both ranks spawned once per
    schedule for the clean read and the read that rank 1 fails."""
    got = {}

    def get(schedule):
        if schedule not in got:
            out = tmp_path_factory.mktemp(schedule)
            got[schedule] = spawn(pack, out, schedule, fail_ranks=(-1, 1)), out
        return got[schedule]
    return get


@pytest.fixture(scope="module")
def single(pack):
    """The single-process split: two participants, the same rig, the same chunk."""
    eng = PrefillEngine(pack, config(pack, vram=[1 << 30, 1 << 30]))
    return eng.run(tokens(), logits="all")


@pytest.mark.parametrize("schedule", ["sequential", "pipelined"])
def test_two_ranks_equal_single_process(single, spawned, schedule):
    reads, out = spawned(schedule)
    ranks = reads[CLEAN]
    for r in ranks:
        assert "crash" not in r, r.get("crash")
        assert "error" not in r, r["error"]
        assert r["restored"]
        assert r["chunk"] == single.chunk
    assert [r["layers"] for r in ranks] == [[0, 2], [2, 4]]
    logits = torch.load(out / f"logits-{CLEAN}.pt")
    assert logits.dtype == single.logits.dtype
    assert torch.equal(logits, single.logits)


@pytest.mark.parametrize("schedule", ["sequential", "pipelined"])
def test_a_failing_rank_fails_every_rank(spawned, schedule):
    ranks = spawned(schedule)[0][RANK1_FAILS]
    errors = [r.get("error") for r in ranks]
    assert all(r["restored"] for r in ranks)
    assert errors[0] is not None and errors[0] == errors[1]
    assert errors[0].startswith("StrataError: rank 1 of 2: injected allocation failure")
    assert "\n" not in errors[0]


# -- the agreed chunk is the single-process plan of the whole rig ---------------------------
MiB = 1 << 20


def _agreed(layout, parts, cfg, n_tokens, **kw):
    """What every rank of a distributed read plans (StageEngine.plan without the processes):
    its own scan, the gathered answers (a fake all-gather), then the agreed chunk forced, or
    the joint plan of the gathered participants when a rank fell back."""
    from dataclasses import replace

    from strata.engine.distributed import agree_chunk
    from strata.engine.prompt_plan import plan_prompt
    from strata.errors import StrataError
    every = []
    for p in parts:
        try:
            alone = plan_prompt(layout, [p], cfg, n_tokens=n_tokens, **kw)
            every.append((alone.scan_chunk, alone.rule, None if alone.fits else "does not fit"))
        except StrataError as e:
            every.append((0, "error", str(e)))
    chunk = agree_chunk(every)
    if chunk is None:
        joint = plan_prompt(layout, parts, cfg, n_tokens=n_tokens, **kw)
        return [(joint.chunk, joint.participants[r]) for r in range(len(parts))]
    out = []
    for p in parts:
        plan = plan_prompt(layout, [p], replace(cfg, chunk=chunk), n_tokens=n_tokens, **kw)
        out.append((plan.chunk, plan.participants[0]))
    return out


@settings(max_examples=60, deadline=None)
@given(vram=st.lists(st.integers(2, 64), min_size=2, max_size=4),
       n_tokens=st.integers(1, 4096), lend_cap=st.sampled_from([0.5, 0.9, 1.0]),
       pinned=st.booleans(), ring=st.sampled_from([None, 2, 7]))
@example(vram=[64, 3], n_tokens=4096, lend_cap=0.9, pinned=True, ring=None).via(
    "a small rank binds the chunk the big one would have read")
@example(vram=[8, 8, 8], n_tokens=5, lend_cap=0.9, pinned=True, ring=None).via(
    "a prompt shorter than the chunk: every ring re-resolved for it")
def test_agreed_chunk_is_the_single_process_plan(pack, vram, n_tokens, lend_cap, pinned, ring):
    from strata.engine.prompt_plan import plan_inputs, plan_prompt
    from strata.errors import StrataError
    from strata.packs import Pack
    pk = Pack.open(pack)
    cfg = EngineConfig(vram=[v * MiB for v in vram], lend_cap=lend_cap, max_prompt=4096,
                       reserve=MiB, ring=ring, scan_max=4096, ffn="ref")
    blobs = [pl.blob_size for pl in pk.layers]
    if len(vram) > SHAPE.n_layer:
        return
    try:
        parts, _, layout, fused = plan_inputs(SHAPE, blobs, pk.native, cfg, "cuda")
    except StrataError:
        event("no room for a cache")
        return   # a rank with no room for a cache: refused before any plan, on every path
    kw = dict(pinned=pinned, fused=fused, native=pk.native)
    try:
        joint = plan_prompt(layout, parts, cfg, n_tokens=n_tokens, **kw)
    except StrataError:
        event("nothing fits")
        with pytest.raises(StrataError):
            _agreed(layout, parts, cfg, n_tokens, **kw)
        return
    event(f"joint rule {joint.rule}")
    ranks = _agreed(layout, parts, cfg, n_tokens, **kw)
    for r, (chunk, pp) in enumerate(ranks):
        assert chunk == joint.chunk
        assert pp == joint.participants[r]


# -- the CLI under torchrun -------------------------------------------------------------------
CLI_TIMEOUT_S = 600   # a hang guard: two torch imports + a read on a loaded 2-core machine


def _env(**kw):
    """The ranks' environment: this tree first on the path, then whatever the caller's had (the
    device machine's carried wheels)."""
    path = os.pathsep.join(p for p in (str(Path(__file__).parents[2]),
                                       os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, **kw)


def ranks_said(stderr: str) -> str:
    """What a failed torchrun's ranks said (their error lines: torchrun's own traceback, the
    tail of stderr, names only the signal), then that tail."""
    keys = ("terminate", "Error", "error:", "Traceback", "abort", "RANK")
    said = [ln for ln in stderr.splitlines() if any(k in ln for k in keys)]
    return "\n".join(said[:40]) + "\n...\n" + stderr[-1200:]


def torchrun(*argv, nproc=2):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                           str(nproc), "--master-port", str(free_port()), "-m", "strata",
                           "prefill", *map(str, argv), "--distributed"],
                          capture_output=True, text=True, env=_env(), timeout=CLI_TIMEOUT_S)


def ranks(*argv, world=2):
    """`strata prefill ... --distributed` as `world` rank processes in torchrun's environment
    (env:// rendezvous), without torchrun's agent: every rank runs to its own exit.
    [(returncode, stdout, stderr)] per rank."""
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "strata", "prefill", *map(str, argv),
                               "--distributed"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True,
                              env=_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                                       LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=port))
             for r in range(world)]
    try:
        got = []
        for p in procs:
            out, err = p.communicate(timeout=CLI_TIMEOUT_S)
            got.append((p.returncode, out, err))
        return got
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def one_process(*argv, out):
    """The same read in one process, its two participants' budgets split as the ranks' are
    (`--vram 1GiB` twice): the logits `strata prefill ... --dump-logits out` writes."""
    import numpy as np
    got = subprocess.run([sys.executable, "-m", "strata", "prefill", *map(str, argv), "--vram",
                          "1GiB", "--vram", "1GiB", "--dump-logits", str(out)],
                         capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=_env())
    assert got.returncode == 0, got.stderr[-2000:]
    return np.load(out)


def test_cli_logits_equal_the_one_process_read(pack, tmp_path):
    common = [pack, "--prompt-tokens", T, "--cache", "100KiB", "--chunk", 16, "--ring", 3,
              "--experts", "ref", "--force"]
    got = torchrun(*common, "--vram", "1GiB", "--dist-schedule", "pipelined", "--json",
                   "--dump-logits", tmp_path / "d.npy")
    assert got.returncode == 0, ranks_said(got.stderr)
    report = json.loads(got.stdout.strip().splitlines()[-1])
    assert report["world"] == 2 and report["schedule"] == "pipelined"
    # the ranks warmed up together first (a dry prompt through the same plan): the logits below
    # are still exactly the one-process read's, so the warm-up left every cache as it was
    assert report["warmed"] and report["warmup_s"] > 0
    assert report["ranks"][0]["handoff_bytes"] == T * SHAPE.d_model * 4   # fp32 on the CPU
    import numpy as np
    a, b = np.load(tmp_path / "d.npy"), one_process(*common, out=tmp_path / "s.npy")
    assert a.dtype == b.dtype and (a == b).all()


def test_cli_one_rank_that_does_not_fit_fails_both_with_one_line(pack):
    # rank 1's VRAM leaves a cache too small for any chunk; rank 0's is ample
    got = ranks(pack, "--prompt-tokens", T, "--vram", "2GiB", "--vram", "1048760KiB",
                "--experts", "ref")
    lines = []
    for rc, out, err in got:
        assert rc == 2, err[-2000:]
        assert out == ""
        # each rank says one line and nothing else: no frame of strata's code, no exception type
        mine = err.strip().splitlines()
        assert len(mine) == 1 and mine[0].startswith("strata prefill: "), err[-2000:]
        assert "/strata/" not in err and "StrataError" not in err
        lines += mine
    assert lines[0] == lines[1]
    assert lines[0].startswith("strata prefill: rank 1 of 2: nothing fits")


def test_cli_plane_experts_equal_the_one_process_read(pack, tmp_path):
    """--experts plane: each rank re-lays its blobs as planes as they land (its cache and its
    ring) and runs the plane GEMM; the logits are exactly the one-process plane read's. 20
    tokens: two chunks of 16, the last short, as T's three are (T's third chunk of interpreted
    plane GEMMs cost ~7 s)."""
    common = [pack, "--prompt-tokens", 20, "--cache", "100KiB", "--chunk", 16, "--ring", 3,
              "--experts", "plane", "--force", "--device", "cpu", "--no-warmup"]
    got = ranks(*common, "--vram", "1GiB", "--dump-logits", tmp_path / "d.npy")
    for r, (rc, out, err) in enumerate(got):
        assert rc == 0, f"rank {r}: {err[-2000:]}"
    import numpy as np
    a, b = np.load(tmp_path / "d.npy"), one_process(*common, out=tmp_path / "s.npy")
    assert np.isfinite(b).all() and a.dtype == b.dtype and (a == b).all()


def test_cli_text_prompt_is_tokenized_as_in_one_process(pack, tmp_path):
    """--prompt goes through the pack's tokenizer on every rank (not random ids): the report
    says so and the logits are exactly the one-process read's."""
    text = "The ring of VRAM slots streams experts while the kernels compute."
    common = [pack, "--prompt", text, "--cache", "100KiB", "--chunk", 8, "--ring", 3,
              "--experts", "ref", "--force", "--device", "cpu"]
    got = ranks(*common, "--vram", "1GiB", "--json", "--dump-logits", tmp_path / "d.npy",
                "--no-warmup")
    for r, (rc, out, err) in enumerate(got):
        assert rc == 0, f"rank {r}: {err[-2000:]}"
    report = json.loads(got[-1][1].strip().splitlines()[-1])
    assert not report["warmed"] and report["warmup_s"] == 0.0
    from strata.packs import Pack
    from strata.tokenize import pack_tokenizer
    ids = pack_tokenizer(Pack.open(pack)).encode(text)
    assert report["prompt"]["source"] == "--prompt"
    assert report["n_tokens"] == report["prompt"]["n_tokens"] == len(ids)
    import numpy as np
    a, b = np.load(tmp_path / "d.npy"), one_process(*common, out=tmp_path / "s.npy")
    assert a.shape[0] == len(ids) and (a == b).all()


@pytest.mark.parametrize("flag", ["--prompts-file", "--trace"])
def test_cli_many_prompts_are_refused_in_one_line(pack, tmp_path, flag, capsys):
    from strata.cli import main
    f = tmp_path / "p.txt"
    f.write_text("1,2,3\n")
    one = [] if flag == "--prompts-file" else ["--prompt-tokens", "4"]
    assert main(["prefill", str(pack), flag, str(f), *one, "--vram", "1GiB",
                 "--distributed"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flag} does not go with --distributed" in err[0], err
