"""The training engine's seams: callbacks, stopping, resuming a run."""

import copy
import pickle

import numpy as np
import pytest
import torch
from sklearn.base import clone

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._engine._loop import NonFiniteLossError
from skassoc.callbacks import Callback

pytestmark = pytest.mark.usefixtures("torch_single_thread")


class Recorder(Callback):
    """Records every hook call with what the run showed."""

    def __init__(self):
        self.calls = []

    def on_fit_begin(self, run):
        self.calls.append(("begin", run.step, dict(run.losses)))

    def on_log(self, run):
        self.calls.append(("log", run.step, dict(run.losses)))

    def on_fit_end(self, run):
        self.calls.append(("end", run.step, run.interrupted))


class StopAt(Callback):
    """Asks the run to stop at the first log point at or after ``step``."""

    def __init__(self, step):
        self.step = step

    def on_log(self, run):
        if run.step >= self.step:
            run.stop()


class RaiseAt(Callback):
    """Raises ``error`` at the first log point at or after ``step``."""

    def __init__(self, step, error):
        self.step, self.error = step, error

    def on_log(self, run):
        if run.step >= self.step:
            raise self.error


class FailsAtBegin(Callback):
    def on_fit_begin(self, run):
        raise RuntimeError("no writer")


def _weights(clf):
    return [t.clone() for t in clf.model_.state_dict().values()]


def _same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(_weights(a), _weights(b), strict=True))


def test_callbacks_see_every_log_point_of_the_history(fast_params, blobs_semi):
    X, y = blobs_semi
    recorder = Recorder()
    clf = SemiSupervisedAssociationClassifier(**fast_params, callbacks=[recorder])
    clf.fit(X, y)
    kinds = [call[0] for call in recorder.calls]
    assert kinds == ["begin"] + ["log"] * len(clf.history_["step"]) + ["end"]
    logs = [call for call in recorder.calls if call[0] == "log"]
    assert [step for _, step, _ in logs] == clf.history_["step"]
    for i, (_, _, losses) in enumerate(logs):
        assert losses == {name: clf.history_[name][i] for name in losses}
    assert recorder.calls[-1] == ("end", clf.n_iter_, False)
    # The estimator's own callback object saw the fit; clones get copies.
    assert clf.callbacks[0] is recorder
    assert clone(clf).callbacks[0] is not recorder


def test_a_stop_request_ends_training_with_that_steps_model(fast_params, blobs_semi):
    X, y = blobs_semi
    clf = SemiSupervisedAssociationClassifier(**fast_params, callbacks=[StopAt(20)])
    clf.fit(X, y)
    assert clf.n_iter_ == 20 and clf.history_["step"][-1] == 20
    assert clf.training_state_.n_iter == 20


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"ema_decay": 0.9, "unlabeled_sampling": "epochs"},
        {"balance_weight": 1.0, "association_ramp_steps": 25},
    ],
    ids=["plain", "ema_epochs", "balance_ramp"],
)
def test_a_stopped_run_continues_to_the_model_of_an_uninterrupted_fit(
    fast_params, blobs_semi, settings
):
    """2N steps in one fit, or N then N more: the same model, bit for bit."""
    X, y = blobs_semi
    params = {**fast_params, **settings, "max_iter": 40}
    straight = SemiSupervisedAssociationClassifier(**params).fit(X, y)
    resumed = SemiSupervisedAssociationClassifier(**params, callbacks=[StopAt(20)])
    resumed.fit(X, y)
    assert resumed.n_iter_ == 20
    resumed.set_params(warm_start=True, callbacks=None).fit(X, y)
    assert resumed.n_iter_ == 40
    assert _same_weights(resumed, straight)
    assert resumed.history_ == straight.history_


def test_raising_max_iter_continues_a_schedule_that_does_not_depend_on_it(
    fast_params, blobs_semi
):
    X, y = blobs_semi
    params = {**fast_params, "lr_decay_steps": 15, "ema_decay": 0.9}
    straight = SemiSupervisedAssociationClassifier(**{**params, "max_iter": 40})
    straight.fit(X, y)
    resumed = SemiSupervisedAssociationClassifier(**{**params, "max_iter": 20})
    resumed.fit(X, y)
    resumed.set_params(warm_start=True, max_iter=40).fit(X, y)
    assert _same_weights(resumed, straight)


def test_a_finished_run_warm_starts_a_new_run_from_its_weights(fast_params, blobs_semi):
    """max_iter not above the run's steps: a new run of max_iter steps."""
    X, y = blobs_semi
    clf = SemiSupervisedAssociationClassifier(**fast_params).fit(X, y)
    fresh = copy.deepcopy(clf)
    first = list(clf.history_["step"])
    clf.set_params(warm_start=True).fit(X, y)
    assert clf.n_iter_ == fast_params["max_iter"]
    assert clf.history_["step"] == first  # a new history, not continued
    assert not _same_weights(clf, fresh)  # trained on from those weights


