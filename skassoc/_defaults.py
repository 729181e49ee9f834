"""How the estimator's ``"auto"`` parameters are chosen from the data.

Pure functions of the data (its size, labels and, for the feature noise,
its spacing), the network and the device: nothing here measures time at
run time, so a fit's parameters (and its
result, for a given ``random_state``) never depend on how busy the machine
is. Measured fit times and accuracies of these rules are in
``benchmarks/results/defaults_*`` (``benchmarks/bench_defaults.py``).
"""

import math

import numpy as np

from ._nn._networks import network_class
from ._utils import varies

__all__ = [
    "auto_feature_noise",
    "auto_labeled_per_class",
    "auto_unlabeled_batch_size",
    "network_macs",
    "cpu_step_seconds",
    "sparse_step_seconds",
    "auto_max_iter",
]

#: consistency_weight="auto" with feature noise (the default for feature
#: vectors, augmentation="auto"): the walker's class probabilities from a
#: noisy copy of every unlabeled sample are trained toward those from the
#: sample, twice as strongly as the walker loss.
AUTO_CONSISTENCY_WEIGHT = 2.0
#: augmentation="auto"'s feature noise, in multiples of the data's spacing
#: (see auto_feature_noise), and at most this many standard deviations:
#: a few distinct rows (two binary features, say) lie so far apart that
#: the noise would drown the features (which the MLP bounds at 3).
NOISE_PER_SPACING = 1.25
MAX_FEATURE_NOISE = 1.5
#: The spacing is measured on at most this many random rows (and values:
#: 16 MiB in float64, so that very wide rows take fewer, but never fewer
#: than SPACING_MIN_ROWS rows), from at most this many of them, so that its
#: cost stays small next to a fit's.
SPACING_ROWS = 5_000
SPACING_VALUES = 2_000_000
SPACING_MIN_ROWS = 50
SPACING_QUERIES = 500
#: The paper's labeled samples per class in a batch (10 on MNIST).
MAX_LABELED_PER_CLASS = 10
#: The paper's unlabeled batch (100 on MNIST).
MAX_UNLABELED_BATCH_SIZE = 100
#: Passes over the unlabeled samples that a fit aims for.
EPOCHS = 100
#: Fewest steps of a fit: a small data set still needs this many updates.
MIN_STEPS = 1_000
#: Most steps of a fit: the paper's 20,000.
MAX_STEPS = 20_000
#: The CPU work estimate's model of one core, in nominal seconds: a step's
#: fixed cost (optimiser, losses, batch draw), and the rate of multiply-adds
#: of dense layers (the MLP's) and of convolutions (a network's ``cpu_rate``
#: says which), which run faster on larger images (per pixel of image width)
#: and at half speed without native bf16 arithmetic.
STEP_SECONDS = 4e-3
MLP_MACS_PER_SECOND = 5e10
CONV_MACS_PER_SECOND_PER_WIDTH = 4.5e9
#: The convolutions' rate stops growing with the image past this width: a
#: 28x28 fit of the MNIST network ran at the rate of 16-pixel images.
CONV_RATE_MAX_WIDTH = 16
#: The rate of 1-D convolutions (the signal network's ``cpu_rate``), with
#: native bf16, set so that the estimate matches the CPU time of fits of
#: signals of 100 to 2,000 values on one thread of the benchmark's CPU.
CONV1D_MACS_PER_SECOND = 5e10
#: A CPU fit's budget of nominal seconds.
BUDGET_SECONDS = 30.0
#: Nominal seconds a step spends on each weight of the sparse network beyond
#: its multiply-adds: every weight's gradient is dense (written whole by the
#: backward pass) and Adam updates each one, so a wide first layer costs
#: its size every step, however few values the batch holds.
WEIGHT_UPDATE_SECONDS = 3e-9


def auto_labeled_per_class(labeled_counts):
    """Labeled samples of each class per batch for ``labeled_per_class="auto"``.

    The paper's 10, or the size of the smallest labeled class when it has
    fewer: every batch then holds the same number of samples of every class
    and no sample twice, so no class is weighted above its labels and no
    class is drawn with replacement.

    Parameters
    ----------
    labeled_counts : array-like of int
        Number of labeled samples of each class (all at least 1).

    Returns
    -------
    labeled_per_class : int
    """
    counts = np.asarray(labeled_counts)
    if counts.size == 0 or counts.min() < 1:
        raise ValueError(
            f"Every class needs at least one labeled sample; got {counts.tolist()}."
        )
    return int(min(MAX_LABELED_PER_CLASS, counts.min()))


def auto_unlabeled_batch_size(n_unlabeled):
    """Unlabeled samples per batch for ``unlabeled_batch_size="auto"``.

    The paper's 100, or all the unlabeled samples when there are fewer
    (a batch never holds a sample twice more often than chance makes it).

    Parameters
    ----------
    n_unlabeled : int
        Number of samples in the unlabeled pool (all samples when every
        sample is labeled).

    Returns
    -------
    unlabeled_batch_size : int
    """
    return int(max(1, min(MAX_UNLABELED_BATCH_SIZE, n_unlabeled)))


