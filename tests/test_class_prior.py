"""class_prior: the class frequencies that training and predictions assume."""

import copy
import io
import json
import zipfile
from hashlib import sha256

import numpy as np
import pytest
import torch

import skassoc._fit
from skassoc import (
    RECIPES,
    SemiSupervisedAssociationClassifier,
    _classifier,
    _prior,
    convert_model_file,
    recipe_params,
)
from skassoc._engine._batches import make_batches
from skassoc._engine._losses import LOG_EPSILON, visit_loss
from skassoc._engine._step import class_frequencies, visit_start_weights
from skassoc._inputs import HELD_OUT, UNLABELED, validate_training_inputs
from skassoc._io._format import METADATA_MEMBER, WEIGHTS_MEMBER
from skassoc._prior import (
    apply_class_prior,
    estimate_class_prior,
    prior_samples,
    training_class_prior,
    uniform_prior,
)
from skassoc._settings import fit_seed, resolve_fit_settings


def _posteriors(n_first, n_second, rng):
    """Exact equal-frequency posteriors of two unit Gaussians at -1 and +1."""
    x = np.concatenate([rng.normal(-1, 1, n_first), rng.normal(1, 1, n_second)])
    # log N(x; 1, 1) - log N(x; -1, 1) = 2x.
    second = 1 / (1 + np.exp(-2 * x))
    return np.column_stack([1 - second, second])


def test_estimates_move_toward_the_frequencies_and_never_past_them():
    # Calibrated probabilities of samples whose first class has each share:
    # the estimate lies between equal frequencies and the truth, and grows
    # with the truth.
    rng = np.random.default_rng(0)
    n, estimates = 20_000, []
    for share in (0.5, 0.65, 0.8, 0.95):
        proba = _posteriors(int(share * n), n - int(share * n), rng)
        prior = estimate_class_prior(proba)
        assert prior.sum() == pytest.approx(1)
        assert 0.5 - 0.01 <= prior[0] <= share + 0.01
        estimates.append(prior[0])
    assert estimates[0] == pytest.approx(0.5, abs=0.01)
    assert np.all(np.diff(estimates) > 0.03)


def test_frequencies_reweigh_by_bayes_rule_and_equal_ones_change_nothing():
    proba = np.array([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]])
    weighted = apply_class_prior(proba, np.array([0.75, 0.25]))
    expected = proba * [3, 1] / (proba * [3, 1]).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(weighted, expected)
    assert apply_class_prior(proba, np.array([0.5, 0.5])) is proba


def test_frequencies_are_estimated_on_the_unlabeled_samples_at_most_a_cap(
    monkeypatch,
):
    encoded = np.array([0, UNLABELED, 1, UNLABELED, HELD_OUT, UNLABELED, 0])
    np.testing.assert_array_equal(prior_samples(encoded, 0), [1, 3, 5])
    assert len(prior_samples(np.array([0, HELD_OUT, 1]), 0)) == 0
    monkeypatch.setattr(_prior, "PRIOR_SAMPLES", 2)
    drawn = prior_samples(encoded, 0)
    assert len(drawn) == 2 and set(drawn) <= {1, 3, 5}
    assert list(drawn) == sorted(drawn)
    np.testing.assert_array_equal(prior_samples(encoded, 0), drawn)


@pytest.fixture(scope="module")
def imbalanced():
    """Two overlapping classes, 9 of 10 samples in the first; 10 labels each."""
    rng = np.random.default_rng(0)
    n_first, n_second = 900, 100
    X = np.concatenate(
        [rng.normal(0, 1, (n_first, 2)), rng.normal(1.5, 1, (n_second, 2))]
    )
    y = np.repeat([0, 1], [n_first, n_second])
    y_semi = np.full_like(y, -1)
    for label in (0, 1):
        y_semi[rng.choice(np.flatnonzero(y == label), 10, replace=False)] = label
    return X, y, y_semi


def _make(**params):
    defaults = dict(network="mlp", max_iter=200, augmentation=None)
    return SemiSupervisedAssociationClassifier(
        **{**defaults, **params}, device="cpu", random_state=0
    )


def _fit(X, y, **params):
    return _make(**params).fit(X, y)


