"""The association losses against a float64 NumPy transcription of the paper."""

import numpy as np
import pytest
import torch

from skassoc._engine._losses import (
    association_matrices,
    balance_loss,
    classification_loss,
    l2_penalty,
    visit_loss,
    walker_loss,
)

# ---------------------------------------------------------------------------
# Reference: the paper's formulas, written out in float64 NumPy with
# explicit loops where that keeps them obviously right.
# ---------------------------------------------------------------------------


def np_row_softmax(m):
    out = np.empty_like(m)
    for i, row in enumerate(m):
        e = np.exp(row - row.max())
        out[i] = e / e.sum()
    return out


def np_association(a, b):
    m = a @ b.T
    p_ab = np_row_softmax(m)
    p_ba = np_row_softmax(m.T)
    return p_ab, p_ba, p_ab @ p_ba


def np_walker(p_aba, labels):
    n = len(labels)
    target = np.zeros((n, n))
    for i in range(n):
        n_same = sum(1 for label in labels if label == labels[i])
        for j in range(n):
            if labels[j] == labels[i]:
                target[i, j] = 1.0 / n_same
    rows = [-np.sum(target[i] * np.log(1e-8 + p_aba[i])) for i in range(n)]
    return np.mean(rows)


def np_visit(p_ab):
    n_unlabeled = p_ab.shape[1]
    p_visit = p_ab.mean(axis=0)
    return -np.sum(np.log(1e-8 + p_visit)) / n_unlabeled


def np_classification(logits, labels):
    losses = []
    for row, label in zip(logits, labels):
        shift = row.max()
        log_z = shift + np.log(np.sum(np.exp(row - shift)))
        losses.append(log_z - row[label])
    return np.mean(losses)


def np_l2(weights, scales):
    return sum(scale * np.sum(w**2) / 2 for w, scale in zip(weights, scales))


# labels of the labeled batch, |B|, embedding dimension
CASES = [
    ([0, 0, 1, 1, 2, 2], 6, 4),  # balanced, |A| == |B|
    ([0, 0, 0, 1, 2, 2, 2, 2, 2], 5, 3),  # unequal class counts, |B| < |A|
    ([3, 1, 3, 0, 1, 1, 3, 0], 13, 7),  # unsorted labels with a gap, |B| > |A|
    ([0, 1], 1, 2),  # a single unlabeled sample
    ([2, 2, 2, 2], 3, 16),  # a single class
    ([0, 1, 2, 3, 4], 9, 5),  # one sample per class
]


def make_inputs(labels, n_unlabeled, dim, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    a = scale * rng.standard_normal((len(labels), dim))
    b = scale * rng.standard_normal((n_unlabeled, dim))
    return a, b


@pytest.mark.parametrize("labels, n_unlabeled, dim", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_losses_match_numpy_reference(labels, n_unlabeled, dim, dtype):
    a, b = make_inputs(labels, n_unlabeled, dim, seed=len(labels) * 31 + dim)
    ref_ab, ref_ba, ref_aba = np_association(a, b)

    p_ab, p_ba, p_aba = association_matrices(
        torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype)
    )
    assert p_ab.shape == (len(labels), n_unlabeled)
    assert p_ba.shape == (n_unlabeled, len(labels))
    assert p_aba.shape == (len(labels), len(labels))
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-10}
    np.testing.assert_allclose(p_ab.double().numpy(), ref_ab, **tol)
    np.testing.assert_allclose(p_ba.double().numpy(), ref_ba, **tol)
    np.testing.assert_allclose(p_aba.double().numpy(), ref_aba, **tol)

    label_tensor = torch.tensor(labels)
    walker = walker_loss(p_aba, label_tensor)
    visit = visit_loss(p_ab)
    assert walker.ndim == 0 and visit.ndim == 0
    np.testing.assert_allclose(float(walker), np_walker(ref_aba, labels), **tol)
    np.testing.assert_allclose(float(visit), np_visit(ref_ab), **tol)


