"""The estimator end to end: fit, inference, images, attributes, sklearn API."""

import copy
import pickle
import warnings

import joblib
import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._defaults import auto_feature_noise
from skassoc._settings import fit_seed

pytestmark = pytest.mark.usefixtures("torch_single_thread")

HISTORY_KEYS = {"step", "learning_rate", "total", "walker", "visit", "logit"}


def make_clf(fast_params, **overrides):
    return SemiSupervisedAssociationClassifier(**{**fast_params, **overrides})


@pytest.fixture(scope="module")
def fitted(fast_params, blobs_semi):
    """A model fitted on the semi-supervised blobs; tests must not refit it."""
    X, y = blobs_semi
    return make_clf(fast_params, max_iter=60).fit(X, y)


# ------------------------------------------------------------ shapes, labels


def test_output_shapes_and_dtypes(fitted, blobs):
    X, y = blobs
    proba = fitted.predict_proba(X)
    assert proba.shape == (len(X), 3)
    # float64, as scikit-learn's classifiers return.
    assert proba.dtype == np.float64
    assert np.all(proba >= 0)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-5)

    pred = fitted.predict(X)
    assert pred.shape == (len(X),)
    assert pred.dtype == fitted.classes_.dtype
    np.testing.assert_array_equal(pred, fitted.classes_[proba.argmax(axis=1)])

    embedding = fitted.transform(X)
    assert embedding.shape == (len(X), fitted.embedding_dim_)
    assert embedding.shape[1] == 8
    assert embedding.dtype == np.float32
    assert np.isfinite(embedding).all()

    score = fitted.score(X, y)
    assert isinstance(score, float)
    # Three well-separated blobs, 10 labels each.
    assert score > 0.9


def _labels(kind, y_semi):
    """``y_semi`` (ints 0..2, -1 unlabeled) rewritten with other class names."""
    labeled = y_semi != -1
    if kind == "int":
        names = np.array([3, 7, 11])
        return np.where(labeled, names[y_semi], -1), names
    if kind == "negative_int":
        names = np.array([-5, 0, 5])
        return np.where(labeled, names[y_semi], -1), names
    if kind == "float":
        names = np.array([1.0, 2.0, 4.0])  # sklearn: 0.5 is continuous
        return np.where(labeled, names[y_semi], -1.0), names
    if kind == "object_str":
        names = np.array(["ant", "bee", "cat"], dtype=object)
        y = np.array(
            [names[k] if k != -1 else -1 for k in y_semi.tolist()], dtype=object
        )
        return y, names
    if kind == "str":
        names = np.array(["ant", "bee", "cat"])
        return np.where(labeled, names[y_semi], "-1"), names
    strings = np.where(labeled, np.array(["ant", "bee", "cat"])[y_semi], "-1")
    if kind == "object_str_marker":
        return strings.astype(object), np.array(["ant", "bee", "cat"], dtype=object)
    if kind == "pandas_str":
        return pd.Series(strings), np.array(["ant", "bee", "cat"], dtype=object)
    if kind == "pandas_categorical":
        return pd.Categorical(strings), np.array(["ant", "bee", "cat"], dtype=object)
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        "int",
        "negative_int",
        "float",
        "object_str",
        "str",
        "object_str_marker",
        "pandas_str",
        "pandas_categorical",
    ],
)
def test_predict_returns_labels_from_classes(fast_params, blobs, blobs_semi, kind):
    X, y_true = blobs
    _, y_semi = blobs_semi
    y, names = _labels(kind, y_semi)
    clf = make_clf(fast_params, max_iter=60).fit(X, y)

    np.testing.assert_array_equal(clf.classes_, names)
    pred = clf.predict(X)
    assert pred.shape == (len(X),)
    assert set(pred.tolist()) <= set(names.tolist())
    # The labels, not column indices: the classes are not 0..2 here, and the
    # predictions match the true class names.
    assert np.mean(pred == names[y_true]) > 0.9


# ------------------------------------------------------- semi-supervised gain


def _digits_split(X, y, n_labeled, seed):
    rng = np.random.RandomState(seed)
    order = rng.permutation(len(y))
    train, test = order[:1200], order[1200:]
    y_train = np.full(len(train), -1)
    for label in range(10):
        keep = np.flatnonzero(y[train] == label)[:n_labeled]
        y_train[keep] = label
    return X[train], y_train, X[test], y[test]