def test_ctrl_c_keeps_the_model_and_warm_start_resumes_it(fast_params, blobs_semi):
    X, y = blobs_semi
    straight = SemiSupervisedAssociationClassifier(**fast_params).fit(X, y)
    clf = SemiSupervisedAssociationClassifier(
        **fast_params, callbacks=[RaiseAt(10, KeyboardInterrupt())]
    )
    with pytest.raises(KeyboardInterrupt, match="interrupted after 10 of 30"):
        clf.fit(X, y)
    assert clf.n_iter_ == 10
    clf.set_params(warm_start=True, callbacks=None).fit(X, y)
    assert _same_weights(clf, straight)


def test_a_callback_that_raises_keeps_the_model_of_the_steps_completed(
    fast_params, blobs_semi
):
    X, y = blobs_semi
    before = SemiSupervisedAssociationClassifier(**fast_params).fit(X, y)
    clf = copy.deepcopy(before).set_params(
        callbacks=[RaiseAt(20, RuntimeError("disk full"))]
    )
    with pytest.raises(RuntimeError, match="disk full"):
        clf.fit(X, y)
    assert clf.n_iter_ == 20
    assert clf.predict(X).shape == (len(X),)
    # And its run continues once the callback is gone.
    clf.set_params(callbacks=None, warm_start=True).fit(X, y)
    assert _same_weights(clf, before)


class _FailsToSayWhat(Exception):
    def __str__(self):
        raise ValueError("no message")


def test_a_callback_error_that_fails_to_print_is_raised_as_it_is(
    fast_params, blobs_semi
):
    """Not the ValueError of its str(), and the model is kept."""
    X, y = blobs_semi
    clf = SemiSupervisedAssociationClassifier(
        **fast_params, callbacks=[RaiseAt(20, _FailsToSayWhat())]
    )
    with pytest.raises(_FailsToSayWhat):
        clf.fit(X, y)
    assert clf.n_iter_ == 20


def test_a_callback_that_raises_before_training_changes_nothing(
    fast_params, blobs_semi
):
    X, y = blobs_semi
    clf = SemiSupervisedAssociationClassifier(**fast_params).fit(X, y)
    weights = _weights(clf)
    with pytest.raises(RuntimeError, match="no writer"):
        clf.set_params(callbacks=[FailsAtBegin()]).fit(X, y)
    assert all(torch.equal(a, b) for a, b in zip(weights, _weights(clf), strict=True))


def test_an_error_at_fit_end_keeps_the_trained_model(fast_params, blobs_semi):
    class FailsAtEnd(Callback):
        def on_fit_end(self, run):
            raise OSError("cannot write")

    X, y = blobs_semi
    straight = SemiSupervisedAssociationClassifier(**fast_params).fit(X, y)
    clf = SemiSupervisedAssociationClassifier(**fast_params, callbacks=[FailsAtEnd()])
    with pytest.raises(OSError, match="cannot write"):
        clf.fit(X, y)
    assert _same_weights(clf, straight)


def test_a_failed_continued_fit_leaves_the_previous_run_as_it_was(
    fast_params, blobs_semi
):
    X, y = blobs_semi
    clf = SemiSupervisedAssociationClassifier(
        **fast_params, callbacks=[StopAt(10)]
    ).fit(X, y)
    state = copy.deepcopy(clf.training_state_)
    weights = _weights(clf)
    clf.set_params(callbacks=None, warm_start=True, learning_rate=1e30)
    with pytest.raises(NonFiniteLossError):
        clf.fit(X, y)
    assert all(torch.equal(a, b) for a, b in zip(weights, _weights(clf), strict=True))
    for name, moment in state.exp_avg.items():
        assert torch.equal(clf.training_state_.exp_avg[name], moment)


def test_early_stopping_leaves_no_run_to_continue(fast_params, blobs_semi):
    """Its weights are an earlier step's: a warm start starts a new run."""
    X, y = blobs_semi
    clf = SemiSupervisedAssociationClassifier(
        **fast_params,
        early_stopping=True,
        validation_interval=5,
        n_iter_no_change=1,
        tol=1.0,
    ).fit(X, y)
    assert clf.n_iter_ < fast_params["max_iter"]
    assert clf.training_state_ is None


def test_fitted_estimators_with_callbacks_pickle(fast_params, blobs_semi):
    X, y = blobs_semi
    clf = SemiSupervisedAssociationClassifier(**fast_params, callbacks=[StopAt(20)])
    clf.fit(X, y)
    restored = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(restored.predict_proba(X), clf.predict_proba(X))
    assert restored.training_state_.n_iter == 20


