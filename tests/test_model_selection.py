"""Tests of skassoc.model_selection: splitters and scorers aware of ``-1``."""

import numpy as np
import pandas as pd
import pytest
import sklearn
from sklearn.base import clone
from sklearn.datasets import make_blobs, make_classification
from sklearn.dummy import DummyClassifier
from sklearn.experimental import enable_halving_search_cv  # noqa: F401
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import (
    accuracy_score,
    balanced_accuracy_score,
    log_loss,
    roc_auc_score,
)
from sklearn.model_selection import (
    GridSearchCV,
    HalvingGridSearchCV,
    KFold,
    RandomizedSearchCV,
    RepeatedKFold,
    RepeatedStratifiedKFold,
    StratifiedKFold,
    cross_validate,
)
from sklearn.semi_supervised import SelfTrainingClassifier

from skassoc import SemiSupervisedAssociationClassifier
from skassoc.model_selection import (
    RepeatedSemiSupervisedKFold,
    RepeatedSemiSupervisedStratifiedKFold,
    SemiSupervisedKFold,
    SemiSupervisedStratifiedKFold,
    labeled_scorer,
)

METRICS = ["accuracy", "neg_log_loss", "roc_auc_ovr", "balanced_accuracy"]


def _hide_labels(y, n_per_class, seed=0):
    """``y`` with all but ``n_per_class`` samples of every class set to -1."""
    rng = np.random.RandomState(seed)
    y_semi = np.full_like(y, -1)
    for label in np.unique(y):
        keep = rng.choice(np.flatnonzero(y == label), n_per_class, replace=False)
        y_semi[keep] = label
    return y_semi


@pytest.fixture(scope="module")
def noisy():
    """240 samples of 3 overlapping classes, 12 labels per class (36 in all).

    Overlapping, so that scores differ between folds and candidates and a
    match with a hand-written loop means something.
    """
    X, y = make_classification(
        n_samples=240,
        n_features=6,
        n_informative=4,
        n_classes=3,
        class_sep=0.8,
        random_state=0,
    )
    return X, _hide_labels(y, 12)


@pytest.fixture(scope="module")
def blobs_hard():
    """150 samples of 3 overlapping blobs, 10 labels per class."""
    X, y = make_blobs(
        n_samples=150, n_features=4, centers=3, cluster_std=3.0, random_state=0
    )
    return X.astype(np.float32), _hide_labels(y, 10)


def _stand_in():
    """A fast semi-supervised classifier that takes -1 in y, as ours does."""
    return SelfTrainingClassifier(LogisticRegression(max_iter=200))


def _fast_params(fast_params):
    return {**fast_params, "labeled_per_class": 4}


def _hand_scores(estimator, params, X, y, splits, metrics):
    """Fit and score by hand: ``{metric name: [score of each split]}``.

    Only labeled samples are scored, with the metric functions themselves.
    """
    scores = {name: [] for name in metrics}
    for train, test in splits:
        fitted = clone(estimator).set_params(**params).fit(X[train], y[train])
        keep = test[y[test] != -1]
        for name in metrics:
            scores[name].append(_metric(name, fitted, X[keep], y[keep]))
    return scores


def _metric(name, fitted, X, y_true):
    """The metric that scorer ``name`` computes, called by hand."""
    proba = fitted.predict_proba(X)
    predicted = fitted.classes_[proba.argmax(axis=1)]
    if name == "accuracy":
        return accuracy_score(y_true, predicted)
    if name == "balanced_accuracy":
        return balanced_accuracy_score(y_true, predicted)
    if name == "neg_log_loss":
        return -log_loss(y_true, proba, labels=fitted.classes_)
    assert name == "roc_auc_ovr"
    return roc_auc_score(y_true, proba, multi_class="ovr", labels=fitted.classes_)


def _split_scores(cv_results, index, name, n_splits):
    return [cv_results[f"split{k}_test_{name}"][index] for k in range(n_splits)]


SPLITTERS = [
    SemiSupervisedKFold(3),
    SemiSupervisedKFold(3, shuffle=True, random_state=0),
    SemiSupervisedStratifiedKFold(4),
    SemiSupervisedStratifiedKFold(4, shuffle=True, random_state=1),
    RepeatedSemiSupervisedKFold(n_splits=3, n_repeats=2, random_state=0),
    RepeatedSemiSupervisedStratifiedKFold(n_splits=4, n_repeats=3, random_state=0),
]


