"""``devices=[...]``: a fit that starts a process per device itself (the
notebook way) and returns as one process would; 2 CPU processes (gloo),
and the tests marked so again on two GPUs (NCCL) where there are two.

The processes' training itself is tested in test_data_parallel.py.
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from conftest import BACKENDS, DATA_PARALLEL_PARAMS, data_parallel_params
from sklearn.datasets import make_blobs

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._engine._loop import NonFiniteLossError
from skassoc.callbacks import Callback

PARAMS = dict(DATA_PARALLEL_PARAMS)

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed is missing"
)


def fit_workers():
    """The worker processes still running, but joblib's loky workers (a
    search's in another test of this process, kept for reuse)."""
    return [
        process
        for process in multiprocessing.active_children()
        if "Loky" not in type(process).__name__
    ]


@pytest.fixture(params=BACKENDS)
def pair(request):
    """``devices`` of two worker processes and their estimator's
    parameters: two CPU processes (gloo) or two GPUs (NCCL)."""
    devices = ["cpu", "cpu"] if request.param == "gloo" else [0, 1]
    return devices, data_parallel_params(request.param)


def test_devices_fits_in_a_process_per_device_like_one_process(
    blobs_for_workers, tmp_path, pair
):
    """The notebook way: ``devices`` starts the processes itself; a sliced
    memory map of float64 rows and string labels train on the same rows
    and classes as one process would."""
    X, y = blobs_for_workers
    y = np.where(y < 0, "-1", np.array(["a", "b", "c"])[y])
    path = tmp_path / "X.dat"
    whole = np.memmap(path, dtype=np.float64, mode="w+", shape=(len(X) + 10, 5))
    whole[10:] = X
    whole.flush()
    sliced = np.memmap(path, dtype=np.float64, mode="r", shape=whole.shape)[10:]
    devices, params = pair
    params["max_iter"] = 30
    spread = SemiSupervisedAssociationClassifier(**params, devices=devices)
    spread.fit(sliced, y)
    one = SemiSupervisedAssociationClassifier(**params).fit(X, y)
    assert list(spread.classes_) == list(one.classes_) == ["a", "b", "c"]
    assert spread.n_iter_ == 30
    assert spread.device_ == one.device_ == torch.device(params["device"])
    for name, tensor in one.model_.state_dict().items():
        torch.testing.assert_close(
            spread.model_.state_dict()[name], tensor, rtol=1e-4, atol=1e-5
        )
    np.testing.assert_array_equal(spread.predict(X), one.predict(X))


def test_a_failing_worker_raises_in_the_caller_and_changes_nothing(
    blobs_for_workers, pair
):
    X, y = blobs_for_workers
    devices, params = pair
    clf = SemiSupervisedAssociationClassifier(**params, max_iter=5).fit(X, y)
    weights = [t.clone() for t in clf.model_.state_dict().values()]
    clf.set_params(devices=devices, learning_rate=1e30, max_iter=30)
    # The processes' own error, as one process raises it, caused by the
    # worker's traceback (as multiprocessing's pools show theirs).
    with pytest.raises(NonFiniteLossError, match="NaN or infinite") as raised:
        clf.fit(X, y)
    assert "Traceback" in str(raised.value.__cause__)
    assert all(
        torch.equal(a, b) for a, b in zip(weights, clf.model_.state_dict().values())
    )


def test_a_script_that_fits_outside_a_main_guard_is_told_to_add_one(tmp_path):
    """Its workers import it again and fit at import, which Python refuses:
    the caller's error says what to change."""
    script = tmp_path / "fit_unguarded.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from sklearn.datasets import make_blobs
            from skassoc import SemiSupervisedAssociationClassifier

            X, y = make_blobs(60, centers=2, random_state=0)
            y[10:] = -1
            params = {{**{PARAMS!r}, "max_iter": 2}}
            clf = SemiSupervisedAssociationClassifier(**params, devices=["cpu"] * 2)
            clf.fit(X, y)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "bootstrapping phase" in done.stderr  # the worker's own error
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: A worker process of the fit on 2 devices")
    assert 'outside an `if __name__ == "__main__":` block' in last