@pytest.fixture
def counted_steps(monkeypatch):
    """A list that gets an item for every training step run."""
    import skassoc._engine._step

    original = skassoc._engine._step.AssociationStep.__call__
    steps = []

    def counting(self):
        steps.append(1)
        return original(self)

    monkeypatch.setattr(skassoc._engine._step.AssociationStep, "__call__", counting)
    return steps


def test_halving_over_max_iter_continues_each_candidates_run(
    fast_params, blobs_semi, tmp_path, counted_steps
):
    """With a RunStore, each round trains only the steps it adds; with a
    schedule independent of max_iter the search finds what it finds without."""
    from sklearn.experimental import enable_halving_search_cv  # noqa: F401
    from sklearn.model_selection import HalvingGridSearchCV

    from skassoc.model_selection import RunStore, SemiSupervisedStratifiedKFold

    X, y = blobs_semi
    steps = counted_steps
    grid = {"visit_weight": [0.5, 1.0], "walker_weight": [0.5, 1.0]}
    outcomes = []
    for store in (None, RunStore(tmp_path / "runs")):
        steps.clear()
        params = {**fast_params, "lr_decay_steps": 10, "resume_from": store}
        search = HalvingGridSearchCV(
            SemiSupervisedAssociationClassifier(**params),
            grid,
            resource="max_iter",
            min_resources=10,
            max_resources=40,
            factor=2,
            cv=SemiSupervisedStratifiedKFold(2),
            refit=False,
            random_state=0,
        ).fit(X, y)
        outcomes.append((len(steps), search.cv_results_["mean_test_score"]))
    (scratch, scratch_scores), (continued, continued_scores) = outcomes
    # Rounds of 10, 20, 40 steps: 4 + 2 + 1 candidates on 2 folds.
    assert scratch == 2 * (4 * 10 + 2 * 20 + 1 * 40)
    assert continued == 2 * (4 * 10 + 2 * 10 + 1 * 20)
    np.testing.assert_array_equal(continued_scores, scratch_scores)


def test_a_run_store_continues_only_the_same_parameters_on_the_same_data(
    fast_params, blobs_semi, tmp_path, counted_steps
):
    from skassoc.model_selection import RunStore

    steps = counted_steps
    X, y = blobs_semi
    store = RunStore(tmp_path)
    params = {**fast_params, "max_iter": 20, "resume_from": store}

    def trained(X, y, **changes):
        steps.clear()
        SemiSupervisedAssociationClassifier(**{**params, **changes}).fit(X, y)
        return len(steps)

    assert trained(X, y) == 20
    assert len(list(tmp_path.iterdir())) == 1
    assert trained(X, y, max_iter=40, verbose=0) == 20  # steps 21 to 40
    assert trained(X, y, max_iter=40) == 40  # that run has its 40 steps
    assert trained(X, y, max_iter=60, visit_weight=0.5) == 60  # other parameters
    assert trained(X[:-1], y[:-1], max_iter=60) == 60  # other data
    assert len(list(tmp_path.iterdir())) == 3
    with pytest.raises(ValueError, match="int random_state"):
        trained(X, y, random_state=None)


def test_resume_from_a_checkpoint_file_continues_its_run(
    fast_params, blobs_semi, tmp_path
):
    from skassoc.callbacks import Checkpoint

    X, y = blobs_semi
    straight = SemiSupervisedAssociationClassifier(**fast_params).fit(X, y)
    path = tmp_path / "run.skassoc"
    SemiSupervisedAssociationClassifier(
        **fast_params, callbacks=[StopAt(10), Checkpoint(path, every=5)]
    ).fit(X, y)
    resumed = SemiSupervisedAssociationClassifier(**fast_params, resume_from=path)
    resumed.fit(X, y)
    assert _same_weights(resumed, straight)


@pytest.mark.parametrize(
    "callbacks, match",
    [([None], "none of the hooks"), ([StopAt], "pass an instance"), (["x"], "hooks")],
)
def test_objects_without_hooks_are_refused_before_training(
    fast_params, blobs_semi, callbacks, match
):
    X, y = blobs_semi
    with pytest.raises(TypeError, match=match):
        SemiSupervisedAssociationClassifier(**fast_params, callbacks=callbacks).fit(
            X, y
        )


def test_a_stop_at_fit_begin_trains_no_step_of_a_continued_run(fast_params, blobs_semi):
    class StopAtOnce(Callback):
        def on_fit_begin(self, run):
            run.stop()

    X, y = blobs_semi
    clf = SemiSupervisedAssociationClassifier(**fast_params, callbacks=[StopAt(10)])
    clf.fit(X, y)
    weights = _weights(clf)
    clf.set_params(warm_start=True, callbacks=[StopAtOnce()]).fit(X, y)
    assert clf.n_iter_ == 10
    assert all(torch.equal(a, b) for a, b in zip(weights, _weights(clf), strict=True))