# ---------------------------------------------------------------- splitters


@pytest.mark.parametrize("cv", SPLITTERS, ids=repr)
def test_test_folds_are_labeled_and_train_folds_keep_unlabeled(cv, noisy):
    X, y = noisy
    labeled, unlabeled = np.flatnonzero(y != -1), np.flatnonzero(y == -1)
    splits = list(cv.split(X, y))
    assert len(splits) == cv.get_n_splits(X, y) == cv.get_n_splits()
    for train, test in splits:
        assert np.all(y[test] != -1)
        assert np.isin(unlabeled, train).all()
        assert np.intersect1d(train, test).size == 0
        # Every labeled sample is either tested or trained on.
        assert_equal_sets(np.union1d(train, test), np.arange(len(y)))
        assert np.all(np.diff(train) > 0)
    # Within one repetition the test folds partition the labeled samples.
    n_splits = cv.n_splits
    for start in range(0, len(splits), n_splits):
        tests = [test for _, test in splits[start : start + n_splits]]
        assert_equal_sets(np.concatenate(tests), labeled)
        assert sum(len(test) for test in tests) == len(labeled)


def assert_equal_sets(a, b):
    np.testing.assert_array_equal(np.sort(a), np.sort(b))


@pytest.mark.parametrize(
    "cv, reference",
    [
        (SemiSupervisedKFold(3), KFold(3)),
        (
            SemiSupervisedStratifiedKFold(4, shuffle=True, random_state=2),
            StratifiedKFold(4, shuffle=True, random_state=2),
        ),
        (
            RepeatedSemiSupervisedKFold(n_splits=3, n_repeats=2, random_state=0),
            RepeatedKFold(n_splits=3, n_repeats=2, random_state=0),
        ),
        (
            RepeatedSemiSupervisedStratifiedKFold(
                n_splits=3, n_repeats=2, random_state=0
            ),
            RepeatedStratifiedKFold(n_splits=3, n_repeats=2, random_state=0),
        ),
    ],
    ids=lambda cv: type(cv).__name__,
)
def test_test_folds_are_sklearn_folds_of_the_labeled_samples(cv, reference, noisy):
    X, y = noisy
    labeled = np.flatnonzero(y != -1)
    expected = [labeled[test] for _, test in reference.split(labeled, y[labeled])]
    got = [test for _, test in cv.split(X, y)]
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "cv",
    [
        SemiSupervisedStratifiedKFold(4),
        RepeatedSemiSupervisedStratifiedKFold(n_splits=4, n_repeats=2, random_state=0),
    ],
    ids=repr,
)
def test_stratified_folds_keep_the_class_shares(cv, noisy):
    X, y = noisy  # 12 labels of each of 3 classes, 4 folds: 3 of each a fold
    for _, test in cv.split(X, y):
        np.testing.assert_array_equal(np.bincount(y[test]), [3, 3, 3])


def test_repeats_differ_and_random_state_fixes_them(noisy):
    X, y = noisy
    make = RepeatedSemiSupervisedStratifiedKFold
    first = [t for _, t in make(n_splits=3, n_repeats=4, random_state=0).split(X, y)]
    again = [t for _, t in make(n_splits=3, n_repeats=4, random_state=0).split(X, y)]
    other = [t for _, t in make(n_splits=3, n_repeats=4, random_state=1).split(X, y)]
    assert len(first) == 12
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(first, other))
    # The repetitions shuffle differently.
    assert not np.array_equal(first[0], first[3])


def test_shuffle_with_an_int_seed_gives_the_same_folds_at_every_call(noisy):
    X, y = noisy
    cv = SemiSupervisedKFold(3, shuffle=True, random_state=0)
    first, again = list(cv.split(X, y)), list(cv.split(X, y))
    for (train_a, test_a), (train_b, test_b) in zip(first, again):
        np.testing.assert_array_equal(train_a, train_b)
        np.testing.assert_array_equal(test_a, test_b)
    unshuffled = [t for _, t in SemiSupervisedKFold(3).split(X, y)]
    assert not np.array_equal(first[0][1], unshuffled[0])