@pytest.mark.parametrize("labels, n_unlabeled, dim", CASES)
def test_loss_functions_match_reference_on_reference_probabilities(
    labels, n_unlabeled, dim
):
    # Isolate walker_loss / visit_loss from association_matrices.
    a, b = make_inputs(labels, n_unlabeled, dim, seed=7 + dim)
    ref_ab, _, ref_aba = np_association(a, b)
    walker = walker_loss(torch.tensor(ref_aba), torch.tensor(labels))
    visit = visit_loss(torch.tensor(ref_ab))
    np.testing.assert_allclose(float(walker), np_walker(ref_aba, labels), rtol=1e-12)
    np.testing.assert_allclose(float(visit), np_visit(ref_ab), rtol=1e-12)


def test_walker_loss_at_its_target_is_the_target_entropy():
    # When P_aba equals the target T, the cross-entropy is the entropy of T:
    # mean over rows of log(#class(i)); the diagonal is part of the target.
    labels = np.array([0, 0, 0, 1, 2, 2])
    counts = np.array([np.sum(labels == label) for label in labels])
    target = (labels[:, None] == labels[None, :]) / counts[:, None]
    loss = walker_loss(torch.tensor(target), torch.tensor(labels))
    expected = np.mean(np.log(counts))
    np.testing.assert_allclose(float(loss), expected, atol=1e-6)


def test_visit_loss_of_uniform_visit_is_log_n_unlabeled():
    n_labeled, n_unlabeled = 4, 7
    p_ab = torch.full((n_labeled, n_unlabeled), 1.0 / n_unlabeled, dtype=torch.float64)
    np.testing.assert_allclose(float(visit_loss(p_ab)), np.log(n_unlabeled), rtol=1e-6)
    # Visiting a single unlabeled sample is much worse than the uniform visit.
    concentrated = torch.zeros(n_labeled, n_unlabeled, dtype=torch.float64)
    concentrated[:, 0] = 1.0
    assert float(visit_loss(concentrated)) > 2 * np.log(n_unlabeled)


@pytest.mark.parametrize("n, n_classes", [(1, 2), (6, 3), (17, 10)])
def test_classification_loss_matches_reference(n, n_classes):
    rng = np.random.default_rng(n)
    logits = 3 * rng.standard_normal((n, n_classes))
    labels = rng.integers(0, n_classes, n)
    loss = classification_loss(torch.tensor(logits), torch.tensor(labels))
    assert loss.ndim == 0
    np.testing.assert_allclose(float(loss), np_classification(logits, labels), 1e-5)


def test_l2_penalty_matches_reference():
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (8, 2, 3, 3), (5, 1), (2, 2)]
    weights = [rng.standard_normal(s) for s in shapes]
    scales = [1e-3, 1e-4, 0.0, 5e-3]
    penalty = l2_penalty([torch.tensor(w) for w in weights], scales)
    assert penalty.ndim == 0
    np.testing.assert_allclose(float(penalty), np_l2(weights, scales), rtol=1e-6)


def test_l2_penalty_of_no_weights_is_zero():
    assert float(l2_penalty([], [])) == 0.0
    assert float(l2_penalty([torch.ones(3, 3)], [0.0])) == 0.0


def test_l2_penalty_needs_one_scale_per_weight():
    with pytest.raises(ValueError):
        l2_penalty([torch.ones(2, 2), torch.ones(2, 2)], [1e-3])


def test_l2_penalty_gradient_is_scale_times_weight():
    weight = torch.randn(
        4, 3, requires_grad=True, generator=torch.Generator().manual_seed(0)
    )
    l2_penalty([weight], [0.25]).backward()
    torch.testing.assert_close(weight.grad, 0.25 * weight.detach())


