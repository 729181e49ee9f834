"""Data set loaders and helpers for semi-supervised experiments.

The loaders read the data sets used in "Learning by Association" (Haeusser
et al., 2017) from local files: :func:`load_mnist` (which can also download
its files), :func:`load_svhn` and :func:`load_stl10` (which memory-maps the
100,000 unlabeled STL-10 images instead of reading them into memory).
:func:`make_semi_supervised_labels` hides all but a few labels per class.
For domain-adaptation experiments, :func:`make_synthetic_digits` generates
printed digits like "Synthetic Digits", and :func:`make_mnist_m_like` blends
grey digits with colour textures as MNIST-M does, and :func:`format_images`
brings two image sets to one size and colour format.
:func:`make_synthetic_signals` generates labelled signals (a
Cylinder-Bell-Funnel problem of up to six shapes and any number of
channels).
"""

from ._format import format_images
from ._generators import make_mnist_m_like, make_synthetic_digits
from ._labels import make_semi_supervised_labels
from ._mnist import load_mnist
from ._signals import make_synthetic_signals
from ._stl10 import load_stl10
from ._svhn import load_svhn

__all__ = [
    "format_images",
    "load_mnist",
    "load_stl10",
    "load_svhn",
    "make_mnist_m_like",
    "make_semi_supervised_labels",
    "make_synthetic_digits",
    "make_synthetic_signals",
]