@pytest.fixture(scope="module")
def fitted_pair(imbalanced):
    """The same network fitted with class_prior "uniform" and "auto"."""
    X, _, y_semi = imbalanced
    return _fit(X, y_semi, class_prior="uniform"), _fit(X, y_semi)


def test_auto_estimates_the_unlabeled_frequencies_and_predicts_with_them(
    imbalanced, fitted_pair
):
    X, y, y_semi = imbalanced
    uniform, auto = fitted_pair
    np.testing.assert_array_equal(uniform.class_prior_, [0.5, 0.5])
    # "auto" trains as "uniform": the networks are the same.
    np.testing.assert_array_equal(uniform.transform(X), auto.transform(X))
    own = uniform.predict_proba(X[y_semi == -1])
    np.testing.assert_array_equal(auto.class_prior_, estimate_class_prior(own))
    assert auto.class_prior_[0] > 0.75
    expected = apply_class_prior(uniform.predict_proba(X), auto.class_prior_)
    np.testing.assert_allclose(auto.predict_proba(X), expected, rtol=1e-12)
    # Fewer samples go to the rare class, and more are right.
    assert (auto.predict(X) == 1).sum() < (uniform.predict(X) == 1).sum()
    assert auto.score(X, y) > uniform.score(X, y)


def test_validation_scores_the_networks_own_probabilities(imbalanced):
    X, y, y_semi = imbalanced
    X_val, y_val = X[::7], y[::7]
    fits = [
        _make(class_prior=prior, validation_interval=50).fit(
            X, y_semi, X_val=X_val, y_val=y_val
        )
        for prior in ("uniform", "auto")
    ]
    assert fits[0].validation_scores_ == fits[1].validation_scores_
    assert fits[0].validation_scores_[-1] == fits[0].score(X_val, y_val)


def test_without_unlabeled_samples_the_labels_give_the_frequencies(imbalanced):
    X, y, _ = imbalanced
    keep = np.r_[0:90, 900:910]  # 90 samples of class 0, 10 of class 1
    clf = _make(max_iter=5, unlabeled_pool="all").fit(X[keep], y[keep])
    np.testing.assert_array_equal(clf.class_prior_, [0.9, 0.1])
    # Samples held out for validation are left out.
    held = _make(
        max_iter=5, unlabeled_pool="all", early_stopping=True, validation_fraction=0.5
    ).fit(X[keep], y[keep])
    np.testing.assert_array_equal(held.class_prior_, [0.9, 0.1])


def _own_probabilities(clf, X):
    """The network's own probabilities: those of equal frequencies."""
    own = copy.deepcopy(clf)
    own.class_prior_ = uniform_prior(len(clf.classes_))
    return own.predict_proba(X)


def test_given_frequencies_are_used_as_given(imbalanced):
    X, _, y_semi = imbalanced
    given = _fit(X, y_semi, class_prior=[3, 1])
    np.testing.assert_array_equal(given.class_prior_, [0.75, 0.25])
    expected = apply_class_prior(_own_probabilities(given, X), np.array([0.75, 0.25]))
    np.testing.assert_allclose(given.predict_proba(X), expected, rtol=1e-12)


def test_walks_start_at_each_class_in_its_share():
    labels = torch.tensor([0, 0, 1, 1, 1, 2])
    weights = visit_start_weights((0.5, 0.3, 0.2), labels)
    expected = torch.tensor([0.25, 0.25, 0.1, 0.1, 0.1, 0.2], dtype=torch.float64)
    torch.testing.assert_close(weights, expected)
    assert visit_start_weights(None, labels) is None
    p_ab = torch.softmax(
        torch.randn(6, 4, generator=torch.Generator().manual_seed(0)), 1
    )
    expected = -torch.log(LOG_EPSILON + (weights @ p_ab.double()).float()).mean()
    torch.testing.assert_close(visit_loss(p_ab, weights), expected)
    torch.testing.assert_close(
        visit_loss(p_ab, torch.full((6,), 1 / 6)), visit_loss(p_ab)
    )


def test_only_given_frequencies_change_training():
    assert training_class_prior("auto") is None
    assert training_class_prior("uniform") is None
    assert training_class_prior(np.array([0.75, 0.25])) == (0.75, 0.25)
    # Equal ones weigh the walks equally, as the paper.
    assert visit_start_weights((0.5, 0.5), torch.tensor([0, 1])) is None


