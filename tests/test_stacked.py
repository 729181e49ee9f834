"""Stacked training of loss-weight candidates: same models as separate fits."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits, make_blobs
from sklearn.model_selection import GridSearchCV
from sklearn.utils._param_validation import InvalidParameterError

import skassoc._engine._builtin
import skassoc._engine._optim
import skassoc._engine._step
import skassoc._stacked
from skassoc import SemiSupervisedAssociationClassifier
from skassoc._engine._loop import NonFiniteLossError
from skassoc._stacked import fit_candidates
from skassoc.model_selection import (
    SemiSupervisedStratifiedKFold,
    StackedGridSearchCV,
    labeled_scorer,
)

GRID = {"walker_weight": [0.5, 1.0], "visit_weight": [0.0, 1.0]}
CANDIDATES = [
    {"walker_weight": 0.5, "visit_weight": 0.0},
    {"walker_weight": 1.0, "visit_weight": 1.0},
    {"walker_weight": 2.0, "visit_weight": 0.5, "logit_weight": 0.5},
]


@pytest.fixture(scope="module")
def blobs():
    X, y = make_blobs(150, centers=3, n_features=5, cluster_std=2.0, random_state=0)
    y_semi = y.copy()
    y_semi[30:] = -1
    return X, y_semi


@pytest.fixture(scope="module")
def digits():
    """Tiny 8x8 images (pixel scale 0..255) for the convolutional network."""
    X, y = load_digits(return_X_y=True)
    X = (X[:200] * 16).reshape(-1, 1, 8, 8)
    y = y[:200].copy()
    y[40:] = -1
    return X, y


@pytest.mark.parametrize("stacking", ["auto", "streams"])
def test_stacked_fits_equal_separate_fits(blobs, fast_params, stacking):
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    fitted = fit_candidates(estimator, CANDIDATES, X, y, stacking=stacking)
    for params, stacked in zip(CANDIDATES, fitted, strict=True):
        separate = SemiSupervisedAssociationClassifier(**fast_params, **params)
        separate.fit(X, y)
        assert stacked.get_params() == separate.get_params()
        np.testing.assert_allclose(
            stacked.predict_proba(X), separate.predict_proba(X), atol=1e-4
        )
        np.testing.assert_array_equal(stacked.predict(X), separate.predict(X))
        np.testing.assert_allclose(
            stacked.history_["total"], separate.history_["total"], rtol=1e-4
        )
        assert stacked.n_iter_ == separate.n_iter_


def test_stacked_fits_with_given_class_frequencies_equal_separate_fits(
    blobs, fast_params
):
    # Given frequencies weigh the visit loss's walks in every candidate.
    X, y = blobs
    params = {**fast_params, "class_prior": [0.5, 0.3, 0.2]}
    estimator = SemiSupervisedAssociationClassifier(**params)
    fitted = fit_candidates(estimator, CANDIDATES[1:], X, y, stacking="streams")
    for candidate, stacked in zip(CANDIDATES[1:], fitted, strict=True):
        separate = SemiSupervisedAssociationClassifier(**params, **candidate)
        separate.fit(X, y)
        np.testing.assert_allclose(
            stacked.history_["visit"], separate.history_["visit"], rtol=1e-4
        )
        np.testing.assert_allclose(
            stacked.predict_proba(X), separate.predict_proba(X), atol=1e-4
        )
    plain = SemiSupervisedAssociationClassifier(**fast_params, **CANDIDATES[1]).fit(
        X, y
    )
    assert not np.allclose(plain.history_["visit"], fitted[0].history_["visit"])


def test_stacked_convolutional_network(digits):
    X, y = digits
    params = dict(
        network="mnist",
        embedding_dim=16,
        labeled_per_class=2,
        unlabeled_batch_size=16,
        max_iter=4,
        device="cpu",
        random_state=0,
        precision="fp32",
        augmentation="paper",
        ema_decay=0.9,
    )
    estimator = SemiSupervisedAssociationClassifier(**params)
    fitted = fit_candidates(estimator, CANDIDATES[:2], X, y)
    for candidate, stacked in zip(CANDIDATES[:2], fitted, strict=True):
        separate = SemiSupervisedAssociationClassifier(**params, **candidate).fit(X, y)
        np.testing.assert_allclose(
            stacked.predict_proba(X), separate.predict_proba(X), atol=1e-4
        )


@pytest.mark.parametrize(
    "settings",
    [
        {"balance_weight": 1.0},
        {"class_weight": "balanced"},
        {"ema_decay": 0.9, "unlabeled_sampling": "epochs"},
        {"early_stopping": True, "validation_interval": 5, "n_iter_no_change": 1},
    ],
    ids=["balance", "class_weight", "ema_epochs", "early_stopping"],
)
def test_every_setting_of_a_single_fit_works_for_stacked_candidates(
    blobs, fast_params, settings
):
    """One engine: settings that the stacked loop once refused train each
    candidate as its separate fit (early stopping stops each on its own)."""
    X, y = blobs
    params = {**fast_params, **settings}
    candidates = [{"logit_weight": 1.0}, {"logit_weight": 3.0, "visit_weight": 0.2}]
    fitted = fit_candidates(
        SemiSupervisedAssociationClassifier(**params), candidates, X, y
    )
    for candidate, stacked in zip(candidates, fitted, strict=True):
        separate = SemiSupervisedAssociationClassifier(**params, **candidate)
        separate.fit(X, y)
        assert stacked.n_iter_ == separate.n_iter_
        assert stacked.history_.keys() == separate.history_.keys()
        for name, values in separate.history_.items():
            np.testing.assert_allclose(stacked.history_[name], values, rtol=1e-4)
        np.testing.assert_allclose(
            stacked.predict_proba(X), separate.predict_proba(X), atol=1e-4
        )


def test_stacked_candidates_continue_a_fitted_estimators_run(blobs, fast_params):
    """With warm_start, every candidate continues the estimator's run."""
    X, y = blobs
    params = {**fast_params, "lr_decay_steps": 10, "max_iter": 20}
    estimator = SemiSupervisedAssociationClassifier(**params).fit(X, y)
    estimator.set_params(warm_start=True, max_iter=40)
    fitted = fit_candidates(estimator, CANDIDATES[:2], X, y)
    for candidate, stacked in zip(CANDIDATES[:2], fitted, strict=True):
        separate = SemiSupervisedAssociationClassifier(**params).fit(X, y)
        separate.set_params(warm_start=True, max_iter=40, **candidate).fit(X, y)
        assert stacked.n_iter_ == separate.n_iter_ == 40
        np.testing.assert_allclose(
            stacked.predict_proba(X), separate.predict_proba(X), atol=1e-4
        )
    assert estimator.n_iter_ == 20  # the estimator itself is not changed