@pytest.mark.parametrize(
    "y_semi",
    [
        np.array(["a", "-1", "b", "a", "-1", "b", "a", "b"]),
        np.array(["a", -1, "b", "a", -1, "b", "a", "b"], dtype=object),
        pd.Series(["a", "-1", "b", "a", "-1", "b", "a", "b"], dtype="category"),
        [0, -1, 1, 0, -1, 1, 0, 1],
    ],
    ids=["str", "object", "categorical", "list"],
)
def test_label_types_mark_unlabeled_as_the_estimator_does(y_semi):
    X = np.zeros((8, 2)).tolist()  # a list works as X too
    cv = SemiSupervisedStratifiedKFold(3)
    for train, test in cv.split(X, y_semi):
        assert not {1, 4} & set(test)
        assert {1, 4} <= set(train)
    assert sorted(np.concatenate([t for _, t in cv.split(X, y_semi)])) == [
        0,
        2,
        3,
        5,
        6,
        7,
    ]


def test_every_sample_labeled_is_plain_kfold():
    y = np.array([0, 1] * 6)
    got = [t for _, t in SemiSupervisedStratifiedKFold(3).split(y, y)]
    expected = [t for _, t in StratifiedKFold(3).split(y, y)]
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "y, cv, match",
    [
        (None, SemiSupervisedKFold(2), "y=None"),
        (np.full(6, -1), SemiSupervisedKFold(2), "no labeled samples"),
        (np.array([0, 1, -1, -1]), SemiSupervisedKFold(3), "more than the 2"),
        (
            np.array([0, 0, 0, 1, 1, -1]),
            SemiSupervisedStratifiedKFold(3),
            "class 1 has 2",
        ),
        (
            np.array([0, 0, 0, 1, 1, -1]),
            RepeatedSemiSupervisedStratifiedKFold(n_splits=3),
            "at least n_splits=3",
        ),
    ],
)
def test_split_errors(y, cv, match):
    X = np.zeros((6 if y is None else len(y), 2))
    with pytest.raises(ValueError, match=match):
        next(cv.split(X, y))


def test_bad_parameters_fail_at_construction_as_in_sklearn():
    with pytest.raises(ValueError, match="k-fold"):
        SemiSupervisedKFold(1)
    with pytest.raises(ValueError, match="shuffle"):
        SemiSupervisedStratifiedKFold(3, shuffle=False, random_state=0)
    with pytest.raises(ValueError, match="greater than 0"):
        RepeatedSemiSupervisedKFold(n_repeats=0)


def test_repr_names_the_parameters():
    assert repr(SemiSupervisedStratifiedKFold(3, shuffle=True, random_state=0)) == (
        "SemiSupervisedStratifiedKFold(n_splits=3, random_state=0, shuffle=True)"
    )
    assert "n_repeats=2" in repr(RepeatedSemiSupervisedKFold(n_repeats=2))


# ------------------------------------------------------------------ scorers


def test_labeled_scorer_scores_the_labeled_samples_only(noisy):
    X, y = noisy
    clf = _stand_in().fit(X, y)
    keep = y != -1
    assert labeled_scorer("accuracy")(clf, X, y) == accuracy_score(
        y[keep], clf.predict(X[keep])
    )
    # scoring=None: the estimator's own score method, on the labeled samples.
    assert labeled_scorer()(clf, X, y) == clf.score(X[keep], y[keep])
    proba = clf.predict_proba(X[keep])
    assert labeled_scorer("neg_log_loss")(clf, X, y) == pytest.approx(
        -log_loss(y[keep], proba)
    )
    # Without it, every -1 counts as an error (the bug of issue #24).
    assert sklearn.metrics.get_scorer("accuracy")(clf, X, y) < 0.2


def test_labeled_scorer_drops_the_weights_of_unlabeled_samples(noisy):
    X, y = noisy
    clf = _stand_in().fit(X, y)
    weights = np.random.RandomState(0).uniform(0.1, 2.0, len(y))
    keep = y != -1
    expected = accuracy_score(
        y[keep], clf.predict(X[keep]), sample_weight=weights[keep]
    )
    got = labeled_scorer("accuracy")(clf, X, y, sample_weight=weights)
    assert got == pytest.approx(expected)
    assert got != pytest.approx(labeled_scorer("accuracy")(clf, X, y))


