"""The TensorBoard callback: what its event files hold, and its life outside
a fit (clone, pickle, a missing tensorboard package)."""

import copy
import pickle
import sys

import numpy as np
import pytest
from sklearn.base import clone

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._tensorboard import TensorBoard


def _scalars(log_dir):
    """``{tag: (steps, values)}`` of the event files in ``log_dir``, as
    TensorBoard reads them (events a later file purges are left out)."""
    event_accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator"
    )
    accumulator = event_accumulator.EventAccumulator(str(log_dir))
    accumulator.Reload()
    scalars = {}
    for tag in accumulator.Tags()["scalars"]:
        events = accumulator.Scalars(tag)
        scalars[tag] = (
            [event.step for event in events],
            np.array([event.value for event in events], dtype=np.float32),
        )
    return scalars


def _expected(history, first=0, first_validation=0):
    """The scalars the callback writes for ``history`` from its entries
    ``first`` (and validations ``first_validation``) on."""
    steps = history["step"][first:]
    loss_names = [
        name
        for name in history
        if name not in ("step", "learning_rate", "validation_step", "validation_score")
    ]
    expected = {
        name if name == "learning_rate" else f"loss/{name}": (
            steps,
            np.float32(history[name][first:]),
        )
        for name in ["learning_rate", *loss_names]
    }
    if "validation_step" in history:
        expected["validation/score"] = (
            history["validation_step"][first_validation:],
            np.float32(history["validation_score"][first_validation:]),
        )
    return expected


def _assert_scalars_equal(scalars, expected):
    assert scalars.keys() == expected.keys()
    for tag, (steps, values) in expected.items():
        assert scalars[tag][0] == list(steps), tag
        np.testing.assert_array_equal(scalars[tag][1], values, err_msg=tag)


@pytest.fixture
def estimator(fast_params):
    def make(log_dir, **params):
        return SemiSupervisedAssociationClassifier(
            **{**fast_params, "callbacks": [TensorBoard(log_dir)], **params}
        )

    return make


def test_event_file_holds_the_history(estimator, blobs_semi, tmp_path):
    pytest.importorskip("tensorboard")
    clf = estimator(tmp_path).fit(*blobs_semi)
    assert "loss/total" in _expected(clf.history_)
    _assert_scalars_equal(_scalars(tmp_path), _expected(clf.history_))
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1


def test_validation_scores_are_written(estimator, blobs_semi, tmp_path):
    pytest.importorskip("tensorboard")
    clf = estimator(
        tmp_path, early_stopping=True, validation_interval=10, n_iter_no_change=100
    ).fit(*blobs_semi)
    assert len(clf.history_["validation_score"]) == 3
    _assert_scalars_equal(_scalars(tmp_path), _expected(clf.history_))


def test_continued_run_writes_only_its_own_steps(
    estimator, blobs, blobs_semi, tmp_path
):
    pytest.importorskip("tensorboard")
    first, second = tmp_path / "first", tmp_path / "second"
    # Validated without early stopping: the run's state is kept.
    X, y = blobs_semi
    validation = {"X_val": blobs[0][::5], "y_val": blobs[1][::5]}
    clf = estimator(first, validation_interval=10).fit(X, y, **validation)
    first_history = copy.deepcopy(clf.history_)
    clf.set_params(warm_start=True, max_iter=60, callbacks=[TensorBoard(second)])
    clf.fit(X, y, **validation)
    n_logged, n_validated = (len(first_history[n]) for n in ("step", "validation_step"))
    # The run was continued: its history starts with the first fit's.
    assert {name: values[:n_logged] for name, values in clf.history_.items()} == {
        name: values[:n_logged] for name, values in first_history.items()
    }
    assert clf.history_["step"][n_logged:] == [40, 50, 60]
    expected = _expected(clf.history_, n_logged, n_validated)
    assert len(expected["validation/score"][0]) == 3
    _assert_scalars_equal(_scalars(second), expected)


def test_continued_run_hides_the_steps_it_writes_again(estimator, blobs_semi, tmp_path):
    # A run went on to step 60 from the state of step 30 and crashed; the
    # state is continued in the same directory.
    pytest.importorskip("tensorboard")
    state_fit = estimator(tmp_path / "state").fit(*blobs_semi)
    crashed = estimator(tmp_path / "crashed", max_iter=60, learning_rate=0.1)
    crashed_history = crashed.fit(*blobs_semi).history_
    # TensorBoard reads a directory's files in name order, which starts with
    # the time in seconds: the crashed run's file goes first.
    [events] = (tmp_path / "crashed").iterdir()
    events.rename(tmp_path / "events.out.tfevents.0000000000.crashed")
    state_fit.set_params(
        warm_start=True, max_iter=60, callbacks=[TensorBoard(tmp_path)]
    )
    history = state_fit.fit(*blobs_semi).history_
    steps, values = _scalars(tmp_path)["loss/total"]
    assert steps == history["step"] == crashed_history["step"]
    # Up to the state: the crashed run's curve; then the continued run's.
    np.testing.assert_array_equal(values[:3], np.float32(crashed_history["total"][:3]))
    np.testing.assert_array_equal(values[3:], np.float32(history["total"][3:]))