def test_unlabeled_data_helps_on_digits(digits):
    """Association with 5 labels a class beats the same network without it.

    Checked locally over 8 data splits and seeds: the gain in test accuracy
    was between 0.036 and 0.076 (mean 0.046); 0.02 leaves room for numeric
    noise (other BLAS, thread counts).
    """
    X, y = digits
    X_train, y_train, X_test, y_test = _digits_split(X, y, 5, seed=0)
    params = dict(
        network="mlp",
        hidden_layer_sizes=(64,),
        embedding_dim=32,
        labeled_per_class=5,
        unlabeled_batch_size=200,
        max_iter=400,
        learning_rate=5e-3,
        device="cpu",
        random_state=0,
    )
    semi = SemiSupervisedAssociationClassifier(**params).fit(X_train, y_train)
    supervised = SemiSupervisedAssociationClassifier(
        **params, walker_weight=0.0, visit_weight=0.0
    ).fit(X_train, y_train)
    semi_score = semi.score(X_test, y_test)
    supervised_score = supervised.score(X_test, y_test)
    assert supervised_score > 0.6  # the baseline learned something
    assert semi_score > supervised_score + 0.02


def test_all_labels_setting(fast_params, digits_small):
    """Without -1 labels every sample also serves as unlabeled."""
    X, y = digits_small
    clf = make_clf(
        fast_params,
        hidden_layer_sizes=(32,),
        embedding_dim=16,
        max_iter=100,
    )
    # The default unlabeled_pool warns: y may have lost its -1 on the way.
    with pytest.warns(UserWarning, match="y holds no unlabeled samples"):
        clf.fit(X, y)
    np.testing.assert_array_equal(clf.classes_, np.arange(10))
    assert clf.score(X, y) > 0.9
    walker = np.asarray(clf.history_["walker"])
    assert np.isfinite(walker).all()
    # The association losses train on the data: the walker loss falls.
    assert walker[-1] < walker[0]


# -------------------------------------------------------------------- images


