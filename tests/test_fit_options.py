"""The -1 convention, early stopping, class and sample weights (issue #24)."""

import warnings

import numpy as np
import pytest
import torch
from sklearn.utils.class_weight import compute_class_weight

import skassoc._engine._batches
import skassoc._engine._builtin
import skassoc._engine._optim
import skassoc._engine._step
from skassoc import SemiSupervisedAssociationClassifier

NO_MINUS_ONE = "no label is -1"


def make_clf(fast_params, **overrides):
    return SemiSupervisedAssociationClassifier(**{**fast_params, **overrides})


def weights_of(clf):
    return [p.detach().clone() for p in clf.model_.state_dict().values()]


def assert_same_weights(a, b):
    for x, y in zip(weights_of(a), weights_of(b), strict=True):
        assert torch.equal(x, y)


def drawn_pools(monkeypatch):
    """Record the unlabeled pool of every fit."""
    pools = []
    original = skassoc._engine._batches.unlabeled_pool

    def recording(encoded, pool):
        indices = original(encoded, pool)
        pools.append(np.asarray(indices))
        return indices

    monkeypatch.setattr(skassoc._engine._batches, "unlabeled_pool", recording)
    return pools


# ------------------------------------------------------- -1 and unlabeled_pool


def test_y_without_minus_one_warns_and_names_meta_estimators(fast_params, blobs):
    X, y = blobs
    with pytest.warns(UserWarning, match=NO_MINUS_ONE) as record:
        make_clf(fast_params, max_iter=2).fit(X, y)
    message = str(record[0].message)
    assert "cross_val_predict" in message and "unlabeled_pool='all'" in message


def test_unlabeled_pool_all_is_silent_and_draws_from_every_sample(
    fast_params, blobs, blobs_semi, monkeypatch
):
    pools = drawn_pools(monkeypatch)
    X, y = blobs
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_clf(fast_params, max_iter=2, unlabeled_pool="all").fit(X, y)
        make_clf(fast_params, max_iter=2, unlabeled_pool="all").fit(*blobs_semi)
        make_clf(fast_params, max_iter=2).fit(*blobs_semi)
    y_semi = blobs_semi[1]
    np.testing.assert_array_equal(pools[0], np.arange(len(y)))
    # "all" draws labeled samples too; the default only the -1 ones.
    np.testing.assert_array_equal(pools[1], np.arange(len(y)))
    np.testing.assert_array_equal(pools[2], np.flatnonzero(y_semi == -1))


def test_fallback_and_all_labels_setting_train_the_same(fast_params, blobs):
    X, y = blobs
    with pytest.warns(UserWarning, match=NO_MINUS_ONE):
        fallback = make_clf(fast_params).fit(X, y)
    explicit = make_clf(fast_params, unlabeled_pool="all").fit(X, y)
    assert_same_weights(fallback, explicit)


def test_re_encoded_labels_warn(fast_params, blobs_semi):
    """What cross_val_predict does to y: -1 becomes class 0 of 0..3."""
    from sklearn.preprocessing import LabelEncoder

    X, y_semi = blobs_semi
    with pytest.warns(UserWarning, match=NO_MINUS_ONE):
        clf = make_clf(fast_params, max_iter=2).fit(
            X, LabelEncoder().fit_transform(y_semi)
        )
    assert len(clf.classes_) == 4


def test_cross_val_predict_probabilities_warn(fast_params, blobs_semi):
    """The issue's symptom: cross_val_predict re-encodes y for predict_proba."""
    from sklearn.model_selection import cross_val_predict

    X, y_semi = blobs_semi
    clf = make_clf(fast_params, max_iter=2)
    with pytest.warns(UserWarning, match=NO_MINUS_ONE):
        proba = cross_val_predict(clf, X, y_semi, cv=2, method="predict_proba")
    assert proba.shape[1] == 4  # a column for the unlabeled samples


@pytest.mark.parametrize("as_object", [False, True])
def test_bytes_labels_are_refused(fast_params, blobs_semi, as_object):
    X, y_semi = blobs_semi
    y = y_semi.astype("S")
    if as_object:
        y = y.astype(object)
    with pytest.raises(TypeError, match="bytes labels.*astype\\(str\\)"):
        make_clf(fast_params).fit(X, y)


# ------------------------------------------------------------- early stopping