class _CtrlC:
    """A callback that presses Ctrl-C at the first log point."""

    def on_log(self, run):
        raise KeyboardInterrupt


def test_interrupted_fit_writes_its_last_losses(estimator, blobs_semi, tmp_path):
    # The Ctrl-C comes before the TensorBoard callback sees the log point,
    # whose losses the history keeps: they are written when the fit ends.
    pytest.importorskip("tensorboard")
    clf = estimator(tmp_path)
    clf.callbacks.insert(0, _CtrlC())
    with pytest.raises(KeyboardInterrupt):
        clf.fit(*blobs_semi)
    assert clf.history_["step"] == [10]
    _assert_scalars_equal(_scalars(tmp_path), _expected(clf.history_))


def test_default_directory_takes_the_comment(estimator, blobs_semi, tmp_path):
    pytest.importorskip("tensorboard")
    clf = estimator(None)
    clf.callbacks[0].comment = "_blobs"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        clf.fit(*blobs_semi)
    [run_dir] = (tmp_path / "runs").iterdir()
    assert run_dir.name.endswith("_blobs")
    _assert_scalars_equal(_scalars(run_dir), _expected(clf.history_))


def test_clone_and_pickle_before_and_after_a_fit(estimator, blobs_semi, tmp_path):
    pytest.importorskip("tensorboard")
    clf = estimator(tmp_path / "a")
    callback = clf.callbacks[0]
    for copied in (
        clone(clf).callbacks[0],
        pickle.loads(pickle.dumps(clf)).callbacks[0],
        pickle.loads(pickle.dumps(callback)),
    ):
        assert copied is not callback
        assert (copied.log_dir, copied.comment) == (tmp_path / "a", "")
    clf.fit(*blobs_semi)
    assert callback._writer is None
    assert pickle.loads(pickle.dumps(clf)).callbacks[0].log_dir == tmp_path / "a"
    # A clone of the used callback writes its own fit.
    other = clone(clf)
    other.callbacks[0].log_dir = tmp_path / "b"
    other.fit(*blobs_semi)
    assert callback.log_dir == tmp_path / "a"
    _assert_scalars_equal(_scalars(tmp_path / "b"), _expected(other.history_))
    _assert_scalars_equal(_scalars(tmp_path / "a"), _expected(clf.history_))


def test_an_open_writer_is_not_copied(tmp_path):
    # A fit whose later callback's on_fit_begin raised leaves it open.
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    callback = TensorBoard(tmp_path)
    callback._writer = SummaryWriter(str(tmp_path))
    try:
        for copied in (copy.deepcopy(callback), pickle.loads(pickle.dumps(callback))):
            assert copied._writer is None
            assert copied.log_dir == tmp_path
    finally:
        callback._writer.close()


def test_only_process_0_of_a_data_parallel_fit_writes(estimator, tmp_path):
    pytest.importorskip("tensorboard")
    from skassoc.callbacks import TrainingRun

    history = {"step": [10], "total": [1.0], "learning_rate": [0.1]}
    for rank in (1, 0):
        callback = TensorBoard(tmp_path / f"rank{rank}")
        run = TrainingRun(
            estimator, None, 10, history, {}, loss_names=("total",), rank=rank
        )
        run.world_size = 2
        callback.on_fit_begin(run)
        callback._n_logged = 0  # the entry above is this run's
        callback.on_log(run)
        callback.on_fit_end(run)
    assert not (tmp_path / "rank1").exists()
    assert list(_scalars(tmp_path / "rank0")) == ["loss/total", "learning_rate"]


def test_repr():
    assert repr(TensorBoard()) == "TensorBoard()"
    assert repr(TensorBoard("runs/a", comment="_x")) == (
        "TensorBoard('runs/a', comment='_x')"
    )


def test_missing_tensorboard_package(estimator, blobs_semi, tmp_path, monkeypatch):
    # As without the package: torch.utils.tensorboard imports it first.
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    clf = estimator(tmp_path)
    with pytest.raises(ImportError, match=r'pip install "skassoc\[tensorboard\]"'):
        clf.fit(*blobs_semi)
    assert not hasattr(clf, "history_")
    assert pickle.loads(pickle.dumps(clf.callbacks[0]))._writer is None
    assert list(tmp_path.iterdir()) == []