@pytest.mark.parametrize(
    "exit_code, signal, started, main, hinted",
    [
        (1, None, False, ("script", "/x/fit.py"), True),
        (1, None, False, ("tool", "/x/tool.py"), True),  # python -m tool
        (-9, "SIGKILL", False, ("script", "/x/fit.py"), False),  # killed
        (1, None, True, ("script", "/x/fit.py"), False),  # died fitting
        (1, None, False, ("pytest.__main__", "/x/__main__.py"), False),
        (1, None, False, (None, None), False),  # a notebook
    ],
)
def test_the_main_guard_hint_is_given_only_for_a_failed_start_of_a_script(
    monkeypatch, exit_code, signal, started, main, hinted
):
    from types import ModuleType, SimpleNamespace

    from skassoc._engine import _spawn

    name, path = main
    module = ModuleType("__main__")
    module.__spec__ = None if name in (None, "script") else SimpleNamespace(name=name)
    if path is not None:
        module.__file__ = path
    monkeypatch.setitem(sys.modules, "__main__", module)
    exc = torch.multiprocessing.ProcessExitedException(
        "process 0 ended", 0, 123, exit_code, signal
    )
    hint = _spawn._main_guard_hint(exc, started)
    assert ("__name__" in hint) is hinted


class FailsInProcessOne(torch.nn.Module):
    """A network whose training passes fail in process 1 from the third on,
    as a GPU out of memory in one process would."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(5, 8)
        self.calls = 0

    def forward(self, x):
        if self.training and torch.distributed.get_rank() == 1:
            self.calls += 1
            if self.calls >= 3:
                raise torch.OutOfMemoryError("out of memory in process 1")
        return self.net(x)


def test_the_error_of_the_process_that_failed_first_reaches_the_caller(
    blobs_for_workers, pair, monkeypatch
):
    """Not process 0's failed collective (its peer left), which says less.

    On GPUs, process 0 waits in its NCCL collective (NCCL's timeout is
    minutes): the caller stops it once the grace after process 1's error
    has passed.
    """
    from skassoc._engine import _spawn

    X, y = blobs_for_workers
    devices, params = pair
    if devices != ["cpu", "cpu"]:  # CPU processes fail at once: no grace
        monkeypatch.setattr(_spawn, "_PEER_GRACE_SECONDS", 5)
    # Graph replays would not call the network's forward again.
    params.update(network=FailsInProcessOne(), max_iter=30, cuda_graph=False)
    clf = SemiSupervisedAssociationClassifier(**params, devices=devices)
    start = time.monotonic()
    with pytest.raises(torch.OutOfMemoryError, match="out of memory in process 1"):
        clf.fit(X, y)
    assert time.monotonic() - start < 60
    assert not fit_workers()


class FailsOneWaitsZero(torch.nn.Module):
    """Process 1 fails at its third training pass while process 0 is busy
    there (not yet in a collective), as a GPU process waits in an NCCL
    collective: process 0 does not notice its peer left."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(5, 8)
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == 3 and torch.distributed.get_rank() == 1:
                raise torch.OutOfMemoryError("out of memory in process 1")
            if self.calls == 3:
                time.sleep(60)
        return self.net(x)


def test_peers_of_a_failed_process_are_stopped_after_a_grace(
    blobs_for_workers, monkeypatch
):
    from skassoc._engine import _spawn

    monkeypatch.setattr(_spawn, "_PEER_GRACE_SECONDS", 1)
    X, y = blobs_for_workers
    params = {**PARAMS, "network": FailsOneWaitsZero(), "max_iter": 30}
    clf = SemiSupervisedAssociationClassifier(**params, devices=["cpu", "cpu"])
    start = time.monotonic()
    with pytest.raises(torch.OutOfMemoryError, match="out of memory in process 1"):
        clf.fit(X, y)
    assert time.monotonic() - start < 40  # not the 60 s process 0 waits


class NeedsTwoArguments(Exception):
    """An error that pickles but cannot be rebuilt (its ``args`` are one
    message, its ``__init__`` takes two)."""

    def __init__(self, what, where):
        super().__init__(f"{what} in {where}")


class RaisesUnrebuildable(Callback):
    def on_log(self, run):
        raise NeedsTwoArguments("a custom error", "a callback")


