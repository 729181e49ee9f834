"""Data set loaders and helpers for semi-supervised experiments.

The loaders read the data sets used in "Learning by Association" (Haeusser
et al., 2017) from local files: :func:`load_mnist` (which can also download
its files) and :func:`load_svhn`. :func:`make_semi_supervised_labels` hides
all but a few labels per class.
"""

from ._labels import make_semi_supervised_labels
from ._mnist import load_mnist
from ._svhn import load_svhn

__all__ = ["load_mnist", "load_svhn", "make_semi_supervised_labels"]