# GridSearchCV warns that the scorer does not weigh its scores; neither
# search does (the weights are the training loss's).
@pytest.mark.filterwarnings("ignore:The scoring labeled_scorer:UserWarning")
def test_search_with_sample_weight_matches_grid_search(blobs, fast_params):
    X, y = blobs
    weights = np.random.RandomState(0).uniform(0.2, 2.0, len(y))
    estimator = SemiSupervisedAssociationClassifier(
        **{**fast_params, "labeled_per_class": 2}
    )
    cv = SemiSupervisedStratifiedKFold(2)
    grid = {"visit_weight": [0.5, 1.0]}
    stacked = StackedGridSearchCV(estimator, grid, cv=cv).fit(
        X, y, sample_weight=weights
    )
    reference = GridSearchCV(estimator, grid, cv=cv, scoring=labeled_scorer())
    reference.fit(X, y, sample_weight=weights)
    np.testing.assert_allclose(
        stacked.cv_results_["mean_test_score"],
        reference.cv_results_["mean_test_score"],
        atol=1e-6,
    )
    unweighted = StackedGridSearchCV(estimator, grid, cv=cv).fit(X, y)
    assert not np.allclose(
        stacked.best_estimator_.predict_proba(X),
        unweighted.best_estimator_.predict_proba(X),
    )


def test_folds_in_parallel_score_as_one_after_another(blobs, fast_params):
    """Each fold's stacked group is one joblib task (a Dask worker's, say)."""
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    cv = SemiSupervisedStratifiedKFold(3)
    serial = StackedGridSearchCV(estimator, GRID, cv=cv, refit=False).fit(X, y)
    parallel = StackedGridSearchCV(estimator, GRID, cv=cv, refit=False, n_jobs=2)
    parallel.fit(X, y)
    for key in ("split0_test_score", "split2_test_score", "mean_test_score"):
        np.testing.assert_array_equal(
            parallel.cv_results_[key], serial.cv_results_[key]
        )


