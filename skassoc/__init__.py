"""skassoc: semi-supervised learning by association for scikit-learn."""

from ._classifier import SemiSupervisedAssociationClassifier
from ._diagnosis import REPORT_SCORES, FitReport, FitReportWarning
from ._io._legacy import convert_model_file
from ._recipes import RECIPES, recipe_params
from ._version import __version__

__all__ = [
    "SemiSupervisedAssociationClassifier",
    "FitReport",
    "FitReportWarning",
    "REPORT_SCORES",
    "convert_model_file",
    "RECIPES",
    "recipe_params",
    "__version__",
]
