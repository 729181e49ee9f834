"""The consistency loss: an unlabeled image and its warp, one walk's classes."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.utils._param_validation import InvalidParameterError

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._engine._augmentation import ImageAugmentation
from skassoc._engine._losses import (
    LOG_EPSILON,
    association_matrices,
    consistency_loss,
    walker_class_probabilities,
)

# A mild warp without blur: the paper's is too strong for 8x8 digits in 150
# steps (its 7x7 blur is most of the image).
WARP = {"affine_std": 0.05, "translate_std": 0.5, "blur_probability": 0.0}
LABELED_WARP = {**WARP, "unlabeled": False}


def _fit(images, **params):
    X, y = images
    defaults = dict(labeled_per_class=5, max_iter=150, device="cpu", random_state=0)
    return SemiSupervisedAssociationClassifier(**{**defaults, **params}).fit(X, y)


def test_walker_class_probabilities_sum_each_class():
    rng = np.random.default_rng(0)
    p_ba = rng.dirichlet(np.ones(7), size=5)
    labels = np.array([2, 0, 2, 1, 0, 2, 1])
    got = walker_class_probabilities(
        torch.from_numpy(p_ba), torch.from_numpy(labels), 4
    ).numpy()
    expected = np.zeros((5, 4))
    for j in range(5):
        for i, label in enumerate(labels):
            expected[j, label] += p_ba[j, i]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    # Rows stay distributions; a class without labeled samples gets nothing.
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-12)
    assert (got[:, 3] == 0).all()


def test_walker_class_probabilities_are_float64_sums_in_the_input_dtype():
    # Summed over 500 labeled samples, float32 arithmetic would round the
    # sums differently from float64 in the last bits of some of them.
    rng = np.random.default_rng(2)
    p_ba = torch.tensor(rng.dirichlet(np.ones(500), size=200), dtype=torch.float32)
    labels = torch.as_tensor(rng.integers(0, 10, size=500))
    got = walker_class_probabilities(p_ba, labels, 10)
    assert got.dtype == torch.float32
    expected = walker_class_probabilities(p_ba.double(), labels, 10).float()
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_consistency_loss_is_the_cross_entropy_against_a_fixed_target():
    rng = np.random.default_rng(1)
    target = torch.tensor(rng.dirichlet(np.ones(4), size=6), requires_grad=True)
    prediction = torch.tensor(rng.dirichlet(np.ones(4), size=6), requires_grad=True)
    loss = consistency_loss(target, prediction)
    t, p = target.detach().numpy(), prediction.detach().numpy()
    expected = -np.mean(np.sum(t * np.log(LOG_EPSILON + p), axis=1))
    np.testing.assert_allclose(loss.item(), expected, rtol=1e-12)
    loss.backward()
    # Only the second view learns: the target is held fixed.
    assert target.grad is None
    assert prediction.grad.abs().sum() > 0
    # Agreeing with the target costs its entropy, less than disagreeing.
    entropy = -np.mean(np.sum(t * np.log(LOG_EPSILON + t), axis=1))
    np.testing.assert_allclose(
        consistency_loss(target, target.detach()).item(), entropy, rtol=1e-12
    )
    assert consistency_loss(target, prediction).item() > entropy


def _view_disagreement(clf, images, seed):
    """Mean cross-entropy between the walker's classes of two warps of X."""
    X, y = images
    model = clf.model_
    images = torch.as_tensor(X[y == -1], dtype=torch.float32)[:, None]
    labeled = torch.as_tensor(X[y != -1], dtype=torch.float32)[:, None]
    labels = torch.as_tensor(np.searchsorted(clf.classes_, y[y != -1]))
    warp = ImageAugmentation(**WARP)
    torch.manual_seed(seed)
    with torch.no_grad():
        a = model.embed(labeled)
        first, second = (model.embed(warp(images)) for _ in range(2))
        n_classes = len(clf.classes_)
        target = walker_class_probabilities(
            association_matrices(a, first)[1], labels, n_classes
        )
        prediction = walker_class_probabilities(
            association_matrices(a, second)[1], labels, n_classes
        )
        return float(consistency_loss(target, prediction))


def test_consistency_loss_makes_warps_of_an_image_walk_alike(
    bright_digit_images, torch_single_thread
):
    # Trained with the loss, two warps of an unlabeled digit lead the walker
    # to the labeled classes more alike than without it. The control has a
    # negligible weight, so that both fits draw the same batches and warps.
    # This test measured 0.50-0.67 against 0.64-0.85 on its three seeds.
    images = bright_digit_images
    plain = _fit(images, augmentation=LABELED_WARP, consistency_weight=1e-9)
    consistent = _fit(images, augmentation=LABELED_WARP, consistency_weight=3.0)
    for seed in range(3):
        assert _view_disagreement(consistent, images, seed) < _view_disagreement(
            plain, images, seed
        )
    X_all, y_all = load_digits(return_X_y=True)
    X_all = (X_all * 15).astype(np.uint8).reshape(-1, 8, 8)
    assert consistent.score(X_all, y_all) > 0.8


def test_history_records_the_loss_only_when_it_is_on(
    bright_digit_images, torch_single_thread
):
    plain = _fit(bright_digit_images, augmentation=LABELED_WARP, max_iter=40)
    assert "consistency" not in plain.history_
    clf = _fit(
        bright_digit_images,
        augmentation=LABELED_WARP,
        consistency_weight=1.0,
        max_iter=40,
    )
    history = clf.history_
    assert len(history["consistency"]) == len(history["step"])
    assert np.isfinite(history["consistency"]).all()
    # Before the walk has learnt anything its classes are about uniform:
    # about log(10) for 10 classes. Then the loss falls.
    assert abs(history["consistency"][0] - np.log(10)) < 0.1
    assert history["consistency"][-1] < history["consistency"][0] - 0.3


def test_consistency_waits_for_the_association_delay(
    bright_digit_images, torch_single_thread
):
    # While the walker and visit losses are off, so is the consistency loss:
    # the total is the classification loss alone, though all are recorded.
    clf = _fit(
        bright_digit_images,
        augmentation=LABELED_WARP,
        consistency_weight=5.0,
        association_delay=100,
        max_iter=30,
    )
    history = clf.history_
    np.testing.assert_allclose(history["total"], history["logit"], rtol=1e-6)
    assert min(history["consistency"]) > 0


def test_consistency_needs_augmentation_and_leaves_a_fitted_model_alone(
    bright_digit_images,
):
    X, y = bright_digit_images
    clf = SemiSupervisedAssociationClassifier(
        labeled_per_class=5, max_iter=5, device="cpu", random_state=0
    ).fit(X, y)
    before = clf.predict_proba(X)
    clf.set_params(consistency_weight=1.0)
    with pytest.raises(ValueError, match="consistency_weight=1.0 .* augmentation"):
        clf.fit(X, y)
    np.testing.assert_array_equal(clf.predict_proba(X), before)
    assert "consistency" not in clf.history_
    with pytest.raises(InvalidParameterError, match="consistency_weight"):
        clf.set_params(consistency_weight=-1.0, augmentation="paper").fit(X, y)