def test_labeled_scorer_accepts_callables_lists_and_dicts(noisy):
    X, y = noisy
    clf = _stand_in().fit(X, y)
    keep = y != -1

    def mistakes(estimator, X, y):
        return -float(np.sum(estimator.predict(X) != y))

    assert labeled_scorer(mistakes)(clf, X, y) == mistakes(clf, X[keep], y[keep])
    many = labeled_scorer(["accuracy", "balanced_accuracy"])
    assert set(many) == {"accuracy", "balanced_accuracy"}
    assert many["balanced_accuracy"](clf, X, y) == balanced_accuracy_score(
        y[keep], clf.predict(X[keep])
    )
    named = labeled_scorer({"errors": mistakes, "acc": "accuracy"})
    assert named["errors"](clf, X, y) == mistakes(clf, X[keep], y[keep])
    assert repr(named["acc"]) == "labeled_scorer('accuracy')"


def test_labeled_scorer_errors():
    with pytest.raises(ValueError, match="looks like it is a metric"):
        labeled_scorer(accuracy_score)
    with pytest.raises(ValueError):
        labeled_scorer("no such scorer")
    clf = DummyClassifier().fit(np.zeros((4, 1)), [0, 1, 0, 1])
    with pytest.raises(ValueError, match="no labeled sample"):
        labeled_scorer("accuracy")(clf, np.zeros((3, 1)), [-1, -1, -1])


def test_labeled_scorer_with_a_cv_of_ones_own(noisy):
    """Test folds holding -1 (a plain StratifiedKFold) score right with it."""
    X, y = noisy
    cv = StratifiedKFold(3, shuffle=True, random_state=0)
    splits = list(cv.split(X, y))
    result = cross_validate(_stand_in(), X, y, cv=cv, scoring=labeled_scorer(METRICS))
    expected = _hand_scores(_stand_in(), {}, X, y, splits, METRICS)
    for name in METRICS:
        np.testing.assert_allclose(result[f"test_{name}"], expected[name])
    # The plain scorers count every -1 as an error or give NaN.
    plain = cross_validate(_stand_in(), X, y, cv=cv, scoring=["accuracy"])
    assert plain["test_accuracy"].max() < 0.2


def test_sample_weight_reaches_the_scorer_through_metadata_routing(noisy):
    X, y = noisy
    weights = np.random.RandomState(0).uniform(0.1, 2.0, len(y))
    cv = SemiSupervisedStratifiedKFold(3)
    with sklearn.config_context(enable_metadata_routing=True):
        scorer = labeled_scorer("accuracy").set_score_request(sample_weight=True)
        estimator = DummyClassifier(strategy="stratified", random_state=0)
        estimator.set_fit_request(sample_weight=False)
        result = cross_validate(
            estimator, X, y, cv=cv, scoring=scorer, params={"sample_weight": weights}
        )
    for score, (train, test) in zip(result["test_score"], cv.split(X, y)):
        fitted = clone(estimator).fit(X[train], y[train])
        expected = accuracy_score(
            y[test], fitted.predict(X[test]), sample_weight=weights[test]
        )
        assert score == pytest.approx(expected)


# ------------------------------------------------- cross_validate, searches


@pytest.mark.parametrize("wrap", [False, True], ids=["names", "labeled_scorer"])
def test_cross_validate_several_metrics_match_a_hand_loop(noisy, wrap):
    X, y = noisy
    cv = SemiSupervisedStratifiedKFold(4, shuffle=True, random_state=0)
    scoring = labeled_scorer(METRICS) if wrap else METRICS
    result = cross_validate(_stand_in(), X, y, cv=cv, scoring=scoring)
    expected = _hand_scores(_stand_in(), {}, X, y, cv.split(X, y), METRICS)
    for name in METRICS:
        assert np.isfinite(result[f"test_{name}"]).all()
        np.testing.assert_allclose(result[f"test_{name}"], expected[name])