def test_early_stopping_stops_and_keeps_the_best_weights(fast_params, blobs_semi):
    X, y = blobs_semi
    params = dict(
        max_iter=400,
        early_stopping=True,
        validation_fraction=0.3,
        validation_interval=5,
        n_iter_no_change=3,
        # Validation scores the network's own probabilities; so do these.
        class_prior="uniform",
    )
    clf = make_clf(fast_params, **params).fit(X, y)
    history = clf.history_
    scores = history["validation_score"]
    assert clf.n_iter_ < 400
    assert clf.n_iter_ == history["validation_step"][-1] == history["step"][-1]
    assert clf.validation_scores_ == scores
    assert clf.best_validation_score_ == max(scores)
    # Stopped after n_iter_no_change validations without improvement.
    best = int(np.argmax(scores))
    assert len(scores) - 1 - best >= 3
    # The held-out samples: 30% of the 30 labeled ones, stratified.
    held_out = _held_out(clf, X, y)
    assert len(held_out) == 9
    assert np.bincount(y[held_out]).tolist() == [3, 3, 3]
    # The fitted weights are those of the best step, not the last one.
    assert clf.score(X[held_out], y[held_out]) == max(scores)


def _held_out(clf, X, y):
    from skassoc._inputs import hold_out_validation, validate_training_inputs

    inputs = validate_training_inputs(clf, X, y)
    seed = np.random.RandomState(clf.random_state).randint(np.iinfo(np.int32).max)
    held, _ = hold_out_validation(inputs, clf.validation_fraction, int(seed))
    return np.flatnonzero(held.encoded == -2)


def test_held_out_samples_are_neither_labeled_nor_unlabeled(
    fast_params, blobs_semi, monkeypatch
):
    pools = drawn_pools(monkeypatch)
    X, y = blobs_semi
    clf = make_clf(
        fast_params, max_iter=5, early_stopping=True, validation_fraction=0.3
    )
    clf.fit(X, y)
    held_out = _held_out(clf, X, y)
    assert not np.isin(held_out, pools[0]).any()
    # With unlabeled_pool="all" too.
    make_clf(
        fast_params,
        max_iter=5,
        early_stopping=True,
        validation_fraction=0.3,
        unlabeled_pool="all",
    ).fit(X, y)
    assert not np.isin(held_out, pools[1]).any()
    assert len(pools[1]) == len(y) - len(held_out)


def test_early_stopping_keeps_the_best_averaged_weights(fast_params, blobs_semi):
    X, y = blobs_semi
    clf = make_clf(
        fast_params,
        max_iter=60,
        early_stopping=True,
        validation_fraction=0.3,
        validation_interval=10,
        ema_decay=0.9,
        class_prior="uniform",
    ).fit(X, y)
    held_out = _held_out(clf, X, y)
    assert clf.score(X[held_out], y[held_out]) == clf.best_validation_score_


def test_early_stopping_validates_on_x_val_when_given(fast_params, blobs, blobs_semi):
    X, y_semi = blobs_semi
    X_val, y_val = blobs[0][::3], blobs[1][::3]
    clf = make_clf(
        fast_params,
        max_iter=40,
        early_stopping=True,
        validation_interval=10,
        class_prior="uniform",
    ).fit(X, y_semi, X_val=X_val, y_val=y_val)
    assert clf.score(X_val, y_val) == clf.best_validation_score_
    assert clf.history_["validation_step"][-1] == clf.n_iter_


def test_early_stopping_in_a_pipeline_search(fast_params, blobs_semi):
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = blobs_semi
    clf = make_clf(
        fast_params, early_stopping=True, validation_fraction=0.3, max_iter=20
    )
    labeled = np.flatnonzero(y != -1)
    unlabeled = np.flatnonzero(y == -1)
    cv = [(np.r_[unlabeled, labeled[::2]], labeled[1::2])]
    search = GridSearchCV(
        make_pipeline(StandardScaler(), clf),
        {"semisupervisedassociationclassifier__tol": [0.0, 0.5]},
        cv=cv,
    ).fit(X, y)
    fitted = search.best_estimator_[-1]
    assert fitted.best_validation_score_ is not None
    assert fitted.validation_scores_ == fitted.history_["validation_score"]


def test_without_early_stopping_the_model_is_the_last_steps(fast_params, blobs_semi):
    X, y = blobs_semi
    clf = make_clf(fast_params).fit(X, y)
    assert clf.n_iter_ == 30
    assert clf.validation_scores_ is None and clf.best_validation_score_ is None


