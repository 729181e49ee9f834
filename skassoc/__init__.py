"""skassoc: semi-supervised learning by association for scikit-learn."""

from ._classifier import SemiSupervisedAssociationClassifier
from ._recipes import RECIPES, recipe_params

__version__ = "0.1.0"

__all__ = [
    "SemiSupervisedAssociationClassifier",
    "RECIPES",
    "recipe_params",
    "__version__",
]