def test_image_network_and_layouts(labeled_params, digits_images):
    X, y = digits_images  # (n, 8, 8) uint8
    params = {**labeled_params, "network": "auto", "max_iter": 10}
    clf = SemiSupervisedAssociationClassifier(**params).fit(X, y)
    # 8x8 images get the small-image network.
    assert clf.network_ == "small"
    assert clf.input_shape_ == (1, 8, 8)
    assert clf.n_features_in_ == 64
    proba = clf.predict_proba(X)
    assert np.isfinite(proba).all()
    # The same images in every accepted layout give the same outputs.
    for layout in (X[:, None], X.reshape(len(X), -1), X.tolist()):
        np.testing.assert_array_equal(clf.predict_proba(layout), proba)
        np.testing.assert_array_equal(clf.predict(layout), clf.predict(X))

    # Fitting on the other layouts trains the same model.
    for X_fit, input_shape in [
        (X[:, None], None),
        (X.tolist(), None),  # nested lists of images, as array-like allows
        (X.reshape(len(X), -1), (8, 8)),
        (X.reshape(len(X), -1), (1, 8, 8)),
    ]:
        other = SemiSupervisedAssociationClassifier(
            **params, input_shape=input_shape
        ).fit(X_fit, y)
        assert other.network_ == "small"
        assert other.input_shape_ == (1, 8, 8)
        np.testing.assert_allclose(other.predict_proba(X), proba, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_reversed_views_train_and_predict(labeled_params, digits_images, dtype):
    # Negative strides (X[::-1], np.flip) cannot become torch views.
    X, y = digits_images
    X = X.astype(dtype)
    params = {**labeled_params, "network": "mnist", "max_iter": 3}
    clf = SemiSupervisedAssociationClassifier(**params).fit(X[::-1], y[::-1])
    reference = SemiSupervisedAssociationClassifier(**params).fit(
        X[::-1].copy(), y[::-1].copy()
    )
    np.testing.assert_array_equal(clf.predict_proba(X), reference.predict_proba(X))
    flipped = X[..., ::-1]
    np.testing.assert_array_equal(
        clf.predict_proba(flipped), clf.predict_proba(flipped.copy())
    )


def _red_or_not(n, seed):
    """Random colour images; class 1 has a saturated red channel."""
    rng = np.random.RandomState(seed)
    X = rng.randint(0, 256, size=(n, 3, 8, 8)).astype(np.uint8)
    y = np.arange(n) % 2
    X[y == 1, 0] = 255
    return X, y


def test_color_images(labeled_params):
    # Only the red channel tells the classes apart: a network that dropped
    # or mixed up the channels could not learn them.
    X, y = _red_or_not(40, seed=0)
    clf = make_clf(labeled_params, network="auto", learning_rate=1e-3, max_iter=30).fit(
        X, y
    )
    assert clf.network_ == "small"
    assert clf.input_shape_ == (3, 8, 8)
    assert clf.n_features_in_ == 192
    X_new, y_new = _red_or_not(100, seed=1)
    assert clf.score(X_new, y_new) > 0.9
    np.testing.assert_array_equal(
        clf.predict(X_new.reshape(100, -1)), clf.predict(X_new)
    )


@pytest.mark.parametrize(
    "shape, expected_network, expected_input_shape",
    [
        ((64,), "mlp", None),
        ((8, 8), "small", (1, 8, 8)),
        ((27, 27), "small", (1, 27, 27)),
        ((28, 28), "mnist", (1, 28, 28)),
        ((4, 4), "mlp", (1, 4, 4)),  # too small for the convolutions
    ],
)
def test_auto_network(labeled_params, shape, expected_network, expected_input_shape):
    rng = np.random.RandomState(0)
    X = rng.rand(30, *shape) * 16
    y = np.arange(30) % 3
    clf = make_clf(labeled_params, network="auto", max_iter=3).fit(X, y)
    assert clf.network_ == expected_network
    assert clf.input_shape_ == expected_input_shape
    assert clf.predict(X).shape == (30,)


def test_custom_module_rows(fast_params, blobs, blobs_semi):
    X, y = blobs_semi
    y_true = blobs[1]
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.ELU(), torch.nn.Linear(16, 12)
    )
    before = {k: v.clone() for k, v in module.state_dict().items()}
    module.train()

    clf = make_clf(fast_params, network=module, max_iter=40).fit(X, y)

    assert clf.network_ == "custom"
    assert clf.embedding_dim_ == 12
    assert clf.score(X, y_true) > 0.9
    assert clf.transform(X).shape == (len(X), 12)
    assert clf.get_feature_names_out().shape == (12,)
    # The user's module is copied, never trained in place.
    after = module.state_dict()
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, rtol=0, atol=0)
    assert module.training
    assert clf.model_.embedder is not module
    assert clf.get_params()["network"] is module
    # And the copy did train.
    trained = clf.model_.embedder.state_dict()
    assert not torch.equal(trained["0.weight"], before["0.weight"])


def test_custom_module_images(labeled_params, digits_images):
    X, y = digits_images
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3),  # needs (n, c, h, w) input
        torch.nn.ELU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 10),
    )
    clf = make_clf(labeled_params, network=module, max_iter=10).fit(X, y)
    assert clf.network_ == "custom"
    assert clf.embedding_dim_ == 10
    assert clf.input_shape_ == (1, 8, 8)
    np.testing.assert_array_equal(clf.predict(X), clf.predict(X[:, None]))


# --------------------------------------------------------- fitted attributes


def test_fitted_attributes(fast_params, blobs_semi):
    X, y = blobs_semi
    clf = make_clf(fast_params, max_iter=30)
    assert not hasattr(clf, "classes_")
    clf.fit(X, y)

    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    assert clf.n_features_in_ == 4
    assert not hasattr(clf, "feature_names_in_")
    assert clf.n_iter_ == 30
    assert clf.input_shape_ is None
    assert clf.network_ == "mlp"
    assert clf.embedding_dim_ == 8
    assert clf.device_ == torch.device("cpu")
    assert all(p.device.type == "cpu" for p in clf.model_.parameters())
    assert not clf.model_.training

    history = clf.history_
    assert set(history) >= HISTORY_KEYS
    lengths = {len(history[key]) for key in HISTORY_KEYS}
    assert len(lengths) == 1 and lengths.pop() >= 1
    steps = history["step"]
    assert steps == sorted(set(steps))
    assert steps[-1] == 30
    for key in HISTORY_KEYS:
        assert np.isfinite(history[key]).all(), key
    assert all(v > 0 for v in history["learning_rate"])
    # lr decays by lr_decay every quarter of max_iter.
    assert history["learning_rate"][-1] < history["learning_rate"][0]