def test_too_few_labeled_samples_to_split_are_refused(
    fast_params, blobs_semi, no_training
):
    X, y_semi = blobs_semi
    y_one = y_semi.copy()
    y_one[np.flatnonzero(y_one == 2)[1:]] = -1  # class 2: one labeled sample
    clf = make_clf(fast_params, early_stopping=True)
    with pytest.raises(ValueError, match="at least 2 labeled samples of every"):
        clf.fit(X, y_one)
    # 5% of 30 labeled samples: fewer held out than the 3 classes.
    clf.set_params(validation_fraction=0.05)
    with pytest.raises(ValueError, match="validation_fraction=0.05 of the 30"):
        clf.fit(X, y_semi)
    assert not hasattr(clf, "model_")


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if a training step runs."""

    def step(self):
        raise AssertionError("a training step ran before the input was rejected")

    monkeypatch.setattr(skassoc._engine._step.AssociationStep, "__call__", step)


def test_x_val_as_long_as_x_warns(fast_params, blobs, blobs_semi):
    X, y_semi = blobs_semi
    with pytest.warns(UserWarning, match="slices every fit parameter"):
        make_clf(fast_params, max_iter=2).fit(X, y_semi, X_val=X, y_val=blobs[1])


# -------------------------------------------------------------------- weights


def test_balanced_class_weight_equals_its_dict(fast_params, blobs_semi):
    X, y = blobs_semi
    y = y.copy()
    y[np.flatnonzero(y == 2)[:6]] = -1  # class 2: 4 labeled samples, others 10
    labeled = y[y >= 0]
    weights = compute_class_weight("balanced", classes=np.arange(3), y=labeled)
    balanced = make_clf(fast_params, class_weight="balanced").fit(X, y)
    explicit = make_clf(
        fast_params, class_weight=dict(enumerate(weights.tolist()))
    ).fit(X, y)
    assert_same_weights(balanced, explicit)
    plain = make_clf(fast_params).fit(X, y)
    assert not np.array_equal(plain.predict_proba(X), balanced.predict_proba(X))


def test_weights_change_the_fit(fast_params, blobs_semi):
    X, y = blobs_semi
    plain = make_clf(fast_params).fit(X, y)
    by_class = make_clf(fast_params, class_weight={0: 5.0}).fit(X, y)
    weights = np.where(np.arange(len(y)) % 2 == 0, 1.0, 4.0)
    by_sample = make_clf(fast_params).fit(X, y, sample_weight=weights)
    for other in (by_class, by_sample):
        assert not np.array_equal(plain.predict_proba(X), other.predict_proba(X))


def test_uniform_weights_equal_no_weights(fast_params, blobs_semi):
    X, y = blobs_semi
    plain = make_clf(fast_params).fit(X, y)
    uniform = make_clf(fast_params, class_weight={0: 2.0, 1: 2.0, 2: 2.0})
    uniform.fit(X, y, sample_weight=np.full(len(y), 3.0))
    assert_same_weights(plain, uniform)
    np.testing.assert_array_equal(plain.predict_proba(X), uniform.predict_proba(X))
    # Weights of unlabeled samples are ignored.
    unlabeled_only = np.where(y == -1, 7.0, 1.0)
    ignored = make_clf(fast_params).fit(X, y, sample_weight=unlabeled_only)
    assert_same_weights(plain, ignored)


def test_zero_weight_samples_are_not_learned_from(fast_params, blobs_semi):
    """A labeled sample of weight 0 only adds nothing to the loss."""
    X, y = blobs_semi
    weights = np.ones(len(y))
    weights[np.flatnonzero(y == 0)[:5]] = 0.0
    clf = make_clf(fast_params).fit(X, y, sample_weight=weights)
    assert np.isfinite(clf.history_["logit"]).all()


@pytest.mark.parametrize(
    "sample_weight, class_weight, error, match",
    [
        ("negative", None, ValueError, "[Nn]egative"),
        ("short", None, ValueError, "shape"),
        ("nan", None, ValueError, "NaN"),
        ("zero_labeled", None, ValueError, "weights of every labeled sample are 0"),
        (None, {7: 1.0}, ValueError, r"weights for \[7\], which are not classes"),
        (None, {0: -1.0}, ValueError, "non-negative"),
        (None, "balance", Exception, "class_weight"),
    ],
)
def test_bad_weights_are_refused(
    fast_params, blobs_semi, sample_weight, class_weight, error, match
):
    X, y = blobs_semi
    sample_weight = {
        None: None,
        "negative": np.where(np.arange(len(y)) == 3, -1.0, 1.0),
        "short": np.ones(len(y) - 1),
        "nan": np.where(np.arange(len(y)) == 3, np.nan, 1.0),
        "zero_labeled": np.where(y >= 0, 0.0, 1.0),
    }[sample_weight]
    clf = make_clf(fast_params, class_weight=class_weight)
    with pytest.raises(error, match=match):
        clf.fit(X, y, sample_weight=sample_weight)
    assert not hasattr(clf, "model_")


def test_weights_on_memory_mapped_inputs_match_arrays(
    fast_params, blobs_semi, tmp_path
):
    X, y = blobs_semi
    mapped = np.lib.format.open_memmap(
        tmp_path / "X.npy", mode="w+", dtype=np.float32, shape=X.shape
    )
    mapped[:] = X
    weights = np.where(np.arange(len(y)) % 3 == 0, 2.0, 1.0)
    in_memory = make_clf(fast_params).fit(mapped[:].copy(), y, sample_weight=weights)
    on_host = make_clf(fast_params).fit(mapped, y, sample_weight=weights)
    np.testing.assert_allclose(
        in_memory.predict_proba(X), on_host.predict_proba(X), atol=1e-5
    )


# ---------------------------------------------------------------- conventions


def test_html_repr_links_to_skassoc_docs(fast_params):
    clf = make_clf(fast_params)
    url = (
        "https://skassoc.readthedocs.io/en/latest/generated/"
        "skassoc.SemiSupervisedAssociationClassifier.html"
    )
    assert clf._get_doc_link() == url
    assert url in clf._repr_html_()


@pytest.mark.parametrize("available", [True, False])
def test_mps_device_resolution_without_the_hardware(monkeypatch, available):
    from skassoc._engine._device import resolve_device

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: available)
    if available:
        assert resolve_device("mps") == torch.device("mps")
        # "auto" never picks MPS.
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        assert resolve_device("auto") == torch.device("cpu")
    else:
        with pytest.raises(ValueError, match="MPS backend is not available"):
            resolve_device("mps")


@pytest.mark.parametrize(
    "class_weight", [None, "balanced", {0: 2.0, 1: 0.5}, {"a": 1.5}]
)
def test_new_parameters_survive_save_and_load(
    fast_params, blobs_semi, tmp_path, class_weight
):
    X, y = blobs_semi
    if isinstance(class_weight, dict) and "a" in class_weight:
        y = np.where(y == -1, "-1", np.array(["a", "b", "c"])[np.maximum(y, 0)])
    clf = make_clf(
        fast_params,
        unlabeled_pool="all",
        early_stopping=True,
        validation_fraction=0.3,
        validation_interval=10,
        n_iter_no_change=4,
        tol=0.01,
        class_weight=class_weight,
    ).fit(X, y)
    clf.save(tmp_path / "model.skassoc")
    loaded = SemiSupervisedAssociationClassifier.load(
        tmp_path / "model.skassoc", device="cpu"
    )
    assert loaded.get_params() == clf.get_params()
    assert loaded.best_validation_score_ == clf.best_validation_score_
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))


def test_model_file_bounds_of_the_new_parameters():
    from skassoc._params import SAFE_PARAMS

    check = SAFE_PARAMS["class_weight"]
    assert check(None) and check("balanced") and check([[0, 1.0], ["a", 2.0]])
    assert not check([[0, -1.0]]) and not check([[0, 1e9]]) and not check({"0": 1})
    assert not check([[True, 1.0]]) and not check([[0, 1.0, 2.0]])
    assert not check([[0, 1.0]] * (2**16 + 1))
    assert SAFE_PARAMS["unlabeled_pool"]("all")
    assert not SAFE_PARAMS["unlabeled_pool"]("labeled")
    assert not SAFE_PARAMS["validation_fraction"](1.0)
    assert not SAFE_PARAMS["validation_fraction"](0.0)
    assert not SAFE_PARAMS["n_iter_no_change"](0)
    assert not SAFE_PARAMS["tol"](float("inf"))


def test_numpy_integer_parameters_fit_as_python_ints(fast_params, blobs_semi):
    """NumPy ints pass validation; uint8 ones must not overflow in the batches."""
    X, y = blobs_semi
    sizes = dict(labeled_per_class=3, unlabeled_batch_size=5, max_iter=20)
    as_ints = make_clf(fast_params, **sizes).fit(X, y)
    as_uint8 = make_clf(
        fast_params, **{name: np.uint8(value) for name, value in sizes.items()}
    ).fit(X, y)
    assert_same_weights(as_ints, as_uint8)
    assert as_uint8.n_iter_ == 20