def test_given_frequencies_are_the_balance_losss_target(blobs_semi):
    X, y_semi = blobs_semi
    clf = _make(class_prior=[0.5, 0.3, 0.2], balance_weight=1.0)
    inputs = validate_training_inputs(clf, X, y_semi)
    settings = resolve_fit_settings(clf, inputs)
    batches = make_batches(inputs, settings)
    losses = class_frequencies(settings.training, batches)
    torch.testing.assert_close(losses.class_shares, torch.tensor([0.5, 0.3, 0.2]))
    torch.testing.assert_close(
        losses.visit_start_weights.sum().float(), torch.tensor(1.0)
    )
    # Without them, the balance loss aims at the labels' shares.
    plain = _make(balance_weight=1.0)
    settings = resolve_fit_settings(plain, inputs)
    losses = class_frequencies(settings.training, batches)
    counts = np.bincount(y_semi[y_semi >= 0]) / (y_semi >= 0).sum()
    torch.testing.assert_close(losses.class_shares, torch.tensor(counts).float())
    assert losses.visit_start_weights is None


def test_unequal_frequencies_train_the_visit_loss_toward_them(imbalanced, fitted_pair):
    X, _, y_semi = imbalanced
    uniform, _ = fitted_pair
    # Equal frequencies train the paper's visit loss, bit for bit.
    equal = _fit(X, y_semi, class_prior=[2, 2])
    np.testing.assert_array_equal(equal.transform(X), uniform.transform(X))
    # Two separate classes in 8 dimensions, 9 of 10 samples in the first,
    # fitted with the default augmentation. With 9 in 10 of the walks
    # starting at the first class, the visit loss no longer asks the rare
    # class to take half of the unlabeled samples, so the network itself
    # gives it fewer of them.
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(0, 1, (900, 8)), rng.normal(1.06, 1, (100, 8))])
    y_semi = np.full(1000, -1)
    y_semi[rng.choice(900, 10, replace=False)] = 0
    y_semi[900 + rng.choice(100, 10, replace=False)] = 1
    unlabeled = X[y_semi == -1]
    rare_share = [
        _own_probabilities(
            SemiSupervisedAssociationClassifier(
                class_prior=prior, max_iter=200, device="cpu", random_state=0
            ).fit(X, y_semi),
            unlabeled,
        )[:, 1].mean()
        for prior in ("uniform", [0.9, 0.1])
    ]
    assert rare_share[1] < rare_share[0] - 0.02


def test_auto_trains_as_the_paper_with_unequal_labels(imbalanced, fitted_pair):
    X, _, y_semi = imbalanced
    more = y_semi.copy()
    unlabeled_first = np.flatnonzero((y_semi == -1) & (np.arange(len(X)) < 900))
    more[unlabeled_first[:20]] = 0  # 30 labels of class 0, 10 of class 1
    auto = _fit(X, more)
    uniform = _fit(X, more, class_prior="uniform")
    np.testing.assert_array_equal(auto.transform(X), uniform.transform(X))
    given = _fit(X, more, class_prior=[0.75, 0.25])
    assert not np.array_equal(given.transform(X), uniform.transform(X))


@pytest.mark.parametrize(
    "class_prior, match",
    [
        ([0.2, 0.3, 0.5], "one number per class"),
        ([[0.5, 0.5]], "one number per class"),
        (["0.9", "0.1"], "one number per class"),
        ([True, True], "one number per class"),
        ({0: 0.9, 1: 0.1}, "not a dict or a pandas Series"),
        (np.ma.array([0.9, 0.1], mask=[0, 1]), "masked"),
        ([1.0, 0.0], "positive, finite"),
        ([1.0, np.nan], "positive, finite"),
        ([1e300, 1e-300], "rounds to 0"),
    ],
)
def test_bad_frequencies_are_refused_before_training(
    blobs_semi, fitted_pair, class_prior, match, monkeypatch
):
    def train(*args, **kwargs):
        raise AssertionError("trained with bad frequencies")

    monkeypatch.setattr(skassoc._fit, "train", train)
    X, y = blobs_semi
    two_classes = y <= 1
    X, y = X[two_classes][:, :2], y[two_classes]
    clf = copy.deepcopy(fitted_pair[1])
    before = clf.predict_proba(X)
    with pytest.raises(ValueError, match=match):
        clf.set_params(class_prior=class_prior).fit(X, y)
    # The failed fit left the fitted estimator as it was.
    np.testing.assert_array_equal(clf.predict_proba(X), before)


