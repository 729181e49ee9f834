"""The rules behind the estimator's "auto" parameters (skassoc._defaults)."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from skassoc import _defaults
from skassoc._defaults import (
    auto_labeled_per_class,
    auto_max_iter,
    auto_unlabeled_batch_size,
    cpu_step_seconds,
    network_macs,
)
from skassoc._nn._networks import build_network


@pytest.mark.parametrize(
    "counts, expected",
    [([10, 10, 10], 10), ([50, 200], 10), ([3, 50, 12], 3), ([1, 10], 1), ([7], 7)],
)
def test_labeled_per_class_is_ten_or_the_smallest_class(counts, expected):
    assert auto_labeled_per_class(counts) == expected


@pytest.mark.parametrize("counts", [[], [0, 5]])
def test_labeled_per_class_needs_a_label_in_every_class(counts):
    with pytest.raises(ValueError, match="at least one labeled"):
        auto_labeled_per_class(counts)


@pytest.mark.parametrize("n, expected", [(60_000, 100), (100, 100), (37, 37), (0, 1)])
def test_unlabeled_batch_is_a_hundred_or_the_whole_pool(n, expected):
    assert auto_unlabeled_batch_size(n) == expected


def counted_macs(net, shape):
    """Multiply-adds of the network's convolutions and linear layers, counted."""
    total = []

    def hook(module, inputs, output):
        if isinstance(module, nn.Conv2d):
            k = module.kernel_size[0] * module.kernel_size[1]
            total.append(output.numel() * module.in_channels * k)
        else:
            total.append(module.in_features * module.out_features)

    for module in net.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            module.register_forward_hook(hook)
    with torch.no_grad():
        net.eval()(torch.zeros(1, *shape))
    return sum(total)


@pytest.mark.parametrize(
    "name, shape",
    [
        ("small", (1, 8, 8)),
        ("small", (3, 16, 16)),
        ("small", (1, 13, 27)),
        ("mnist", (1, 28, 28)),
        ("svhn", (3, 32, 32)),
        ("mlp", (64,)),
    ],
)
def test_network_macs_match_the_built_networks(name, shape):
    image_shape = None if name == "mlp" else shape
    net = build_network(name, image_shape, math.prod(shape), 32, (50, 40))
    expected = counted_macs(net, shape)
    assert network_macs(name, image_shape, math.prod(shape), 32, (50, 40)) == expected


def test_cpu_step_cost_grows_with_the_work_and_halves_speed_without_bf16():
    small = network_macs("small", (1, 8, 8), 64)
    mnist = network_macs("mnist", (1, 28, 28), 784)
    fast = cpu_step_seconds("small", (1, 8, 8), small, 200, bf16=True)
    assert fast > _defaults.STEP_SECONDS
    assert cpu_step_seconds("mnist", (1, 28, 28), mnist, 200, bf16=True) > fast
    assert cpu_step_seconds("small", (1, 8, 8), small, 400, bf16=True) > fast
    slow = cpu_step_seconds("small", (1, 8, 8), small, 200, bf16=False)
    assert slow - _defaults.STEP_SECONDS == pytest.approx(
        2 * (fast - _defaults.STEP_SECONDS)
    )
    # The MLP runs in float32 either way.
    mlp = network_macs("mlp", None, 64)
    assert cpu_step_seconds("mlp", None, mlp, 200, True) == cpu_step_seconds(
        "mlp", None, mlp, 200, False
    )


def test_gpu_steps_are_passes_over_the_data_within_bounds():
    epochs = _defaults.EPOCHS
    # A tiny pool still trains MIN_STEPS steps.
    assert auto_max_iter(150, 100, device="cuda") == _defaults.MIN_STEPS
    # A medium one trains EPOCHS passes.
    n = 5 * _defaults.MIN_STEPS
    assert auto_max_iter(n, 100, device="cuda") == math.ceil(epochs * n / 100)
    # A large one stops at MAX_STEPS (the paper's 20,000 on MNIST).
    assert auto_max_iter(60_000, 100, device="cuda") == _defaults.MAX_STEPS


def test_cpu_steps_stay_within_the_budget():
    budget = _defaults.BUDGET_SECONDS
    for n, step in [(500, 0.001), (1_000, 0.05), (10_000, 0.15), (10**6, 1.0)]:
        steps = auto_max_iter(n, 100, step, "cpu")
        assert 1 <= steps <= auto_max_iter(n, 100, device="cuda")
        assert steps * step <= budget + 1e-9
    # A cheap network on a small data set gets the same steps as on a GPU.
    assert auto_max_iter(900, 100, 0.004, "cpu") == auto_max_iter(
        900, 100, device="cuda"
    )
    # The budget wins over MIN_STEPS: a heavy network trains fewer steps.
    heavy = auto_max_iter(900, 100, 1.0, "cpu")
    assert heavy == int(budget / 1.0) < _defaults.MIN_STEPS


def test_auto_max_iter_takes_a_torch_device():
    cpu = torch.device("cpu")
    assert auto_max_iter(5_000, 100, 0.01, cpu) == auto_max_iter(5_000, 100, 0.01)


def test_the_estimator_adapts_labeled_per_class_without_warning(blobs):
    """labeled_per_class="auto": 3 labels a class need no drawing twice."""
    import warnings

    from skassoc import SemiSupervisedAssociationClassifier

    X, y = blobs
    y_semi = np.full_like(y, -1)
    for label in np.unique(y):
        y_semi[np.flatnonzero(y == label)[:3]] = label
    params = dict(hidden_layer_sizes=(16,), max_iter=5, device="cpu", random_state=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*fewer than labeled_per_class")
        SemiSupervisedAssociationClassifier(**params).fit(X, y_semi)
    with pytest.warns(UserWarning, match="fewer than labeled_per_class"):
        SemiSupervisedAssociationClassifier(**params, labeled_per_class=10).fit(
            X, y_semi
        )


def test_the_estimator_trains_the_auto_steps(blobs):
    """max_iter="auto" on a CPU: the steps of the rules, from the data."""
    from skassoc import SemiSupervisedAssociationClassifier
    from skassoc._defaults import (
        auto_max_iter,
        auto_unlabeled_batch_size,
        cpu_step_seconds,
        network_macs,
    )

    X, y = blobs
    y_semi = np.where(np.arange(len(y)) % 5 == 0, y, -1)
    clf = SemiSupervisedAssociationClassifier(
        hidden_layer_sizes=(16,), embedding_dim=8, device="cpu", random_state=0
    ).fit(X, y_semi)
    n_pool = int((y_semi == -1).sum())
    batch = auto_unlabeled_batch_size(n_pool)
    labeled = 10 * 3  # at least 10 labels in every class
    macs = network_macs("mlp", None, X.shape[1], 8, (16,))
    seconds = cpu_step_seconds("mlp", None, macs, labeled + batch, bf16=False)
    assert clf.n_iter_ == auto_max_iter(n_pool, batch, seconds, "cpu")
