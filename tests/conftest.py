import importlib.metadata
import os

# Before torch loads its OpenMP runtime: idle OpenMP threads sleep instead of spinning. On a busy
# machine (2 cores shared with other jobs) the spinning threads starve the test itself, and small
# models then train 10-20 times slower; the thread count and every result stay the same. Subprocesses
# (CLI runs, spawned ranks) inherit it. A value set by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402
from packaging.requirements import Requirement  # noqa: E402


def _unmet_requirements(requirements: list[str]) -> list[str]:
    """Those of attnlab's requirements and its `test` extra's that this environment does not meet,
    each as `name spec (why)`; requirements of other extras are ignored."""
    unmet = []
    for line in requirements:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": "test"}):
            continue
        try:
            version = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            unmet.append(f"{req.name}{req.specifier} (not installed)")
            continue
        if not req.specifier.contains(version, prereleases=True):
            unmet.append(f"{req.name}{req.specifier} (found {version})")
    return unmet


DEVICES = ("cpu", "cuda")


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", choices=DEVICES,
                     help="where the device-dependent tests (those taking the `device` fixture; select them "
                          "with `-m device`) run: cpu (default) or cuda (benchmarks/gpu_check.py runs them so)")


def pytest_configure(config):
    config.addinivalue_line("markers", "device: takes the `device` fixture, so `--device cuda` moves it to a GPU "
                                       "(set on such tests automatically)")
    if config.getoption("--device") == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: no CUDA device is available to torch "
                                f"{torch.__version__} (a CPU build, or no driver); run with --device cpu")


def pytest_collection_modifyitems(config, items):
    # `-m device` selects exactly the tests that follow --device: the fixture is the mark
    for item in items:
        if "device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.device)


@pytest.fixture
def device(request) -> torch.device:
    """The device that `--device` names (cpu unless asked): device-dependent tests build their
    models, batches and runs there, so one suite checks the GPU path on a machine with a GPU."""
    return torch.device(request.config.getoption("--device"))


def pytest_sessionstart(session):
    # The parity tests import their reference libraries (transformers, tokenizers, tiktoken,
    # sacrebleu) plainly, so a missing one fails them instead of skipping them; this check says
    # so once, up front, with the fix, instead of one ImportError per test file.
    try:
        requirements = importlib.metadata.requires("attnlab") or []
    except importlib.metadata.PackageNotFoundError:
        raise pytest.UsageError("attnlab is not installed in this environment: run `make test`, "
                                "or `pip install -e '.[test]'` from the repository root") from None
    unmet = _unmet_requirements(requirements)
    if unmet:
        raise pytest.UsageError(f"the test install is incomplete: {', '.join(unmet)}; run `make test`, "
                                "or `pip install -e '.[test]'` from the repository root")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _auto_precision_is_fp32(monkeypatch):
    """`precision: auto` (the default) picks bf16 on a CPU with bf16 instructions: in tests it picks
    fp32 on every machine, so results compared with fp32 references do not depend on the CPU
    (tests/training/setup/test_precision.py mocks the capability both ways). Processes the tests start
    see the real capability."""
    from attnlab.training.setup import precision

    monkeypatch.setattr(precision, "native_bf16", lambda device: False)


@pytest.fixture(autouse=True)
def _ctrl_c_as_in_a_terminal():
    """A suite started in the background (`make test &`, nohup) inherits SIGINT ignored, and the
    trainer rightly leaves an ignored SIGINT alone; the Ctrl-C tests simulate a terminal, so each
    test starts with Python's default handler and ends with what it found."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    if before is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if before is signal.SIG_IGN:
        signal.signal(signal.SIGINT, before)


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """An empty $ATTNLAB_CACHE under tmp_path, and torch's thread count restored afterwards
    (runs may set train.threads)."""
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    yield tmp_path / "cache"
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for the module: tiny models on a shared, loaded machine run many times
    faster so (two spinning OpenMP threads fight the other processes for the cores). A module
    asks for it with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
