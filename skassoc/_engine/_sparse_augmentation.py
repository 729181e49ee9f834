"""The augmentation of sparse rows: dropout of their nonzero values.

Gaussian noise on every feature (the MLP's feature noise) would make a
sparse row dense: 50,000 noisy values where 50 words were. The rows of the
``"sparse_mlp"`` network get *feature dropout* instead: each nonzero value
is set to 0 with probability ``feature_dropout`` and the others are divided
by ``1 - feature_dropout``, so that a row keeps its expected value. For a
document that drops words (word dropout, the usual augmentation of bags of
words); for one-hot categories it hides a category now and then. A zero
stays a zero, so the rows stay sparse, and dense rows given to the same
network get the same treatment.

``augmentation="auto"`` adds none to sparse rows: on the text benchmark
(``docs/benchmarks``) feature dropout, with or without the consistency
loss that comes with an augmentation, did not raise the accuracy of the
fit without it; it is there to try, as ``{"feature_dropout": 0.1}``.
"""

import math
import numbers

import numpy as np
import torch

__all__ = [
    "FEATURE_DROPOUT_KEYS",
    "FeatureDropout",
    "is_dropout_settings",
    "resolve_sparse_augmentation",
]

#: The settings of feature dropout: its probability, and whether the
#: unlabeled batch is augmented too (default False: the labeled batch, and
#: the consistency loss's second copy of the unlabeled batch, only).
FEATURE_DROPOUT_KEYS = ("feature_dropout", "unlabeled")


def is_dropout_settings(settings):
    """Whether the augmentation ``settings`` (a dict) are feature dropout's."""
    return isinstance(settings, dict) and "feature_dropout" in settings


def resolve_sparse_augmentation(augmentation):
    """The ``augmentation`` parameter, for the sparse network, as full settings.

    ``"auto"`` and None are no augmentation (see the module); a dict sets
    ``feature_dropout`` (a probability below 1) and ``unlabeled``.

    Raises
    ------
    ValueError
        For the image augmentation, the feature noise or unknown settings,
        which the sparse network does not take.
    """
    if augmentation is None or augmentation == "auto":
        return None
    if not is_dropout_settings(augmentation) or set(augmentation) - set(
        FEATURE_DROPOUT_KEYS
    ):
        raise ValueError(
            f"augmentation={augmentation!r} does not suit the 'sparse_mlp' "
            "network (sparse X): image warps need images, and feature noise "
            "would make every zero of a sparse row nonzero. It takes "
            "{'feature_dropout': p}, the probability of zeroing each nonzero "
            "value (e.g. 0.1), optionally with 'unlabeled', or 'auto' or None."
        )
    rate, unlabeled = augmentation["feature_dropout"], augmentation.get("unlabeled")
    unlabeled = False if unlabeled is None else unlabeled
    number = isinstance(rate, numbers.Real) and not isinstance(rate, (bool, np.bool_))
    if not (number and math.isfinite(rate) and 0 <= rate < 1):
        raise ValueError(
            "augmentation['feature_dropout'] is the probability of zeroing each "
            f"nonzero value, in [0, 1); got {rate!r}."
        )
    if not isinstance(unlabeled, (bool, np.bool_)):
        raise ValueError(
            "augmentation['unlabeled'] must be True (augment both batches) or "
            f"False (the labeled batch only); got {unlabeled!r}."
        )
    return {"feature_dropout": float(rate), "unlabeled": bool(unlabeled)}


class FeatureDropout(torch.nn.Module):
    """Zero each nonzero value with probability ``rate``, rescale the others.

    Takes dense rows ``(n, n_features)`` or packed sparse rows ``(n, 2, k)``
    (indices, then values: see :mod:`skassoc._sparse`), whose values alone
    are dropped; padding stays 0.

    Parameters
    ----------
    rate : float
        Probability in ``[0, 1)`` that a value is set to 0.
    """

    def __init__(self, rate):
        super().__init__()
        self.rate = float(rate)

    def _dropped(self, values):
        keep = torch.rand_like(values) >= self.rate
        return torch.where(keep, values / (1 - self.rate), torch.zeros_like(values))

    def forward(self, x):
        if self.rate == 0:
            return x
        if x.ndim == 3:
            return torch.stack([x[:, 0], self._dropped(x[:, 1])], dim=1)
        return self._dropped(x)
