"""skassoc: semi-supervised learning by association for scikit-learn."""

from ._classifier import SemiSupervisedAssociationClassifier

__version__ = "0.1.0"

__all__ = ["SemiSupervisedAssociationClassifier", "__version__"]