@pytest.mark.parametrize(
    ("n_candidates", "groups_per_fold", "sizes"),
    [
        (8, 1, [8]),  # a fold's candidates together
        (8, 2, [4, 4]),  # two folds on four GPU workers
        (5, 4, [1, 1, 2, 1]),
        (2, 16, [1, 1]),  # never more groups than candidates
    ],
)
def test_stacked_groups_cut_a_folds_candidates(n_candidates, groups_per_fold, sizes):
    from skassoc.model_selection import _stacked_groups

    groups = _stacked_groups(n_candidates, groups_per_fold)
    assert [i for group in groups for i in group] == list(range(n_candidates))
    assert [len(group) for group in groups] == sizes


def test_groups_of_a_fold_score_as_the_fold_together(blobs, fast_params, monkeypatch):
    """Each fold's four candidates trained as two groups of two (two
    joblib tasks) score as one group of four does."""
    import skassoc.model_selection as model_selection

    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    cv = SemiSupervisedStratifiedKFold(3)
    together = StackedGridSearchCV(estimator, GRID, cv=cv, refit=False).fit(X, y)
    stacked = []

    def counted(estimator, candidates, *args, **kwargs):
        stacked.append(len(candidates))
        return fit_candidates(estimator, candidates, *args, **kwargs)

    monkeypatch.setattr(model_selection, "fit_candidates", counted)
    split = StackedGridSearchCV(estimator, GRID, cv=cv, refit=False, groups_per_fold=2)
    split.fit(X, y)
    assert stacked == [2] * 6
    for key in ("split0_test_score", "split2_test_score", "mean_test_score"):
        np.testing.assert_allclose(
            split.cv_results_[key], together.cv_results_[key], atol=1e-6
        )
    assert np.all(split.cv_results_["mean_fit_time"] > 0)


def test_search_matches_grid_search(blobs, fast_params):
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    cv = SemiSupervisedStratifiedKFold(3)
    stacked = StackedGridSearchCV(estimator, GRID, cv=cv).fit(X, y)
    reference = GridSearchCV(estimator, GRID, cv=cv, scoring=labeled_scorer()).fit(X, y)
    ours, theirs = stacked.cv_results_, reference.cv_results_
    assert ours["params"] == theirs["params"]
    for key in ("mean_test_score", "std_test_score", "split0_test_score"):
        np.testing.assert_allclose(ours[key], theirs[key], atol=1e-6)
    np.testing.assert_array_equal(ours["rank_test_score"], theirs["rank_test_score"])
    np.testing.assert_array_equal(
        ours["param_visit_weight"], theirs["param_visit_weight"]
    )
    assert stacked.best_params_ == reference.best_params_
    assert stacked.best_score_ == pytest.approx(reference.best_score_)
    np.testing.assert_array_equal(
        stacked.predict(X), reference.best_estimator_.predict(X)
    )


def test_search_fits_no_report_for_its_folds_and_one_for_its_refit(blobs, fast_params):
    X, y = blobs
    reports = []

    def scorer(estimator, X_test, y_test):
        reports.append(estimator.fit_report_)
        return estimator.score(X_test, y_test)

    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    search = StackedGridSearchCV(estimator, GRID, cv=3, scoring=scorer).fit(X, y)
    assert reports == [None] * (3 * 4)
    assert search.best_estimator_.fit_report_ is not None
    assert estimator.fit_report and not hasattr(estimator, "fit_report_")
    unreported = estimator.set_params(fit_report=False)
    refit = StackedGridSearchCV(unreported, GRID, cv=3).fit(X, y).best_estimator_
    assert refit.fit_report_ is None


def test_fit_candidates_keep_or_override_the_estimators_fit_report(blobs, fast_params):
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    kept = fit_candidates(estimator, CANDIDATES[:2], X, y)
    skipped = fit_candidates(estimator, CANDIDATES[:2], X, y, fit_report=False)
    assert all(est.fit_report_ is not None for est in kept)
    assert [(est.fit_report, est.fit_report_) for est in skipped] == [(False, None)] * 2
    np.testing.assert_array_equal(kept[1].predict(X), skipped[1].predict(X))