def _same_weights(a, b):
    return all(
        torch.equal(p, q)
        for p, q in zip(a.model_.parameters(), b.model_.parameters(), strict=True)
    )


@pytest.mark.parametrize("ema_decay", [None, 0.9])
def test_validation_scores_the_model_of_each_step(
    fast_params, blobs, blobs_semi, ema_decay
):
    X, y_semi = blobs_semi
    X_val, y_val = blobs[0][::2], blobs[1][::2]
    # Validation scores the network's own probabilities: compare them with
    # the scores of those.
    params = dict(max_iter=25, validation_interval=10, ema_decay=ema_decay)
    params.update(class_prior="uniform")
    clf = make_clf(fast_params, **params).fit(X, y_semi, X_val=X_val, y_val=y_val)
    history = clf.history_
    assert history["validation_step"] == [10, 20, 25]
    assert all(0 <= score <= 1 for score in history["validation_score"])
    # The last score is that of the fitted model (with an average of the
    # weights, of the averaged weights), and scoring changed no weight.
    assert history["validation_score"][-1] == clf.score(X_val, y_val)
    plain = make_clf(fast_params, **params).fit(X, y_semi)
    assert _same_weights(clf, plain)
    assert "validation_score" not in plain.history_
    # A shorter fit scores what the longer one scored at the same step.
    short = make_clf(fast_params, **{**params, "max_iter": 10, "lr_decay_steps": 6})
    longer = make_clf(fast_params, **{**params, "max_iter": 20, "lr_decay_steps": 6})
    short.fit(X, y_semi, X_val=X_val, y_val=y_val)
    longer.fit(X, y_semi, X_val=X_val, y_val=y_val)
    assert longer.history_["validation_score"][0] == short.score(X_val, y_val)


def test_validation_of_string_labels_and_images(fast_params, digits_images):
    X, y = digits_images
    labels = np.array(list("abcdefghij"))[y]
    y_semi = np.where(np.arange(len(y)) % 4 == 0, labels, "-1")
    clf = make_clf(
        fast_params,
        network="mnist",
        max_iter=4,
        validation_interval=2,
        labeled_per_class=2,
        class_prior="uniform",  # as validation scores (see above)
    )
    clf.fit(X, y_semi, X_val=X[:50], y_val=labels[:50])
    assert clf.history_["validation_step"] == [2, 4]
    assert clf.history_["validation_score"][-1] == clf.score(X[:50], labels[:50])


def test_compiled_network_trains_the_same_steps(
    fast_params, digits_images, monkeypatch
):
    # The "eager" backend traces the network with TorchDynamo and runs the
    # traced graph as it is: the same arithmetic, without a C++ compiler.
    import skassoc._engine._step

    compiled = []
    compile_function = torch.compile

    def recording_compile(function, **options):
        compiled.append(options)
        return compile_function(function, **options)

    monkeypatch.setattr(skassoc._engine._step.torch, "compile", recording_compile)
    X, y = digits_images
    y_semi = np.where(np.arange(len(y)) % 4 == 0, y, -1)
    params = dict(network="mnist", max_iter=6, labeled_per_class=2)
    plain = make_clf(fast_params, **params).fit(X, y_semi)
    assert compiled == []
    clf = make_clf(fast_params, **params, compile={"backend": "eager"})
    clf.fit(X, y_semi)
    assert compiled == [{"backend": "eager"}]
    assert _same_weights(clf, plain)
    np.testing.assert_array_equal(clf.predict_proba(X), plain.predict_proba(X))


def test_learning_rate_history_is_the_rate_of_the_logged_steps(fast_params, blobs_semi):
    X, y = blobs_semi
    clf = make_clf(
        fast_params, max_iter=40, lr_decay_steps=10, lr_decay=0.5, learning_rate=1e-2
    ).fit(X, y)
    assert clf.history_["step"] == [10, 20, 30, 40]
    # Steps 1-10 run at 1e-2, 11-20 at 5e-3, ...: each entry is the rate of
    # the last step it covers.
    assert clf.history_["learning_rate"] == pytest.approx([1e-2, 5e-3, 2.5e-3, 1.25e-3])