def network_macs(
    network_name,
    input_shape,
    n_features,
    embedding_dim=128,
    hidden_layer_sizes=(256, 256),
):
    """Multiply-adds of one sample's forward pass through a built-in network.

    The network's class in the registry (``NETWORKS``) counts them from its
    own layers (its ``forward_macs``): the convolutions' and linear layers'
    multiply-adds, which dominate the time.

    Parameters
    ----------
    network_name : str
        A key of ``NETWORKS``.
    input_shape : tuple of int or None
        ``(channels, height, width)`` the network sees; None for feature rows.
    n_features : int
        Values in one feature row (the MLP's inputs when ``input_shape`` is
        None).
    embedding_dim : int, default=128
    hidden_layer_sizes : tuple of int, default=(256, 256)
        The MLP's hidden layers.

    Returns
    -------
    macs : int
    """
    network = network_class(network_name, input_shape)
    return int(
        network.forward_macs(
            None if input_shape is None else tuple(input_shape),
            n_features,
            embedding_dim,
            tuple(hidden_layer_sizes),
        )
    )


def cpu_step_seconds(network_name, input_shape, sample_macs, step_samples, bf16):
    """Nominal seconds of one training step on one CPU core (a work estimate).

    ``STEP_SECONDS`` plus the forward and backward multiply-adds (3 times
    the forward pass) of ``step_samples`` samples at the rate that the
    network's class names (its ``cpu_rate``): ``MLP_MACS_PER_SECOND`` for
    ``"dense"`` layers (the MLP, which runs in float32 either way),
    ``CONV_MACS_PER_SECOND_PER_WIDTH`` times the image's geometric-mean side
    (at most ``CONV_RATE_MAX_WIDTH``) for ``"conv"`` ones and
    ``CONV1D_MACS_PER_SECOND`` for ``"conv1d"`` ones (signals), the
    convolutions' rates halved without native bf16 arithmetic
    (``bf16=False``).
    """
    cpu_rate = network_class(network_name, input_shape).cpu_rate
    if cpu_rate == "dense":
        rate = MLP_MACS_PER_SECOND
    elif cpu_rate in ("conv", "conv1d"):
        rate = CONV1D_MACS_PER_SECOND
        if cpu_rate == "conv":
            width = min(math.sqrt(math.prod(input_shape[1:])), CONV_RATE_MAX_WIDTH)
            rate = CONV_MACS_PER_SECOND_PER_WIDTH * width
        if not bf16:
            rate /= 2
    else:
        raise ValueError(
            f"Network {network_name!r} has cpu_rate={cpu_rate!r}; "
            "expected 'dense', 'conv' or 'conv1d'."
        )
    return STEP_SECONDS + 3 * sample_macs * step_samples / rate


def sparse_step_seconds(
    n_features, hidden_layer_sizes, embedding_dim, row_lengths, step_samples
):
    """Nominal seconds of one step of the sparse network on sparse rows.

    A sparse batch is packed as wide as its longest row (see
    ``skassoc._sparse``), so the first layer's multiply-adds are those of
    ``step_samples`` rows of the length that the longest of that many random
    rows reaches (the ``1 - 1 / step_samples`` quantile of ``row_lengths``);
    the other layers' are dense. On top of :func:`cpu_step_seconds`'s model
    of the multiply-adds, every weight costs ``WEIGHT_UPDATE_SECONDS``.

    Parameters
    ----------
    n_features : int
    hidden_layer_sizes : tuple of int
    embedding_dim : int
    row_lengths : ndarray of int
        How many values each training row stores.
    step_samples : int
        Rows embedded in a step.
    """
    widths = [*hidden_layer_sizes, embedding_dim]
    dense_macs = sum(a * b for a, b in zip(widths[:-1], widths[1:]))
    width = (
        np.quantile(row_lengths, 1 - 1 / max(step_samples, 2))
        if len(row_lengths)
        else 1
    )
    sample_macs = max(1.0, float(width)) * widths[0] + dense_macs
    n_weights = n_features * widths[0] + dense_macs
    macs_seconds = 3 * sample_macs * step_samples / MLP_MACS_PER_SECOND
    return STEP_SECONDS + macs_seconds + WEIGHT_UPDATE_SECONDS * n_weights