def test_search_defaults_and_no_refit(blobs, fast_params):
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    search = StackedGridSearchCV(
        estimator, {"logit_weight": [0.5, 1.0]}, refit=False, scoring="accuracy"
    ).fit(X, y)
    assert search.n_splits_ == 5
    assert search.cv_results_["mean_test_score"].shape == (2,)
    assert not hasattr(search, "best_estimator_")
    with pytest.raises(Exception, match="refit=True"):
        search.predict(X)


def test_refuses_other_parameters(blobs, fast_params):
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    with pytest.raises(ValueError, match=r"\['learning_rate'\]"):
        StackedGridSearchCV(
            estimator, {"learning_rate": [1e-3], "visit_weight": [1.0]}
        ).fit(X, y)
    with pytest.raises(ValueError, match="no candidate"):
        fit_candidates(estimator, [], X, y)
    with pytest.raises(ValueError, match="one metric"):
        StackedGridSearchCV(estimator, GRID, scoring=["accuracy"]).fit(X, y)
    with pytest.raises(ValueError, match="stacking"):
        fit_candidates(estimator, CANDIDATES, X, y, stacking="vmap")
    with pytest.raises(ValueError, match="visit_weight"):
        fit_candidates(estimator, [{"visit_weight": -1.0}], X, y)


@pytest.fixture
def second_candidate_fails(monkeypatch):
    """Report the second candidate's loss as NaN; a list counts the reports.

    Loss weights within their bounds do not overflow float32, so the loss of
    one candidate alone cannot be driven to infinity by its parameters.
    """
    reports = []
    original = skassoc._engine._step.AssociationStep.__call__

    def step(self):
        original(self)
        if len(self.models) > 1:
            if not reports or reports[-1] is not self:
                reports.append(self)
            self.first_nonfinite_step[1] = 0.0

    monkeypatch.setattr(skassoc._engine._step.AssociationStep, "__call__", step)
    return reports


def test_nonfinite_candidate_left_unfitted(blobs, fast_params, second_candidate_fails):
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    candidates = [{"logit_weight": 1.0}, {"logit_weight": 2.0}]
    with pytest.warns(UserWarning, match="left unfitted"):
        fitted = fit_candidates(estimator, candidates, X, y)
    assert hasattr(fitted[0], "model_") and not hasattr(fitted[1], "model_")


def test_search_scores_a_failed_candidate_with_error_score(
    blobs, fast_params, second_candidate_fails
):
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    grid = {"logit_weight": [1.0, 2.0]}
    with pytest.warns(UserWarning, match="left unfitted"):
        search = StackedGridSearchCV(estimator, grid, cv=3, error_score=-1.0)
        search.fit(X, y)
    np.testing.assert_array_equal(search.cv_results_["mean_test_score"][1], -1.0)
    assert search.best_params_ == {"logit_weight": 1.0}


def test_a_search_whose_every_fit_failed_raises(blobs, fast_params, monkeypatch):
    """As GridSearchCV does, rather than report NaN scores and a best."""
    original = skassoc._engine._step.AssociationStep.__call__

    def step(self):
        original(self)
        self.first_nonfinite_step[:] = 0.0

    monkeypatch.setattr(skassoc._engine._step.AssociationStep, "__call__", step)
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    search = StackedGridSearchCV(estimator, {"logit_weight": [1.0, 2.0]}, cv=3)
    with (
        pytest.warns(UserWarning, match="left unfitted"),
        pytest.raises(ValueError, match="All the 6 fits failed"),
    ):
        search.fit(X, y)
    assert not hasattr(search, "cv_results_")


def test_a_folds_groups_share_one_seed_drawn_for_the_fold(
    blobs, fast_params, monkeypatch
):
    """random_state=None draws a seed at every fit: the groups of a fold
    get one, as the fold's candidates stacked together would."""
    import skassoc.model_selection as model_selection

    seeds = []

    def recorded(estimator, candidates, *args, **kwargs):
        seeds.append(estimator.random_state)
        return fit_candidates(estimator, candidates, *args, **kwargs)

    monkeypatch.setattr(model_selection, "fit_candidates", recorded)
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(
        **{**fast_params, "random_state": None}
    )
    search = StackedGridSearchCV(estimator, GRID, cv=3, refit=False, groups_per_fold=2)
    search.fit(X, y)
    # The tasks in order: fold 0's two groups, then fold 1's, fold 2's.
    assert all(isinstance(seed, int) for seed in seeds)
    assert seeds[0::2] == seeds[1::2]
    assert len(set(seeds)) == 3