def test_a_series_is_refused_rather_than_matched_by_position(imbalanced):
    pd = pytest.importorskip("pandas")
    X, _, y_semi = imbalanced
    counts = pd.Series([0] * 9 + [1]).value_counts(normalize=True)
    with pytest.raises(ValueError, match="sort_index"):
        _fit(X, y_semi, class_prior=counts, max_iter=1)


def test_huge_frequencies_are_rescaled_without_overflow():
    from skassoc._prior import check_class_prior

    np.testing.assert_array_equal(check_class_prior([1e308, 1e308], 2), [0.5, 0.5])
    np.testing.assert_array_equal(check_class_prior((3, 1), 2), [0.75, 0.25])


def test_tensors_are_read_even_when_they_require_grad():
    from skassoc._prior import check_class_prior

    given = torch.tensor([3.0, 1.0], requires_grad=True)
    np.testing.assert_array_equal(check_class_prior(given, 2), [0.75, 0.25])


def test_a_class_the_network_never_predicts_keeps_a_small_frequency():
    proba = np.zeros((100, 3))
    proba[:, 0], proba[:, 1] = 0.7, 0.3
    prior = estimate_class_prior(proba)
    assert prior.sum() == pytest.approx(1)
    assert prior[2] == pytest.approx(0.01 / 1.01)
    assert prior[0] / prior[1] == pytest.approx(0.7 / 0.3)


def test_an_unknown_string_is_refused(imbalanced):
    X, _, y_semi = imbalanced
    with pytest.raises(ValueError, match="class_prior"):
        _fit(X, y_semi, class_prior="balanced")


def test_recipes_keep_the_papers_predictions():
    for name in RECIPES:
        assert recipe_params(name)["class_prior"] == "uniform"


def test_at_most_prior_samples_are_predicted_a_batch_at_a_time(
    imbalanced, fitted_pair, monkeypatch
):
    X, _, y_semi = imbalanced
    uniform, _ = fitted_pair
    monkeypatch.setattr(_prior, "PRIOR_SAMPLES", 100)
    capped = _fit(X, y_semi, predict_batch_size=7)
    drawn = prior_samples(np.where(y_semi == -1, UNLABELED, y_semi), fit_seed(0))
    assert len(drawn) == 100
    expected = estimate_class_prior(uniform.predict_proba(X[drawn]))
    np.testing.assert_allclose(capped.class_prior_, expected, rtol=1e-6)


def test_a_warm_start_estimates_the_frequencies_again(imbalanced):
    X, _, y_semi = imbalanced
    clf = _fit(X, y_semi, class_prior=[3, 1], max_iter=5)
    clf.set_params(class_prior="uniform", warm_start=True).fit(X, y_semi)
    np.testing.assert_array_equal(clf.class_prior_, [0.5, 0.5])
    clf.set_params(class_prior="auto").fit(X, y_semi)
    assert clf.class_prior_[0] > 0.5  # the more frequent class


def test_an_onnx_export_weighs_by_the_frequencies(imbalanced, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from skassoc.export import export_onnx

    X, _, y_semi = imbalanced
    clf = _fit(X, y_semi, class_prior=[0.99, 0.01], max_iter=20)
    path = export_onnx(clf, tmp_path / "model.onnx")
    session = onnxruntime.InferenceSession(
        str(path), providers=["CPUExecutionProvider"]
    )
    (proba,) = session.run(None, {"input": X.astype(np.float32)})
    np.testing.assert_allclose(proba, clf.predict_proba(X), rtol=0, atol=1e-4)


def test_a_model_file_keeps_the_frequencies(fitted_pair, imbalanced, tmp_path):
    X, _, _ = imbalanced
    _, auto = fitted_pair
    path = tmp_path / "model.skassoc"
    auto.save(path)
    loaded = SemiSupervisedAssociationClassifier.load(path, device="cpu")
    np.testing.assert_array_equal(loaded.class_prior_, auto.class_prior_)
    np.testing.assert_array_equal(loaded.predict_proba(X), auto.predict_proba(X))


def test_given_frequencies_are_saved_as_a_parameter(imbalanced, tmp_path):
    X, _, y_semi = imbalanced
    clf = _fit(X, y_semi, class_prior=np.array([3.0, 1.0]), max_iter=5)
    path = tmp_path / "model.skassoc"
    clf.save(path)
    loaded = SemiSupervisedAssociationClassifier.load(path, device="cpu")
    assert loaded.class_prior == [3.0, 1.0]
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))