def auto_max_iter(n_unlabeled, unlabeled_batch_size, step_seconds=None, device="cpu"):
    """Training steps for ``max_iter="auto"``.

    Enough steps for ``EPOCHS`` passes over the unlabeled samples, at least
    ``MIN_STEPS`` and at most ``MAX_STEPS``. On a CPU also at most what the
    fit's budget of ``BUDGET_SECONDS`` nominal seconds allows, at
    ``step_seconds`` nominal seconds a step (see :func:`cpu_step_seconds`):
    chosen to keep a CPU fit well under a minute; the budget wins
    over ``MIN_STEPS``, so a heavy network on a CPU trains fewer steps rather
    than for long. A GPU has no budget: small data sets get the same steps
    as on a CPU, large ones up to ``MAX_STEPS``.

    Parameters
    ----------
    n_unlabeled : int
        Samples in the unlabeled pool.
    unlabeled_batch_size : int
        Unlabeled samples per step.
    step_seconds : float, default=None
        Nominal seconds of a step on one CPU core; needed on a CPU.
    device : {"cpu", "cuda"} or torch.device, default="cpu"
        Where the fit runs (anything but a GPU counts as a CPU).

    Returns
    -------
    max_iter : int
    """
    device_type = getattr(device, "type", device)
    epoch_steps = math.ceil(EPOCHS * n_unlabeled / max(1, unlabeled_batch_size))
    steps = min(MAX_STEPS, max(MIN_STEPS, epoch_steps))
    if device_type != "cuda":
        steps = min(steps, int(BUDGET_SECONDS / step_seconds))
    return max(1, steps)


def auto_feature_noise(data, seed):
    """The feature noise of ``augmentation="auto"``, in standard deviations.

    ``NOISE_PER_SPACING`` times the data's spacing, at most
    ``MAX_FEATURE_NOISE``. The spacing is the median distance from a sample
    to its nearest other sample (duplicates left out), with every feature
    standardised, divided by the square root of the number of features that
    vary (the distance per feature). The noise then reaches about as far as
    a sample's neighbours, the vicinity of vicinal risk minimisation
    (Chapelle et al., NIPS 2000), whatever the number of features and
    however densely the samples lie: dense, few features get little noise;
    sparse, many features more.

    Parameters
    ----------
    data : ndarray or numpy.memmap of shape (n_samples, n_features)
        The training rows (a memory map is read only at the sampled rows).
    seed : int
        Seeds the choice of the rows measured: at most ``SPACING_ROWS`` (and
        ``SPACING_VALUES`` values in all, so very wide rows are measured on
        fewer of them, which lie farther apart), of which at most
        ``SPACING_QUERIES`` look for their nearest neighbour.

    Returns
    -------
    feature_noise : float
        0 when all rows are equal (there is no spacing to follow).
    """
    rng = np.random.default_rng(seed)
    n_samples, n_features = data.shape[0], math.prod(data.shape[1:])
    wide_rows = max(SPACING_MIN_ROWS, SPACING_VALUES // n_features)
    n_rows = min(n_samples, SPACING_ROWS, wide_rows)
    rows = np.sort(rng.choice(n_samples, n_rows, replace=False))
    raw = np.asarray(data[rows]).reshape(n_rows, -1)
    mean, std = raw.mean(axis=0, dtype=np.float64), raw.std(axis=0, dtype=np.float64)
    # Constant features add nothing to the distances, so they do not count.
    varying = varies(std, mean)
    if not varying.any():
        return 0.0
    if not varying.all():
        raw = raw[:, varying]
    # Duplicates (common in discrete data) would make the nearest distance 0.
    # They are dropped in the data's own type, before the float64 copy.
    sample = _distinct_rows(raw).astype(np.float64)
    del raw
    if len(sample) < 2:
        return 0.0
    sample -= mean[varying]
    sample /= std[varying]
    queries = sample[
        rng.choice(len(sample), min(len(sample), SPACING_QUERIES), replace=False)
    ]
    squared = np.einsum("ij,ij->i", sample, sample)[None, :] - 2 * queries @ sample.T
    squared += np.einsum("ij,ij->i", queries, queries)[:, None]
    # The query itself, and rows that differ from it by rounding only: the
    # expansion above is exact to about 1e-16 of the rows' squared norms.
    squared[squared <= 1e-9 * varying.sum()] = np.inf
    nearest = squared.min(axis=1)
    if not np.isfinite(nearest).any():
        return 0.0
    spacing = math.sqrt(np.median(nearest[np.isfinite(nearest)]) / varying.sum())
    return min(MAX_FEATURE_NOISE, NOISE_PER_SPACING * spacing)


def _distinct_rows(rows):
    """The distinct rows of the 2-D array ``rows``.

    ``np.unique(axis=0)`` sorts them, and which rows become the queries
    depends on that order when there are more than ``SPACING_QUERIES``. It
    is slow for very wide rows (it compares them value by value), but rows
    that wide are too few to choose queries among (``SPACING_VALUES``): for
    them, a view of each row as one string of bytes finds the same rows, in
    their own order, far faster.
    """
    if len(rows) > SPACING_QUERIES:
        return np.unique(rows, axis=0)
    rows = np.ascontiguousarray(rows)
    as_bytes = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1])))
    _, first = np.unique(as_bytes.ravel(), return_index=True)
    return rows[np.sort(first)]