def test_an_error_the_caller_cannot_rebuild_keeps_its_message_and_traceback(
    blobs_for_workers,
):
    X, y = blobs_for_workers
    clf = SemiSupervisedAssociationClassifier(
        **PARAMS, max_iter=10, callbacks=[RaisesUnrebuildable()], devices=["cpu"] * 2
    )
    with pytest.raises(RuntimeError, match="cannot be rebuilt") as raised:
        clf.fit(X, y)
    # Its class, its message and where the worker raised it.
    assert "NeedsTwoArguments: a custom error in a callback" in str(raised.value)
    assert "in on_log" in str(raised.value.__cause__)
    assert clf.n_iter_ > 0  # as in one process, the steps done are kept


class FailsToSayWhat(Exception):
    def __str__(self):
        raise ValueError("no message")


class Unpicklable(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


class RaisesAtTheEnd(Callback):
    """Raises ``kind(*args)`` in ``on_fit_end`` (after training: the model
    is kept)."""

    def __init__(self, kind, *args):
        self.kind, self.args = kind, args

    def on_fit_end(self, run):
        raise self.kind(*self.args)


@pytest.mark.parametrize(
    ("error", "raised", "message"),
    [
        ((FailsToSayWhat,), FailsToSayWhat, None),
        ((Unpicklable, "holds a lock"), RuntimeError, "Unpicklable: holds a lock"),
    ],
)
def test_errors_that_do_not_print_or_pickle_reach_the_caller(
    blobs_for_workers, error, raised, message
):
    """As one process raises them, or named with their message; the model
    of the completed steps is kept either way."""
    X, y = blobs_for_workers
    clf = SemiSupervisedAssociationClassifier(
        **PARAMS, max_iter=10, callbacks=[RaisesAtTheEnd(*error)], devices=["cpu"] * 2
    )
    with pytest.raises(raised) as caught:
        clf.fit(X, y)
    if message is not None:
        assert message in str(caught.value)
    assert clf.n_iter_ == 10


class KeepsItsRun(Callback):
    """A callback that cannot be pickled once fitted (it keeps the run)."""

    def on_log(self, run):
        self.run = run


def test_process_zeros_warnings_and_state_come_back_whatever_its_callbacks(
    blobs_for_workers,
):
    X, y = blobs_for_workers
    y = y.copy()
    y[y == -1] = 0  # every sample labeled: fit warns that none is unlabeled
    params = {**PARAMS, "max_iter": 10}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        one = SemiSupervisedAssociationClassifier(**params).fit(X, y)
    clf = SemiSupervisedAssociationClassifier(
        **params, callbacks=[KeepsItsRun()], devices=["cpu", "cpu"]
    )
    with warnings.catch_warnings(record=True) as spread:
        warnings.simplefilter("always")
        clf.fit(X, y)
    assert clf.n_iter_ == one.n_iter_ == 10
    # The caller sees the warnings of one process, once, pointed at itself.
    expected = sorted((w.category, str(w.message)) for w in caught)
    assert expected and sorted((w.category, str(w.message)) for w in spread) == expected
    assert {w.filename for w in spread} == {__file__}


def test_the_workers_take_the_callers_warning_filters():
    from skassoc._engine._spawn import portable_filters, use_filters

    class LocalWarning(UserWarning):  # no module holds it: not sent
        pass

    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.filterwarnings("error", "no sample.*unlabeled", UserWarning, "skassoc")
        warnings.simplefilter("ignore", LocalWarning)
        warnings.filterwarnings("once", category=DeprecationWarning, lineno=3)
        caller = list(warnings.filters)
        portable = portable_filters()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            use_filters(portable)
            assert warnings.filters == [caller[0], caller[2]]
    # Python's own default filters name modules by plain strings, which
    # match exactly: kept so in the worker.
    with warnings.catch_warnings():
        warnings.filters[:] = [
            ("default", None, DeprecationWarning, "__main__", 0),
            ("ignore", None, DeprecationWarning, None, 0),
        ]
        portable = portable_filters()
        with warnings.catch_warnings(record=True) as caught:
            use_filters(portable)
            for module in ("__main__", "torch.foo", "__main__x"):
                warnings.warn_explicit("x", DeprecationWarning, "f.py", 1, module)
    assert [w.category for w in caught] == [DeprecationWarning]


def test_a_warning_the_caller_makes_an_error_fails_the_fit_in_the_workers(
    blobs_for_workers,
):
    """As in one process: at the input checks, before any training."""
    X, y = blobs_for_workers
    y = y.copy()
    y[y == -1] = 0  # every sample labeled: fit warns that none is unlabeled
    clf = SemiSupervisedAssociationClassifier(
        **PARAMS, max_iter=10, devices=["cpu", "cpu"]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with pytest.raises(UserWarning, match="unlabeled"):
            clf.fit(X, y)
    assert not hasattr(clf, "model_")


@pytest.mark.parametrize("kind", ["copy-on-write", "unnamed file", "deleted file"])
def test_memory_maps_the_workers_cannot_reopen_are_sent_as_arrays(tmp_path, kind):
    from skassoc._engine._spawn import _shared, _unshared

    path = tmp_path / "X.npy"
    np.save(path, np.arange(12.0).reshape(4, 3))
    if kind == "copy-on-write":
        X = np.load(path, mmap_mode="c")
        X += 100  # in this process only: the file keeps 0..11
    elif kind == "unnamed file":
        X = np.memmap(tempfile.TemporaryFile(), dtype=float, shape=(4, 3), mode="w+")
        X[:] = 7.0
    else:
        X = np.load(path, mmap_mode="r")
        path.unlink()
    entry = _shared(X)
    assert entry[0] == "shared"
    np.testing.assert_array_equal(_unshared(entry), X)


def test_a_read_only_memory_map_is_sent_by_its_file(tmp_path):
    from skassoc._engine._spawn import _shared

    np.save(tmp_path / "X.npy", np.arange(12.0).reshape(4, 3))
    assert _shared(np.load(tmp_path / "X.npy", mmap_mode="r"))[0] == "memmap"


def test_a_daemonic_process_is_told_it_cannot_start_workers(
    blobs_for_workers, monkeypatch
):
    from types import SimpleNamespace

    monkeypatch.setattr(
        multiprocessing, "current_process", lambda: SimpleNamespace(daemon=True)
    )
    X, y = blobs_for_workers
    clf = SemiSupervisedAssociationClassifier(**PARAMS, devices=["cpu", "cpu"])
    with pytest.raises(RuntimeError, match="a daemonic process"):
        clf.fit(X, y)
    assert not hasattr(clf, "model_")


class TouchesWhenTraining(Callback):
    """Creates ``path`` at its process's first log point."""

    def __init__(self, path):
        self.path = path

    def on_log(self, run):
        open(self.path, "a").close()


def _signalled_once_training(tmp_path, signum, pair):
    """A ``devices`` estimator of a long fit, and the file its workers
    create at their first log point; a thread sends ``signum`` to this
    process alone once it exists."""
    training = tmp_path / "training"
    devices, params = pair
    clf = SemiSupervisedAssociationClassifier(
        **params,
        max_iter=20_000,
        callbacks=[TouchesWhenTraining(training)],
        devices=devices,
    )

    def signal_once_training():
        deadline = time.monotonic() + 120
        while not training.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signum)  # this process only

    threading.Thread(target=signal_once_training, daemon=True).start()
    return clf, training


def test_a_ctrl_c_to_the_caller_alone_stops_the_workers_and_keeps_their_model(
    blobs_for_workers, tmp_path, pair
):
    """As a notebook's interrupt does: the workers never see the terminal's."""

    X, y = blobs_for_workers
    clf, training = _signalled_once_training(tmp_path, signal.SIGINT, pair)
    with pytest.raises(KeyboardInterrupt, match="interrupted after"):
        clf.fit(X, y)
    assert not fit_workers()
    # The model of the steps completed, as after a Ctrl-C in one process.
    assert 0 < clf.n_iter_ < clf.max_iter


@pytest.mark.parametrize(
    ("signum", "raised", "when"),
    [
        (signal.SIGINT, KeyboardInterrupt, "after"),
        (signal.SIGTERM, SystemExit, "after"),
        # Workers started after it must not inherit an ignored SIGTERM.
        (signal.SIGTERM, SystemExit, "before"),
    ],
)
def test_a_signal_while_the_workers_start_stops_every_worker(
    blobs_for_workers, monkeypatch, signum, raised, when
):
    from skassoc._engine import _spawn

    real_start = _spawn.mp.start_processes

    def start_then_signal(*args, **kwargs):
        if when == "before":
            signal.raise_signal(signum)
        processes = real_start(*args, **kwargs)
        if when == "after":
            signal.raise_signal(signum)
        return processes

    monkeypatch.setattr(_spawn.mp, "start_processes", start_then_signal)
    X, y = blobs_for_workers
    clf = SemiSupervisedAssociationClassifier(**PARAMS, devices=["cpu", "cpu"])
    with pytest.raises(raised):
        clf.fit(X, y)
    assert not fit_workers()
    assert not hasattr(clf, "model_")


def test_the_callers_signals_are_held_while_workers_start_then_raise():
    from skassoc._engine._spawn import _CallerSignals

    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with _CallerSignals() as signals:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGTERM)
            assert signals.held == [signal.SIGINT, signal.SIGTERM]  # not raised
            # Not ignored while workers start: they would inherit it.
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
            with pytest.raises(SystemExit) as exited:
                signals.running()  # the held SIGTERM acts first
            assert exited.value.code == 128 + signal.SIGTERM
            signal.raise_signal(signal.SIGTERM)  # ignored: the workers' stop
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with _CallerSignals() as signals:
            signals.running()
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        # A handler of the caller's own: held while starting, then its own.
        seen = []

        def own(signum, frame):
            seen.append(signum)

        signal.signal(signal.SIGTERM, own)
        with _CallerSignals() as signals:
            signal.raise_signal(signal.SIGTERM)
            assert seen == []
            signals.running()
            assert seen == [signal.SIGTERM]
            assert signal.getsignal(signal.SIGTERM) is own
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, previous_int)