@pytest.mark.parametrize(
    "labels, n_unlabeled, dim",
    [([0, 0, 1, 1, 1], 4, 3), ([0, 1, 1, 2], 6, 2)],
)
def test_gradcheck_walker_plus_visit(labels, n_unlabeled, dim):
    a, b = make_inputs(labels, n_unlabeled, dim, seed=3)
    a = torch.tensor(a, requires_grad=True)
    b = torch.tensor(b, requires_grad=True)
    label_tensor = torch.tensor(labels)

    def total(a, b):
        p_ab, _, p_aba = association_matrices(a, b)
        return walker_loss(p_aba, label_tensor) + visit_loss(p_ab)

    assert torch.autograd.gradcheck(total, (a, b), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("scale", [1e3, 1e4])
def test_huge_embeddings_give_finite_losses_and_gradients(scale):
    labels = [0, 0, 1, 1, 2, 2, 2]
    a, b = make_inputs(labels, 9, 8, seed=11, scale=scale)
    a = torch.tensor(a, dtype=torch.float32, requires_grad=True)
    b = torch.tensor(b, dtype=torch.float32, requires_grad=True)
    p_ab, p_ba, p_aba = association_matrices(a, b)
    for p in (p_ab, p_ba, p_aba):
        assert torch.isfinite(p).all()
    walker = walker_loss(p_aba, torch.tensor(labels))
    visit = visit_loss(p_ab)
    assert torch.isfinite(walker) and torch.isfinite(visit)
    (walker + visit).backward()
    assert torch.isfinite(a.grad).all()
    assert torch.isfinite(b.grad).all()
    # The probabilities stay normalised even when the softmaxes saturate.
    torch.testing.assert_close(p_ab.sum(1), torch.ones(len(labels)))
    torch.testing.assert_close(p_ba.sum(1), torch.ones(9))


@pytest.mark.parametrize("labels, n_unlabeled, dim", CASES)
def test_transition_rows_sum_to_one(labels, n_unlabeled, dim):
    a, b = make_inputs(labels, n_unlabeled, dim, seed=5, scale=4.0)
    p_ab, p_ba, p_aba = association_matrices(torch.tensor(a), torch.tensor(b))
    for p in (p_ab, p_ba, p_aba):
        assert (p >= 0).all()
        torch.testing.assert_close(p.sum(1), torch.ones(p.shape[0], dtype=p.dtype))


def test_bf16_inputs_give_float32_outputs():
    labels = torch.tensor([0, 0, 1, 1])
    a, b = make_inputs([0, 0, 1, 1], 5, 6, seed=2)
    a16 = torch.tensor(a).bfloat16()
    b16 = torch.tensor(b).bfloat16()
    p_ab, p_ba, p_aba = association_matrices(a16, b16)
    assert p_ab.dtype == p_ba.dtype == p_aba.dtype == torch.float32
    assert walker_loss(p_aba, labels).dtype == torch.float32
    assert visit_loss(p_ab).dtype == torch.float32
    logits = torch.tensor(a[:, :3]).bfloat16()
    assert classification_loss(logits, labels).dtype == torch.float32
    assert l2_penalty([a16], [1e-3]).dtype == torch.float32
    # Computed from the bf16 values in float64 and rounded to float32, not
    # rounded to bf16 again.
    ref_ab, ref_ba, ref_aba = np_association(a16.double().numpy(), b16.double().numpy())
    np.testing.assert_allclose(p_aba.double().numpy(), ref_aba, rtol=1e-5, atol=1e-6)


def test_float32_products_are_exact_up_to_their_final_rounding():
    # Long embeddings: a float32 matrix product accumulates rounding errors
    # of several units in the last place (TF32 on a GPU far more); the
    # float64 product rounded once is off by half a unit at most.
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(50, 2048, generator=generator) * 0.3
    b = torch.randn(60, 2048, generator=generator) * 0.3
    match = (a.double() @ b.double().T).float()
    assert ((a @ b.T) != match).float().mean() > 0.5  # the test can tell
    expected_ab = torch.softmax(match, dim=1)
    expected_ba = torch.softmax(match.T, dim=1)
    expected_aba = (expected_ab.double() @ expected_ba.double()).float()
    p_ab, p_ba, p_aba = association_matrices(a, b)
    torch.testing.assert_close(p_ab, expected_ab, rtol=2e-7, atol=1e-12)
    torch.testing.assert_close(p_ba, expected_ba, rtol=2e-7, atol=1e-12)
    torch.testing.assert_close(p_aba, expected_aba, rtol=2e-7, atol=1e-12)


def test_walker_loss_prefers_classes_clustered_at_distinct_unlabeled_points():
    # Three unlabeled "prototypes"; labeled samples sit next to them.
    rng = np.random.default_rng(0)
    n_classes, per_class, dim = 3, 4, 3
    centres = 3.0 * np.eye(dim)
    b = np.repeat(centres, 2, axis=0) + 0.1 * rng.standard_normal((6, dim))
    labels = np.repeat(np.arange(n_classes), per_class)
    noise = 0.1 * rng.standard_normal((len(labels), dim))
    clustered = centres[labels] + noise
    # Same points, but every class spread over all prototypes.
    mixed = centres[np.arange(len(labels)) % n_classes] + noise

    def loss(a):
        _, _, p_aba = association_matrices(torch.tensor(a), torch.tensor(b))
        return float(walker_loss(p_aba, torch.tensor(labels)))

    assert loss(clustered) < loss(mixed) - 0.5
    # The cross-entropy is bounded below by the target's entropy, log(4) here,
    # and reaches it for tight, noiseless clusters.
    assert loss(clustered) > np.log(per_class) - 1e-6
    assert loss(3 * centres[labels]) == pytest.approx(np.log(per_class), abs=1e-3)


def test_visit_loss_prefers_visiting_every_unlabeled_sample():
    rng = np.random.default_rng(1)
    b = 3.0 * np.eye(4) + 0.1 * rng.standard_normal((4, 4))
    spread = 3.0 * np.eye(4)[[0, 1, 2, 3, 0, 1, 2, 3]]
    collapsed = 3.0 * np.eye(4)[[0] * 8]

    def loss(a):
        p_ab, _, _ = association_matrices(torch.tensor(a), torch.tensor(b))
        return float(visit_loss(p_ab))

    assert loss(spread) < loss(collapsed) - 0.5


def test_balance_loss_is_zero_at_the_shares_and_grows_with_a_missing_class():
    shares = torch.tensor([0.25, 0.25, 0.5])
    at_shares = torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    assert float(balance_loss(at_shares, shares)) == pytest.approx(0.0, abs=1e-7)
    # Half of class 1's mass handed to class 2, then all of it.
    half = torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.25, 0.75]])
    none = torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.0, 1.0]])
    assert 0 < float(balance_loss(half, shares)) < float(balance_loss(none, shares))