def test_cosine_schedule_falls_after_the_warm_up(fast_params, blobs_semi):
    X, y = blobs_semi
    params = dict(max_iter=40, learning_rate=1e-2, lr_schedule="cosine")
    clf = make_clf(fast_params, **params, lr_warmup_steps=10).fit(X, y)
    rates = clf.history_["learning_rate"]
    # Step 10 ends the warm-up at the full rate; then half a cosine, whose
    # last step (40) runs at the rate of 29/30 of the way down.
    assert rates[0] == pytest.approx(1e-2)
    assert rates[1:] == sorted(rates[1:], reverse=True)
    assert rates[-1] == pytest.approx(1e-2 * 0.5 * (1 + np.cos(np.pi * 29 / 30)))
    # The warm-up changed the fit.
    no_warm_up = make_clf(fast_params, **params, lr_warmup_steps=0).fit(X, y)
    assert not np.allclose(no_warm_up.predict_proba(X), clf.predict_proba(X))


def _schedule(**overrides):
    from types import SimpleNamespace

    config = dict(
        lr_schedule="step", lr_warmup_steps=0, lr_decay=0.33, lr_decay_steps=7
    )
    return SimpleNamespace(**{**config, "max_iter": 30, **overrides})


@pytest.mark.parametrize("schedule", ["step", "cosine"])
def test_warm_up_grows_linearly_to_the_rate_then_the_schedule_runs(schedule):
    from skassoc._engine._optim import LearningRateFactor

    factor = LearningRateFactor(_schedule(lr_schedule=schedule, lr_warmup_steps=4))
    assert [factor(step) for step in range(3)] == pytest.approx([0.25, 0.5, 0.75])
    assert factor(3) == pytest.approx(1.0)
    if schedule == "step":
        # Decays count from the first step: the warm-up's steps among them.
        assert factor(7) == pytest.approx(0.33)
    else:
        # The cosine starts after the warm-up and nears 0 at the last step.
        assert factor(4) == pytest.approx(1.0)
        assert 0 < factor(29) < min(factor(28), 0.01)


def test_step_schedule_factors_are_torchs_steplr():
    from skassoc._engine._optim import LearningRateFactor

    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    reference = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.33)
    factor = LearningRateFactor(_schedule())
    for step in range(30):
        assert factor(step) == pytest.approx(reference.get_last_lr()[0])
        optimizer.step()
        reference.step()


@pytest.mark.parametrize("schedule", ["step", "cosine"])
def test_a_tensor_rate_kept_in_place_follows_the_schedule(schedule):
    """As in a CUDA graph: the optimizer's rate is one tensor, updated in place.

    Before torch 2.4 the scheduler took that tensor as its base rate, so
    writing each step's rate into it compounded the factors.
    """
    from skassoc._engine._optim import LearningRateFactor, Optimization

    config = _schedule(
        lr_schedule=schedule, lr_warmup_steps=3, lr_decay_steps=5, learning_rate=0.1
    )
    weight = torch.nn.Parameter(torch.zeros(1))
    weight.grad = torch.zeros(1)
    groups = [{"params": [weight]}]
    # capturable=True on the CPU: the rate is a tensor, as in a CUDA graph.
    optimization = Optimization(groups, config, torch.device("cpu"), True)
    rate = optimization.optimizer.param_groups[0]["lr"]
    assert isinstance(rate, torch.Tensor)
    factor = LearningRateFactor(config)
    for step in range(30):
        assert optimization.optimizer.param_groups[0]["lr"] is rate
        assert float(rate) == pytest.approx(0.1 * factor(step), rel=1e-6)
        optimization.step()  # fused Adam on the CPU takes a tensor rate
        optimization.next_rate()


def test_a_fit_that_ends_no_better_than_a_guess_warns(fast_params):
    # Identical inputs: the network's output cannot depend on them, as after
    # a fit that diverged into one class.
    rng = np.random.RandomState(0)
    X = np.ones((300, 4))
    y = np.where(np.arange(300) % 10 == 0, rng.randint(0, 3, 300), -1)
    with pytest.warns(ConvergenceWarning, match="no lower than a constant guess"):
        make_clf(fast_params, max_iter=100).fit(X, y)
    # Too short a fit to judge: no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        make_clf(fast_params, max_iter=30).fit(X, y)