def test_grid_search_with_several_metrics_matches_a_hand_loop(noisy):
    X, y = noisy
    cv = RepeatedSemiSupervisedStratifiedKFold(n_splits=3, n_repeats=2, random_state=0)
    grid = {"estimator__C": [0.01, 1.0], "threshold": [0.6, 0.9]}
    search = GridSearchCV(
        _stand_in(), grid, cv=cv, scoring=labeled_scorer(METRICS), refit="accuracy"
    )
    search.fit(X, y)
    splits = list(cv.split(X, y))
    for index, params in enumerate(search.cv_results_["params"]):
        expected = _hand_scores(_stand_in(), params, X, y, splits, METRICS)
        for name in METRICS:
            got = _split_scores(search.cv_results_, index, name, len(splits))
            np.testing.assert_allclose(got, expected[name])
    means = search.cv_results_["mean_test_accuracy"]
    assert search.best_params_ == search.cv_results_["params"][np.argmax(means)]


def test_randomized_search_matches_a_hand_loop(noisy):
    X, y = noisy
    cv = SemiSupervisedKFold(3, shuffle=True, random_state=0)
    search = RandomizedSearchCV(
        _stand_in(),
        {"estimator__C": np.logspace(-3, 1, 20), "threshold": [0.6, 0.75, 0.9]},
        n_iter=3,
        cv=cv,
        scoring=labeled_scorer("balanced_accuracy"),
        random_state=0,
    )
    search.fit(X, y)
    splits = list(cv.split(X, y))
    for index, params in enumerate(search.cv_results_["params"]):
        expected = _hand_scores(
            _stand_in(), params, X, y, splits, ["balanced_accuracy"]
        )
        got = [search.cv_results_[f"split{k}_test_score"][index] for k in range(3)]
        np.testing.assert_allclose(got, expected["balanced_accuracy"])


def test_association_grid_search_matches_a_hand_loop(
    blobs_hard, fast_params, torch_single_thread
):
    """The real estimator, searched over visit_weight x walker_weight."""
    X, y = blobs_hard
    # With class_prior="auto" the four candidates happen to tie on these 30
    # test samples.
    params = {**_fast_params(fast_params), "class_prior": "uniform"}
    clf = SemiSupervisedAssociationClassifier(**params)
    cv = SemiSupervisedStratifiedKFold(3, shuffle=True, random_state=0)
    grid = {"visit_weight": [0.0, 1.0], "walker_weight": [0.0, 1.0]}
    # Default scoring: the estimator's score, the accuracy on the test fold,
    # whose samples are all labeled.
    search = GridSearchCV(clf, grid, cv=cv).fit(X, y)
    splits = list(cv.split(X, y))
    scores = search.cv_results_["mean_test_score"]
    assert np.ptp(scores) > 0  # the candidates differ: the match means something
    for index, params in enumerate(search.cv_results_["params"]):
        expected = _hand_scores(clf, params, X, y, splits, ["accuracy"])
        got = [search.cv_results_[f"split{k}_test_score"][index] for k in range(3)]
        np.testing.assert_allclose(got, expected["accuracy"])


def test_halving_search_over_max_iter_matches_a_hand_loop(
    blobs_hard, fast_params, torch_single_thread
):
    X, y = blobs_hard
    clf = SemiSupervisedAssociationClassifier(**_fast_params(fast_params))
    cv = SemiSupervisedStratifiedKFold(3)
    search = HalvingGridSearchCV(
        clf,
        {"visit_weight": [0.0, 0.5, 1.0, 2.0]},
        cv=cv,
        scoring=labeled_scorer("accuracy"),
        resource="max_iter",
        min_resources=10,
        max_resources=40,
        factor=2,
    ).fit(X, y)
    results = search.cv_results_
    np.testing.assert_array_equal(search.n_resources_, [10, 20, 40])
    splits = list(cv.split(X, y))
    for index, params in enumerate(results["params"]):
        assert params["max_iter"] == results["n_resources"][index]
        expected = _hand_scores(clf, params, X, y, splits, ["accuracy"])
        got = [results[f"split{k}_test_score"][index] for k in range(3)]
        np.testing.assert_allclose(got, expected["accuracy"])