def test_a_sigterm_to_the_caller_stops_the_workers_and_removes_their_folder(
    blobs_for_workers, tmp_path, monkeypatch, pair
):
    """As a job scheduler's time limit does: the caller exits (143), and
    leaves neither running workers nor their temporary folder behind."""

    X, y = blobs_for_workers
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    clf, training = _signalled_once_training(tmp_path, signal.SIGTERM, pair)
    with pytest.raises(SystemExit) as exited:
        clf.fit(X, y)
    assert exited.value.code == 128 + signal.SIGTERM
    assert training.exists()  # it came during training
    assert not fit_workers()
    assert list(temporary.iterdir()) == []
    assert not hasattr(clf, "model_")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_the_first_error_caught_is_the_one_raised():
    from skassoc._engine._runner import from_another_process
    from skassoc._engine._spawn import Outcome, _original_error

    late, early = OSError("late"), ValueError("early")
    told = from_another_process(RuntimeError("peer"))
    outcomes = [
        Outcome(None, late, 2.0),
        Outcome(None, None),
        Outcome(None, told, 0.5),
        Outcome(None, early, 1.0),
        Outcome(None, RuntimeError("ended without its result")),  # no time
    ]
    assert _original_error(outcomes) is early
    assert _original_error(outcomes[1:3]) is told  # nothing better to raise
    assert _original_error(outcomes[1:2]) is None