def test_a_fit_that_learned_its_labels_does_not_warn(fast_params, blobs_semi):
    X, y = blobs_semi
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        clf = make_clf(fast_params, max_iter=100).fit(X, y)
    assert clf.history_["logit"][-1] < 0.5 * np.log(len(clf.classes_))


def test_a_warm_up_as_long_as_the_fit_is_refused(fast_params, blobs_semi):
    X, y = blobs_semi
    clf = make_clf(fast_params, max_iter=20, lr_warmup_steps=20)
    with pytest.raises(ValueError, match="lr_warmup_steps=20 leaves no step"):
        clf.fit(X, y)
    assert not hasattr(clf, "classes_")


def test_association_off_until_delay(fast_params, blobs_semi):
    """With association_delay >= max_iter only the classification loss trains."""
    X, y = blobs_semi
    # Without feature noise, whose draws would differ between the two fits.
    params = {**fast_params, "augmentation": None, "consistency_weight": 0}
    delayed = make_clf(params, association_delay=30).fit(X, y)
    supervised = make_clf(params, walker_weight=0.0, visit_weight=0.0).fit(X, y)
    np.testing.assert_array_equal(delayed.predict_proba(X), supervised.predict_proba(X))
    # The association losses are still logged while switched off.
    assert np.isfinite(delayed.history_["walker"]).all()
    # And switched on, they change the model.
    associated = make_clf(params, association_delay=10).fit(X, y)
    assert not np.allclose(associated.predict_proba(X), supervised.predict_proba(X))


def test_feature_names_from_dataframe(fast_params, blobs_semi):
    X, y = blobs_semi
    columns = ["a", "b", "c", "d"]
    df = pd.DataFrame(X, columns=columns)
    clf = make_clf(fast_params).fit(df, y)
    np.testing.assert_array_equal(clf.feature_names_in_, columns)
    np.testing.assert_array_equal(clf.get_feature_names_out().shape, (8,))
    with pytest.warns(UserWarning, match="feature names"):
        np.testing.assert_array_equal(clf.predict(X), clf.predict(df))
    with pytest.raises(ValueError, match="feature names"):
        clf.predict(df[["b", "a", "c", "d"]])


# --------------------------------------------------------------- random state


def test_random_state_reproducible(fast_params, blobs_semi):
    X, y = blobs_semi
    first = make_clf(fast_params, random_state=3).fit(X, y).predict_proba(X)
    second = make_clf(fast_params, random_state=3).fit(X, y).predict_proba(X)
    np.testing.assert_array_equal(first, second)
    other = make_clf(fast_params, random_state=4).fit(X, y).predict_proba(X)
    assert not np.allclose(first, other)


def test_fit_leaves_global_random_streams_alone(fast_params, blobs_semi):
    X, y = blobs_semi
    # The legacy global NumPy stream is the one random_state=None would use.
    torch.manual_seed(123)
    np.random.seed(123)  # noqa: NPY002
    expected_torch, expected_numpy = torch.rand(3), np.random.rand(3)  # noqa: NPY002
    torch.manual_seed(123)
    np.random.seed(123)  # noqa: NPY002
    make_clf(fast_params, max_iter=5, random_state=0).fit(X, y)
    torch.testing.assert_close(torch.rand(3), expected_torch)
    np.testing.assert_array_equal(np.random.rand(3), expected_numpy)  # noqa: NPY002


# ------------------------------------------------------------------ inference


def test_predict_in_small_batches(fitted, blobs):
    X, _ = blobs
    small = copy.deepcopy(fitted).set_params(predict_batch_size=7)
    assert len(X) % 7 != 0
    np.testing.assert_allclose(
        small.predict_proba(X), fitted.predict_proba(X), rtol=0, atol=1e-6
    )
    np.testing.assert_array_equal(small.predict(X), fitted.predict(X))
    np.testing.assert_allclose(
        small.transform(X), fitted.transform(X), rtol=0, atol=1e-5
    )
    # A single sample, and one batch of exactly the batch size.
    assert small.predict(X[:1]).shape == (1,)
    assert small.predict_proba(X[:7]).shape == (7, 3)


def test_verbose_progress_bar(fast_params, blobs_semi, capsys):
    X, y = blobs_semi
    make_clf(fast_params, verbose=1, max_iter=20).fit(X, y)
    err = capsys.readouterr().err
    assert "skassoc" in err