def test_balance_loss_with_a_running_mass_follows_it_not_the_batch():
    shares = torch.tensor([0.5, 0.5])
    mass = torch.tensor([0.5, 0.5])
    # A batch that lands on class 0 only moves the estimate by 1 % of the way.
    batch = torch.tensor([[1.0, 0.0], [1.0, 0.0]], requires_grad=True)
    loss = balance_loss(batch, shares, mass)
    torch.testing.assert_close(mass, torch.tensor([0.505, 0.495]))
    # Its value is the divergence at the estimate, far below the batch's own.
    at_mass = float(balance_loss(mass[None], shares))
    assert float(loss.detach()) == pytest.approx(at_mass, rel=1e-3)
    assert float(loss.detach()) < 0.01 < float(balance_loss(batch.detach(), shares))
    # Its gradient is the divergence's at the estimate, through the batch
    # mean: -shares / mass / n_samples for every sample.
    loss.backward()
    expected = (-shares / mass / 2).expand(2, 2)
    torch.testing.assert_close(batch.grad, expected)


def test_balance_loss_gradient_stays_finite_when_a_class_has_no_mass():
    shares = torch.tensor([0.5, 0.5])
    mass = torch.tensor([1.0, 0.0])
    batch = torch.tensor([[1.0, 0.0], [1.0, 0.0]], requires_grad=True)
    balance_loss(batch, shares, mass).backward()
    assert torch.isfinite(batch.grad).all()