def test_error_score_raise_raises_at_the_first_failure(
    blobs, fast_params, second_candidate_fails
):
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    grid = {"logit_weight": [1.0, 2.0]}
    search = StackedGridSearchCV(estimator, grid, cv=3, error_score="raise")
    with pytest.raises(NonFiniteLossError, match=r"'logit_weight': 2.0"):
        search.fit(X, y)
    assert len(second_candidate_fails) == 1  # the first fold only
    assert not hasattr(search, "cv_results_")


@pytest.mark.parametrize(
    "params, name",
    [
        ({"error_score": "ignore"}, "error_score"),
        ({"stacking": "bogus"}, "stacking"),
        ({"refit": "yes"}, "refit"),
        ({"cv": 1}, "cv"),
    ],
)
def test_search_refuses_bad_parameters_before_fitting(blobs, fast_params, params, name):
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    search = StackedGridSearchCV(estimator, GRID, **params)
    with pytest.raises(InvalidParameterError, match=f"'{name}' parameter"):
        search.fit(X, y)


def test_keyboard_interrupt_stops_the_stacked_search(blobs, fast_params, monkeypatch):
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(skassoc._engine._step.AssociationStep, "__call__", interrupted)
    search = StackedGridSearchCV(estimator, GRID, cv=3)
    with pytest.raises(KeyboardInterrupt):
        search.fit(X, y)
    assert not hasattr(search, "cv_results_")


def test_keyboard_interrupt_during_the_refit_stops_the_search(
    blobs, fast_params, monkeypatch
):
    """The refit is a plain fit: it keeps its model, then raises."""
    X, y = blobs
    estimator = SemiSupervisedAssociationClassifier(**fast_params)
    original = skassoc._engine._step.AssociationStep.__call__
    calls = []

    def interrupted_after_five(self):
        if len(self.models) > 1:
            return original(self)
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return original(self)

    # The stacked folds train two models a step; only the refit trains one.
    monkeypatch.setattr(
        skassoc._engine._step.AssociationStep, "__call__", interrupted_after_five
    )
    search = StackedGridSearchCV(estimator, {"logit_weight": [1.0, 2.0]}, cv=3)
    with pytest.raises(KeyboardInterrupt, match="interrupted after 5 of 30"):
        search.fit(X, y)
    assert search.best_estimator_.n_iter_ == 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("stacking", ["auto", "streams"])
def test_stacked_on_gpu(blobs, fast_params, stacking):
    X, y = blobs
    # fp32: TF32 would round the two ways differently enough to drift.
    params = {**fast_params, "device": "cuda", "max_iter": 50, "precision": "fp32"}
    estimator = SemiSupervisedAssociationClassifier(**params)
    fitted = fit_candidates(estimator, CANDIDATES, X, y, stacking=stacking)
    for candidate, stacked in zip(CANDIDATES, fitted, strict=True):
        separate = SemiSupervisedAssociationClassifier(**params, **candidate).fit(X, y)
        # Other kernels (grouped, batched): close, not equal to the bit.
        np.testing.assert_allclose(
            stacked.predict_proba(X), separate.predict_proba(X), atol=1e-3
        )


def test_bench_search_renders_its_results(monkeypatch):
    """The committed GPU result renders to the committed table (--render-only)."""
    import importlib
    import json
    from pathlib import Path

    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(benchmarks))
    bench = importlib.import_module("bench_search")
    result = json.loads((benchmarks / "results" / "search_cuda.json").read_text())
    table = bench.render_table(result)
    assert table == (benchmarks / "results" / "search_cuda.rst").read_text()
    summary = bench.summarize(result)
    assert summary["streams"]["speedup"] == pytest.approx(
        result["summary"]["streams"]["speedup"]
    )
    assert len(result["candidates"]) == 8