def test_verbose_says_what_auto_chose(fast_params, blobs_semi, capsys):
    X, y = blobs_semi
    make_clf(fast_params, verbose=1, max_iter=20, labeled_per_class="auto").fit(X, y)
    noise = auto_feature_noise(X, fit_seed(fast_params["random_state"]))
    first = capsys.readouterr().err.splitlines()[0]
    assert first == (
        "skassoc: network mlp on cpu, 20 steps of 10 labeled samples per class "
        f"and {fast_params['unlabeled_batch_size']} unlabeled ones, feature noise "
        f"{noise:.3g}, consistency weight 2"
    )
    images = np.zeros((40, 8, 8)), np.arange(40) % 2
    make_clf(
        fast_params,
        verbose=1,
        max_iter=2,
        network="auto",
        augmentation="paper",
        unlabeled_pool="all",
    ).fit(*images)
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("skassoc: network small on cpu, 2 steps")
    assert first.endswith(", image augmentation")


def test_the_bar_stays_and_verbose_2_adds_rate_and_validation(
    fast_params, blobs_semi, capsys
):
    X, y = blobs_semi
    make_clf(fast_params, verbose=1, max_iter=20).fit(X, y)
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    # The bar is left on screen at the end: all steps, their time, the losses.
    assert "20/20" in last and "walker=" in last and "lr=" not in last
    # A validation set of another length than X: one as long warns.
    X_val, y_val = X[::2], np.where(y == -1, 0, y)[::2]
    make_clf(fast_params, verbose=2, max_iter=20, validation_interval=10).fit(
        X, y, X_val=X_val, y_val=y_val
    )
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "20/20" in last and "lr=" in last and "val=" in last


@pytest.mark.parametrize("verbose", [1, 2])
def test_verbose_validation_before_the_first_losses(
    fast_params, blobs_semi, capsys, verbose
):
    # The losses are read back every 10 steps; the validation runs every step.
    X, y = blobs_semi
    make_clf(
        fast_params,
        verbose=verbose,
        max_iter=12,
        validation_interval=1,
        early_stopping=True,
        n_iter_no_change=100,
    ).fit(X, y)
    last = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert "12/12" in last and "walker=" in last


def test_quiet_by_default(fast_params, blobs_semi, capsys):
    X, y = blobs_semi
    make_clf(fast_params, max_iter=20).fit(X, y)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


# ------------------------------------------------------ scikit-learn citizen


def test_clone_and_params_round_trip(fitted, fast_params):
    cloned = clone(fitted)
    assert not hasattr(cloned, "classes_")
    assert cloned.get_params() == fitted.get_params()

    other = SemiSupervisedAssociationClassifier()
    assert other.set_params(**fitted.get_params()) is other
    assert other.get_params() == fitted.get_params()
    other.set_params(walker_weight=0.5, visit_weight=0.25)
    assert other.get_params()["walker_weight"] == 0.5
    assert other.visit_weight == 0.25


def test_pipeline(fast_params, blobs, blobs_semi):
    X, y_true = blobs
    _, y = blobs_semi
    pipe = make_pipeline(StandardScaler(), make_clf(fast_params, max_iter=60))
    pipe.fit(X, y)
    assert pipe.predict(X).shape == (len(X),)
    assert pipe.score(X, y_true) > 0.9
    assert pipe.transform(X).shape == (len(X), 8)


def test_grid_search(labeled_params, blobs):
    X, y = blobs
    grid = GridSearchCV(
        make_clf(labeled_params, max_iter=20),
        {"walker_weight": [0.0, 1.0], "visit_weight": [0.0, 1.0]},
        cv=2,
        n_jobs=1,
        scoring="neg_log_loss",
    )
    grid.fit(X, y)
    assert set(grid.best_params_) == {"walker_weight", "visit_weight"}
    assert len(grid.cv_results_["params"]) == 4
    scores = grid.cv_results_["mean_test_score"]
    assert np.isfinite(scores).all()
    # The searched weights reach training: every candidate scores otherwise.
    assert len(np.unique(scores)) == 4
    assert grid.best_estimator_.n_iter_ == 20
    assert grid.predict(X).shape == (len(X),)


def test_cross_val_score(labeled_params, blobs):
    X, y = blobs
    scores = cross_val_score(make_clf(labeled_params, max_iter=40), X, y, cv=3)
    assert scores.shape == (3,)
    assert np.all((scores >= 0) & (scores <= 1))
    assert scores.mean() > 0.8