def test_a_ctrl_c_in_on_fit_end_keeps_the_trained_model(fast_params, blobs_semi):
    class InterruptAtEnd(Callback):
        def on_fit_end(self, run):
            raise KeyboardInterrupt

    X, y = blobs_semi
    straight = SemiSupervisedAssociationClassifier(**fast_params).fit(X, y)
    clf = SemiSupervisedAssociationClassifier(
        **fast_params, callbacks=[InterruptAtEnd()]
    )
    with pytest.raises(KeyboardInterrupt):
        clf.fit(X, y)
    assert _same_weights(clf, straight)


def test_every_begun_callback_ends_when_a_later_one_fails_to_begin(
    fast_params, blobs_semi
):
    X, y = blobs_semi
    recorder = Recorder()
    clf = SemiSupervisedAssociationClassifier(
        **fast_params, callbacks=[recorder, FailsAtBegin()]
    )
    with pytest.raises(RuntimeError, match="no writer"):
        clf.fit(X, y)
    assert [call[0] for call in recorder.calls] == ["begin", "end"]


def test_the_end_of_fit_checkpoint_holds_the_fitted_weights(
    fast_params, blobs_semi, tmp_path
):
    """With early stopping and averaged weights, the last checkpoint is the
    fitted model (the best weights), not the last step's average."""
    from skassoc.callbacks import Checkpoint

    X, y = blobs_semi
    path = tmp_path / "end.skassoc"
    clf = SemiSupervisedAssociationClassifier(
        **fast_params,
        ema_decay=0.9,
        early_stopping=True,
        validation_interval=5,
        n_iter_no_change=2,
        tol=0.5,
        callbacks=[Checkpoint(path, every=1000)],
    ).fit(X, y)
    loaded = SemiSupervisedAssociationClassifier.load(path, device="cpu")
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))


def test_a_run_store_with_max_iter_auto_trains_from_scratch_again(
    fast_params, blobs_semi, tmp_path, counted_steps
):
    from skassoc.model_selection import RunStore

    X, y = blobs_semi
    params = {**fast_params, "max_iter": "auto", "resume_from": RunStore(tmp_path)}
    first = SemiSupervisedAssociationClassifier(**params).fit(X, y)
    again = SemiSupervisedAssociationClassifier(**params).fit(X, y)
    assert _same_weights(first, again)
    assert len(counted_steps) == first.n_iter_ + again.n_iter_


def test_a_run_store_keeps_only_runs_of_its_own_parameters(
    fast_params, blobs_semi, tmp_path
):
    """A warm start from another fit is not this fit's run: not stored."""
    from skassoc.model_selection import RunStore

    X, y = blobs_semi
    store = RunStore(tmp_path / "runs")
    clf = SemiSupervisedAssociationClassifier(**fast_params).fit(X[:-5], y[:-5])
    clf.set_params(warm_start=True, resume_from=store, max_iter=40).fit(X, y)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_a_run_store_that_cannot_be_made_is_refused_before_training(
    fast_params, blobs_semi, tmp_path
):
    from skassoc.model_selection import RunStore

    X, y = blobs_semi
    (tmp_path / "file").write_text("not a directory")
    clf = SemiSupervisedAssociationClassifier(
        **fast_params, resume_from=RunStore(tmp_path / "file")
    )
    with pytest.raises(ValueError, match="cannot keep runs"):
        clf.fit(X, y)
    assert not hasattr(clf, "model_")
    with pytest.raises(ValueError, match="is no file"):
        clf.set_params(resume_from=tmp_path / "missing.skassoc").fit(X, y)


def test_an_unreadable_stored_run_is_trained_again_with_a_warning(
    fast_params, blobs_semi, tmp_path, counted_steps
):
    from skassoc.model_selection import RunStore

    X, y = blobs_semi
    params = {**fast_params, "max_iter": 20, "resume_from": RunStore(tmp_path)}
    SemiSupervisedAssociationClassifier(**params).fit(X, y)
    [stored] = list(tmp_path.iterdir())
    stored.write_bytes(b"not a model file")
    counted_steps.clear()
    with pytest.warns(UserWarning, match="A stored run of this fit cannot be read"):
        SemiSupervisedAssociationClassifier(**{**params, "max_iter": 40}).fit(X, y)
    assert len(counted_steps) == 40
    # ... and the new run replaced it.
    assert SemiSupervisedAssociationClassifier.load(stored, device="cpu").n_iter_ == 40