@pytest.mark.parametrize(
    "devices, match",
    [
        (["cpu", "mps"], "MPS backend is not available|GPUs only or CPUs only"),
        (["tpu"], "not a device torch knows"),
        ([99], "CUDA"),
        ([], "devices is empty"),
    ],
)
def test_bad_devices_are_refused_before_any_process_starts(
    blobs_for_workers, devices, match
):
    X, y = blobs_for_workers
    clf = SemiSupervisedAssociationClassifier(**PARAMS, devices=devices)
    with pytest.raises(ValueError, match=match):
        clf.fit(X, y)


def test_devices_passes_names_and_early_stopping_without_a_seed():
    """String labels, a DataFrame's names and early stopping without a seed
    reach the processes (which must draw one seed for all of them)."""
    pandas = pytest.importorskip("pandas")
    X, y = make_blobs(160, centers=3, n_features=5, random_state=0)
    y = np.array(["a", "b", "c"], dtype="<U2")[y]
    y[30:] = "-1"
    frame = pandas.DataFrame(X, columns=[f"f{k}" for k in range(5)])
    params = {**PARAMS, "max_iter": 20, "random_state": None, "early_stopping": True}
    clf = SemiSupervisedAssociationClassifier(**params, devices=["cpu", "cpu"])
    clf.fit(frame, y)
    assert list(clf.classes_) == ["a", "b", "c"]
    assert list(clf.feature_names_in_) == list(frame.columns)
