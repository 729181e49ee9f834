"""The device-side batch sampler, on CPU."""

import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from skassoc._engine._sampling import AssociationBatchSampler


def make_split(class_sizes, n_pool, seed=0):
    """Disjoint class index sets and an unlabeled pool, from shuffled indices."""
    rng = np.random.default_rng(seed)
    # Spread the indices out so that positions and values differ.
    order = 3 * rng.permutation(sum(class_sizes) + n_pool) + 1000
    classes, start = [], 0
    for size in class_sizes:
        classes.append(torch.as_tensor(order[start : start + size]))
        start += size
    pool = torch.as_tensor(order[start:])
    return classes, pool


def make_sampler(class_sizes, k, n_pool=30, batch=16, seed=0):
    classes, pool = make_split(class_sizes, n_pool, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sampler = AssociationBatchSampler(classes, pool, k, batch, "cpu")
    return sampler, classes, pool


def chi_square_p(counts):
    counts = np.asarray(counts, dtype=float)
    return stats.chisquare(counts).pvalue


def test_labeled_batch_holds_k_per_class_grouped_by_class():
    torch.manual_seed(0)
    sizes, k = [5, 3, 9, 4], 3
    sampler, classes, _ = make_sampler(sizes, k)
    expected_labels = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    assert torch.equal(sampler.labels, expected_labels)
    for _ in range(100):
        labeled, _ = sampler.sample()
        assert labeled.shape == (len(sizes) * k,)
        assert labeled.dtype == torch.long
        for position, index in enumerate(labeled.tolist()):
            label = int(sampler.labels[position])
            assert index in set(classes[label].tolist())
        for c in range(len(sizes)):
            block = labeled[c * k : (c + 1) * k]
            # No duplicates: every class has at least k samples.
            assert len(set(block.tolist())) == k


def test_class_with_exactly_k_samples_is_always_complete():
    torch.manual_seed(1)
    sizes, k = [10, 10, 10], 10  # the paper's MNIST setting, in miniature
    sampler, classes, _ = make_sampler(sizes, k)
    for _ in range(20):
        labeled, _ = sampler.sample()
        for c, idx in enumerate(classes):
            assert sorted(labeled[c * k : (c + 1) * k].tolist()) == sorted(idx.tolist())

    sampler, classes, _ = make_sampler([7, 2, 4], 2)
    for _ in range(20):
        labeled, _ = sampler.sample()
        assert sorted(labeled[2:4].tolist()) == sorted(classes[1].tolist())


def test_small_classes_warn_once_and_draw_with_replacement():
    classes, pool = make_split([2, 6, 1], 10)
    with pytest.warns(UserWarning, match="labeled_per_class=3") as record:
        sampler = AssociationBatchSampler(classes, pool, 3, 8, "cpu")
    assert len(record) == 1
    assert "2 class(es)" in str(record[0].message)
    torch.manual_seed(2)
    seen_small = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sampling itself never warns
        for _ in range(200):
            labeled, _ = sampler.sample()
            small = labeled[0:3].tolist()
            assert set(small) <= set(classes[0].tolist())
            # Three draws from two samples must repeat one.
            assert len(set(small)) < 3
            seen_small.update(small)
            assert labeled[6:9].tolist() == [int(classes[2][0])] * 3
            # The large class is still drawn without replacement.
            assert len(set(labeled[3:6].tolist())) == 3
    assert seen_small == set(classes[0].tolist())


def test_no_warning_when_every_class_is_large_enough():
    classes, pool = make_split([3, 4, 3], 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AssociationBatchSampler(classes, pool, 3, 4, "cpu")


@pytest.mark.parametrize("n_pool, batch", [(30, 16), (5, 40), (1, 3)])
def test_unlabeled_batch_comes_from_the_pool(n_pool, batch):
    torch.manual_seed(3)
    sampler, classes, pool = make_sampler([4, 4], 2, n_pool=n_pool, batch=batch)
    pool_set = set(pool.tolist())
    for _ in range(50):
        labeled, unlabeled = sampler.sample()
        assert unlabeled.shape == (batch,)
        assert unlabeled.dtype == torch.long
        assert set(unlabeled.tolist()) <= pool_set
    # Labeled and unlabeled batches come back on the sampler's device.
    assert sampler.device == torch.device("cpu")
    assert labeled.device == unlabeled.device == torch.device("cpu")


def test_pool_may_overlap_the_labeled_data():
    # The "all labels" setting passes every index as the unlabeled pool.
    classes = [torch.tensor([0, 2, 4]), torch.tensor([1, 3, 5])]
    sampler = AssociationBatchSampler(classes, torch.arange(6), 2, 12, "cpu")
    torch.manual_seed(4)
    seen = set()
    for _ in range(30):
        _, unlabeled = sampler.sample()
        seen.update(unlabeled.tolist())
    assert seen == set(range(6))


def test_draws_cover_everything_uniformly():
    torch.manual_seed(5)
    sizes, k, n_pool, batch, n_draws = [8, 3, 5], 3, 20, 50, 2000
    sampler, classes, pool = make_sampler(sizes, k, n_pool=n_pool, batch=batch)
    labeled_counts = {i: 0 for idx in classes for i in idx.tolist()}
    pool_counts = {i: 0 for i in pool.tolist()}
    for _ in range(n_draws):
        labeled, unlabeled = sampler.sample()
        for i in labeled.tolist():
            labeled_counts[i] += 1
        for i in unlabeled.tolist():
            pool_counts[i] += 1

    assert min(pool_counts.values()) > 0
    assert min(labeled_counts.values()) > 0
    assert sum(pool_counts.values()) == n_draws * batch
    # Loose goodness-of-fit checks: a biased sampler (e.g. always the first k
    # of a class, or a skewed pool) fails them by a wide margin.
    assert chi_square_p(list(pool_counts.values())) > 1e-4
    for idx in classes:
        counts = [labeled_counts[i] for i in idx.tolist()]
        assert sum(counts) == n_draws * k
        expected = n_draws * k / len(idx)
        assert all(abs(c - expected) < 0.1 * expected for c in counts)
        if len(idx) > k:
            assert chi_square_p(counts) > 1e-4


def test_small_class_replacement_draws_are_uniform():
    torch.manual_seed(6)
    sampler, classes, _ = make_sampler([3, 4], 5)
    counts = dict.fromkeys(classes[0].tolist(), 0)
    for _ in range(1000):
        labeled, _ = sampler.sample()
        for i in labeled[:5].tolist():
            counts[i] += 1
    assert chi_square_p(list(counts.values())) > 1e-4


def test_seeding_makes_draws_reproducible():
    sampler, _, _ = make_sampler([6, 2, 9], 3)

    def draws(seed):
        torch.manual_seed(seed)
        return [torch.cat(sampler.sample()) for _ in range(5)]

    first, again, other = draws(123), draws(123), draws(124)
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert not all(torch.equal(x, y) for x, y in zip(first, other))
    # Successive draws differ.
    assert not torch.equal(first[0], first[1])


def make_epoch_sampler(n_pool, batch, seed=0):
    classes, pool = make_split([4, 4], n_pool, seed)
    sampler = AssociationBatchSampler(
        classes, pool, 2, batch, "cpu", unlabeled_sampling="epochs"
    )
    return sampler, pool


def deal(sampler, n_batches):
    """The unlabeled batches of ``n_batches`` steps, one after the other."""
    batches = []
    for _ in range(n_batches):
        sampler.advance()
        labeled, unlabeled = sampler.sample()
        assert labeled.shape == (4,)
        batches.append(unlabeled.clone())
    return torch.cat(batches)


@pytest.mark.parametrize(
    "n_pool, batch",
    # Passes of whole batches; batches that straddle two passes; a pool
    # smaller than the batch; a pool of one.
    [(30, 10), (30, 7), (5, 12), (1, 3)],
)
def test_epochs_draw_every_unlabeled_sample_once_per_pass(n_pool, batch):
    torch.manual_seed(7)
    sampler, pool = make_epoch_sampler(n_pool, batch)
    n_passes = 12
    n_batches = -(-n_passes * n_pool // batch)
    stream = deal(sampler, n_batches)
    assert stream.shape == (n_batches * batch,)
    assert stream.dtype == torch.long
    passes = stream[: n_passes * n_pool].reshape(n_passes, n_pool)
    for one_pass in passes:
        assert sorted(one_pass.tolist()) == sorted(pool.tolist())
    if n_pool > 1:
        # Every pass is shuffled anew.
        assert len({tuple(one_pass.tolist()) for one_pass in passes}) > 1


def test_replacement_draws_repeat_within_a_pass():
    # The contrast to the test above: independent draws repeat samples long
    # before every sample has come once.
    torch.manual_seed(8)
    sampler, _, pool = make_sampler([4, 4], 2, n_pool=30, batch=10)
    sampler.advance()  # a no-op when drawing with replacement
    first_pass = torch.cat([sampler.sample()[1] for _ in range(3)])
    assert len(set(first_pass.tolist())) < len(pool)


def test_epoch_shuffles_are_uniform():
    torch.manual_seed(9)
    n_pool, n_passes = 5, 2000
    sampler, pool = make_epoch_sampler(n_pool, batch=n_pool)
    passes = deal(sampler, n_passes).reshape(n_passes, n_pool)
    # Where each sample lands in its pass: every position equally often.
    for index in pool.tolist():
        positions = (passes == index).nonzero()[:, 1]
        counts = torch.bincount(positions, minlength=n_pool)
        assert chi_square_p(counts.tolist()) > 1e-4


def test_epoch_shuffles_follow_the_seed():
    def stream(seed):
        torch.manual_seed(seed)
        fresh, _ = make_epoch_sampler(30, 7)
        return deal(fresh, 20)

    assert torch.equal(stream(11), stream(11))
    assert not torch.equal(stream(11), stream(12))


def test_unknown_unlabeled_sampling_is_refused():
    classes, pool = make_split([3, 3], 6)
    with pytest.raises(ValueError, match="unlabeled_sampling must be one of"):
        AssociationBatchSampler(classes, pool, 2, 4, "cpu", "shuffle")


def test_epoch_shuffles_ignore_later_reseeding():
    # Fits in other threads reseed torch's global generators; a sampler's
    # shuffles depend only on the seed in force when it was built.
    torch.manual_seed(13)
    undisturbed = deal(make_epoch_sampler(30, 7)[0], 20)
    torch.manual_seed(13)
    sampler, _ = make_epoch_sampler(30, 7)
    batches = []
    for _ in range(20):
        torch.manual_seed(999)
        sampler.advance()
        batches.append(sampler.sample()[1].clone())
    assert torch.equal(torch.cat(batches), undisturbed)