def test_pickle_round_trip(fitted, blobs):
    X, _ = blobs
    loaded = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(loaded.predict_proba(X), fitted.predict_proba(X))
    np.testing.assert_array_equal(loaded.predict(X), fitted.predict(X))
    np.testing.assert_array_equal(loaded.classes_, fitted.classes_)
    assert loaded.device_ == torch.device("cpu")
    assert loaded.history_ == fitted.history_


def test_joblib_round_trip(fitted, blobs, tmp_path):
    X, _ = blobs
    path = tmp_path / "model.joblib"
    joblib.dump(fitted, path)
    loaded = joblib.load(path)
    np.testing.assert_array_equal(loaded.predict_proba(X), fitted.predict_proba(X))
    np.testing.assert_array_equal(loaded.transform(X), fitted.transform(X))


def test_set_output_pandas(fast_params, blobs_semi):
    X, y = blobs_semi
    index = pd.RangeIndex(100, 100 + len(X))
    df = pd.DataFrame(X, columns=list("abcd"), index=index)
    clf = make_clf(fast_params).set_output(transform="pandas").fit(df, y)
    out = clf.transform(df)
    assert isinstance(out, pd.DataFrame)
    names = clf.get_feature_names_out()
    assert len(names) == clf.embedding_dim_
    assert all(name.startswith("semisupervisedassociationclassifier") for name in names)
    assert list(out.columns) == list(names)
    assert out.index.equals(index)
    # Only the container changes.
    clf.set_output(transform="default")
    np.testing.assert_array_equal(out.to_numpy(), clf.transform(df))
    assert isinstance(clf.predict(df), np.ndarray)


def test_unpickle_cuda_model_without_cuda(fitted, blobs, monkeypatch):
    """A model pickled on a GPU machine loads onto the CPU where there is none."""
    X, _ = blobs
    expected = fitted.predict_proba(X)
    clf = copy.deepcopy(fitted)  # a private copy to tamper with
    clf.device_ = torch.device("cuda")  # as if trained on a GPU
    state = pickle.dumps(clf)
    clf.device_ = torch.device("cpu")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    loaded = pickle.loads(state)
    assert loaded.device_ == torch.device("cpu")
    assert all(p.device.type == "cpu" for p in loaded.model_.parameters())
    np.testing.assert_array_equal(loaded.predict_proba(X), expected)


def test_pickling_leaves_the_estimator_alone(fitted):
    clf = copy.deepcopy(fitted)
    model = clf.model_
    clf.device_ = torch.device("cuda")  # as if trained on a GPU
    before = dict(vars(clf))
    pickle.dumps(clf)
    assert clf.model_ is model
    assert vars(clf) == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fit_predict_and_pickle(fast_params, blobs_semi):
    X, y = blobs_semi
    clf = make_clf(fast_params, device="cuda", max_iter=40).fit(X, y)
    assert clf.device_.type == "cuda"
    assert all(p.device.type == "cuda" for p in clf.model_.parameters())
    proba = clf.predict_proba(X)
    assert np.isfinite(proba).all()
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-5)

    loaded = pickle.loads(pickle.dumps(clf))
    assert loaded.device_.type == "cuda"
    assert all(p.device.type == "cuda" for p in loaded.model_.parameters())
    np.testing.assert_allclose(loaded.predict_proba(X), proba, atol=1e-6)
    # Pickling copies the model to the CPU; the estimator keeps its own.
    assert all(p.device.type == "cuda" for p in clf.model_.parameters())
    np.testing.assert_allclose(clf.predict_proba(X), proba, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    "module_device",
    ["cpu", "cuda"],
)
def test_cuda_custom_module(fast_params, blobs_semi, module_device):
    X, y = blobs_semi
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.ELU(), torch.nn.Linear(16, 12)
    ).to(module_device)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    clf = make_clf(fast_params, network=module, device="cuda", max_iter=20).fit(X, y)
    assert clf.embedding_dim_ == 12
    assert all(p.device.type == "cuda" for p in clf.model_.parameters())
    assert clf.predict(X).shape == (len(X),)
    for name, value in module.state_dict().items():
        assert value.device.type == module_device
        assert torch.equal(value, before[name])
