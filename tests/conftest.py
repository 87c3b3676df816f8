"""Shared test setup.

- `torch.empty`/`empty_like` return NaN-filled float tensors (fla's trick): memory a kernel never
  wrote shows up as NaN in the comparison instead of passing by luck.
- `@pytest.mark.gpu` tests skip cleanly without CUDA; they run on the device machine, the
  longest first by the last recorded suite's times (tests/suite_order.py).
- Hypothesis: no deadline (the interpreter is slow), a fixed CI profile.
- Under pytest-xdist each worker takes its share of the cores for torch's intra-op threads.
  torch's default, every core in every worker, oversubscribes them, and OpenMP's waiting threads
  stall the tiny CPU reads: a hybrid model's 150-token read took 0.1 s alone and 15 s beside two
  busy cores. Only the worker's own count: the processes a test starts keep their environment
  (test_distributed's spawned ranks abort under OMP_NUM_THREADS=1; they take the parent's count
  as an argument). Modules that want one thread at -n 0 as well name the `one_thread` fixture
  (`pytestmark = pytest.mark.usefixtures("one_thread")`).
- transformers' hybrids (Qwen3-Next, Qwen3.5) are imported here with fla-core hidden: at import,
  transformers swaps its torch delta rule for fla-core's whenever `fla` imports (so, with strata's
  fla backend installed, the references would be fla's bf16 kernels, or fail on the CPU). The
  references stay transformers' own torch forward (tests/models/test_hf_reference.py checks).
"""
import importlib
import os
import sys

import pytest
import torch
from hypothesis import settings

import strata._backend  # noqa: F401  (selects the Triton interpreter on a CPU-only machine)

settings.register_profile("ci", deadline=None, max_examples=60, derandomize=True,
                          print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# the transformers modules whose delta rule would resolve to fla-core's at their import
HF_DELTA_MODULES = ("transformers.models.qwen3_next.modeling_qwen3_next",
                    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
                    "transformers.models.qwen3_5.modeling_qwen3_5")


def _import_hf_hybrids_without_fla() -> None:
    if any(m in sys.modules for m in HF_DELTA_MODULES):
        return
    saved = sys.modules.get("fla")
    sys.modules["fla"] = None            # `import fla` raises ImportError while this holds
    try:
        for m in HF_DELTA_MODULES:
            try:
                importlib.import_module(m)
            except ImportError:          # no transformers (or no such model): nothing to pin
                pass
    finally:
        if saved is None:
            del sys.modules["fla"]
        else:
            sys.modules["fla"] = saved


_import_hf_hybrids_without_fla()

HAS_CUDA = torch.cuda.is_available()
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))   # xdist sets it in each worker
if WORKERS:
    _cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count() or 1)
    torch.set_num_threads(max(1, _cores // WORKERS))

@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests: their reads are tiny, and intra-op threads on a
    busy 2-core machine stall each product (3x and worse); the count comes back after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


_empty, _empty_like = torch.empty, torch.empty_like


def _poison(t):
    if t.is_floating_point():
        t.fill_(float("nan"))
    return t


def _nan_empty(*args, **kw):
    return _poison(_empty(*args, **kw))


def _nan_empty_like(*args, **kw):
    return _poison(_empty_like(*args, **kw))


@pytest.fixture(autouse=True)
def nan_poison(monkeypatch):
    monkeypatch.setattr(torch, "empty", _nan_empty)
    monkeypatch.setattr(torch, "empty_like", _nan_empty_like)
    yield


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        # the longest first (tests/suite_order.py); every xdist worker collects the same order
        from suite_order import longest_first, read_times
        items[:] = longest_first(items, read_times())
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (runs on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return torch.device("cuda" if HAS_CUDA else "cpu")


def pytest_runtest_logreport(report):
    """With STRATA_TEST_TIMES=FILE each test's call time (and setup time over 0.5 s) is appended to FILE as it finishes (in
    the xdist controller too), so a device run stopped at its time limit still says which tests
    took the time (`--durations` and junit files are written only at the end)."""
    path = os.environ.get("STRATA_TEST_TIMES")
    if path and report.when in ("setup", "call") and "PYTEST_XDIST_WORKER" not in os.environ:
        # setup too: a module fixture that builds weights costs its first test's setup
        if report.when == "setup" and report.duration < 0.5:
            return
        with open(path, "a") as f:
            f.write(f"{report.duration:.2f} {report.outcome} {report.when} {report.nodeid}\n")