def _rewrite_metadata(path, change):
    with zipfile.ZipFile(path) as archive:
        metadata = json.loads(archive.read(METADATA_MEMBER))
        weights = archive.read(WEIGHTS_MEMBER)
    change(metadata)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(METADATA_MEMBER, json.dumps(metadata))
        archive.writestr(WEIGHTS_MEMBER, weights)


def test_a_version_1_file_predicts_with_equal_frequencies(
    fitted_pair, imbalanced, tmp_path
):
    X, _, _ = imbalanced
    uniform, auto = fitted_pair
    path = tmp_path / "old.skassoc"
    auto.save(path)
    # A file of format 1: weights by torch.save, no class frequencies;
    # load reads it once converted (convert_model_file, no unpickling).
    with zipfile.ZipFile(path) as archive:
        metadata = json.loads(archive.read(METADATA_MEMBER))
    buffer = io.BytesIO()
    torch.save({k: t.clone() for k, t in auto.model_.state_dict().items()}, buffer)
    weights = buffer.getvalue()
    metadata.update(format_version=1, weights_sha256=sha256(weights).hexdigest())
    del metadata["class_prior"], metadata["params"]["class_prior"]
    del metadata["output_config"]
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(METADATA_MEMBER, json.dumps(metadata))
        archive.writestr("weights.pt", weights)
    convert_model_file(path, path)
    loaded = SemiSupervisedAssociationClassifier.load(path, device="cpu")
    assert loaded.class_prior == "uniform"
    np.testing.assert_array_equal(loaded.class_prior_, [0.5, 0.5])
    np.testing.assert_array_equal(loaded.predict_proba(X), uniform.predict_proba(X))


@pytest.mark.parametrize(
    "value",
    [[0.5], [0.5, -0.5], [0.5, "0.5"], [0.5, 1e308, 1e308], [10**400, 1], None, "auto"],
)
def test_a_file_with_bad_frequencies_is_refused(fitted_pair, tmp_path, value):
    _, auto = fitted_pair
    path = tmp_path / "bad.skassoc"
    auto.save(path)

    def tamper(metadata):
        metadata["class_prior"] = value

    _rewrite_metadata(path, tamper)
    with pytest.raises(ValueError, match="not a valid skassoc model file.*class_prior"):
        SemiSupervisedAssociationClassifier.load(path, device="cpu")


def test_a_pickle_from_before_class_prior_predicts_with_equal_frequencies(
    fitted_pair, imbalanced
):
    X, _, _ = imbalanced
    uniform, auto = fitted_pair
    state = auto.__getstate__()
    del state["class_prior"], state["class_prior_"]
    old = SemiSupervisedAssociationClassifier.__new__(
        SemiSupervisedAssociationClassifier
    )
    old.__setstate__(state)
    assert old.get_params()["class_prior"] == "uniform"
    np.testing.assert_array_equal(old.class_prior_, [0.5, 0.5])
    np.testing.assert_array_equal(old.predict_proba(X), uniform.predict_proba(X))


def test_an_interrupted_estimate_keeps_the_trained_model(
    imbalanced, fitted_pair, monkeypatch
):
    X, _, y_semi = imbalanced
    uniform, _ = fitted_pair

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    clf = _make()
    with monkeypatch.context() as patch:
        patch.setattr(_classifier, "run_model", interrupted)
        # Kept, then raised again: a search or a script stops here.
        with pytest.raises(KeyboardInterrupt, match="Interrupted while estimating"):
            clf.fit(X, y_semi)
    np.testing.assert_array_equal(clf.class_prior_, [0.5, 0.5])
    np.testing.assert_array_equal(clf.predict_proba(X), uniform.predict_proba(X))
