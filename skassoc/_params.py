"""The estimator's hyperparameters, each declared once.

:data:`PARAMS` holds one :class:`Param` a hyperparameter of
:class:`~skassoc.SemiSupervisedAssociationClassifier`, in the constructor's
order: its default, what scikit-learn's parameter validation accepts, what a
model file may hold, which part of the method it configures and whether
stacked candidates may differ in it. From it come

- ``_parameter_constraints`` (:data:`PARAMETER_CONSTRAINTS`);
- the parameters a model file may set, each with its domain
  (:data:`SAFE_PARAMS`), and those it never sets (:data:`NEVER_FROM_FILE`);
- the parameters stacked candidates may differ in (:func:`varying_params`);
  they share every other one;
- the values that ``resolve_fit_settings`` copies into the training
  configuration (:attr:`Param.to_training`).

The constructor and the class docstring stay written out: scikit-learn reads
``__init__``'s signature, numpydoc the docstring. ``tests/test_params.py``
checks that both match this table. A new parameter is therefore a row here,
an argument of the constructor (stored as it is), its entry in the
docstring's Parameters section and in ``docs/parameters.rst``; a setting
that is not a plain copy (an ``"auto"``, a check against the data) is
resolved in ``skassoc._settings``. The weight of a loss term is a row of part
``"losses"``, named by the term's ``weight_param`` (``skassoc._engine._loss_terms``).

:func:`add_param` adds a row while the process runs, for a loss term
registered from outside the package (as ``tests/test_loss_registry.py``
does); code that reads the table at fit time reads ``_params.PARAMS``.
"""

import os
from dataclasses import KW_ONLY, dataclass
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.utils._param_validation import Interval, Options, StrOptions

from ._engine._batches import UNLABELED_POOLS
from ._engine._optim import LR_SCHEDULES
from ._engine._sampling import UNLABELED_SAMPLINGS
from ._io._limits import (
    MAX_BATCH,
    MAX_LAYERS,
    MAX_PREDICT_BATCH,
    MAX_STEPS,
    MAX_WEIGHT,
    MAX_WIDTH,
    augmentation_domain,
    class_weight_domain,
    float_in,
    image_size_domain,
    int_in,
    is_class_prior,
    one_of,
    sizes,
)
from ._nn._networks import NETWORKS
from ._run_store import RunStore

__all__ = [
    "Param",
    "PARAMS",
    "PARTS",
    "NOT_FROM_FILES",
    "PARAMETER_CONSTRAINTS",
    "SAFE_PARAMS",
    "NEVER_FROM_FILE",
    "varying_params",
    "param_value",
    "loss_weight",
    "add_param",
    "remove_param",
]

#: What each parameter configures (:attr:`Param.part`).
PARTS = {
    "network": "the embedding network fit builds",
    "data": "how the inputs are read",
    "batches": "what each step's batches hold, their augmentation and class factors",
    "losses": "the weight of a loss term",
    "schedule": "the steps, the learning rate and the losses' delay",
    "optimizer": "weight decay and the averaged weights",
    "validation": "validation and early stopping during fit",
    "prediction": "predict, predict_proba and transform",
    "device": "where and in which arithmetic training runs",
    "fit": "how fit runs: its seed, its output, a warm start",
}


class _NotFromFiles:
    """The marker of a parameter that no model file sets (see :class:`Param`)."""

    def __repr__(self):
        return "NOT_FROM_FILES"


#: ``file_domain`` of a parameter that reaches a compiler, the hardware, code
#: or other files: a model file never sets it (``load`` keeps the default, or
#: its argument).
NOT_FROM_FILES = _NotFromFiles()


class _Int(Interval):
    """Ints from ``left`` (to ``right``); not booleans, which are no sizes."""

    def __init__(self, left, right=None):
        closed = "left" if right is None else "both"
        super().__init__(Integral, left, right, closed=closed)

    def is_satisfied_by(self, val):
        return not isinstance(val, bool) and super().is_satisfied_by(val)


# A loss weight (or L2 scale) is bounded as the model file bounds it, so that
# every estimator that fits can be saved. Above it a weight is far past any
# useful ratio between the losses, and a large enough one overflows float32
# in Adam's squared gradients, which looks like a too-high learning rate.
_WEIGHT = Interval(Real, 0, MAX_WEIGHT, closed="both")
# Values beyond float32's range cannot even be handed to the optimizer.
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_AUTO = StrOptions({"auto"})
_PRECISIONS = ("auto", "fp32", "tf32", "bf16")
_WEIGHT_IN_FILE = float_in(0, MAX_WEIGHT)


def _same(value):
    """Copied into the training configuration as it is."""
    return value


def _open_unit_interval(value):
    """A model file's ``validation_fraction``: a real number in (0, 1)."""
    return float_in(0, 1, low_open=True)(value) and value < 1


@dataclass(frozen=True)
class Param:
    """One hyperparameter of the estimator.

    Attributes
    ----------
    name : str
    default : object
        The constructor's default.
    constraints : tuple
        The values ``fit`` accepts, as scikit-learn's parameter validation
        takes them (the list of ``_parameter_constraints[name]``).
    file_domain : callable or NOT_FROM_FILES
        A check of the JSON value a model file may hold (from
        ``skassoc._io._limits``); :data:`NOT_FROM_FILES` for a parameter
        that no file sets.
    part : str
        What it configures, a key of :data:`PARTS`; the loss weights are
        ``"losses"``.
    to_training : callable or None
        How ``resolve_fit_settings`` copies the value into the training
        configuration's field of the same name (``float``, ``int``, ...);
        a loss weight goes into its ``loss_weights`` under its name.
        None where the setting is resolved there (an ``"auto"``, a check
        against other parameters or the data) or is no training setting.
    stacked : {"share", "vary"}
        Whether the candidates of a stacked search may differ in it
        (``"vary"``) or must share the estimator's value (``"share"``).
    """

    name: str
    _: KW_ONLY
    default: object
    constraints: tuple
    file_domain: object
    part: str
    to_training: object = None
    stacked: str = "share"


def loss_weight(name, default, *, stacked="share"):
    """The row of a loss term's weight: a float in ``[0, MAX_WEIGHT]``.

    Examples
    --------
    >>> from skassoc._params import loss_weight
    >>> row = loss_weight("toy_weight", 0.0, stacked="vary")
    >>> row.part, row.to_training, row.file_domain(2.5), row.file_domain(-1)
    ('losses', <class 'float'>, True, False)
    """
    return Param(
        name,
        default=default,
        constraints=(_WEIGHT,),
        file_domain=_WEIGHT_IN_FILE,
        part="losses",
        to_training=float,
        stacked=stacked,
    )


#: Every hyperparameter, in the constructor's order.
PARAMS = (
    Param(
        "network",
        default="auto",
        constraints=(StrOptions({"auto", *NETWORKS}), torch.nn.Module),
        file_domain=one_of("auto", *NETWORKS),
        part="network",
    ),
    Param(
        "input_shape",
        default=None,
        constraints=(tuple, list, None),
        file_domain=sizes(1, 3, allow_none=True),
        part="data",
    ),
    Param(
        "image_size",
        default=None,
        constraints=(_Int(1, MAX_WIDTH), tuple, list, None),
        file_domain=image_size_domain,
        part="network",
    ),
    Param(
        "image_channels",
        default=None,
        constraints=(Options(Integral, {1, 3}), None),
        file_domain=one_of(None, 1, 3),
        part="network",
    ),
    Param(
        "embedding_dim",
        default=128,
        constraints=(_Int(1, MAX_WIDTH),),
        file_domain=int_in(1, MAX_WIDTH),
        part="network",
    ),
    Param(
        "hidden_layer_sizes",
        default=(256, 256),
        constraints=(tuple, list),
        file_domain=sizes(0, MAX_LAYERS),
        part="network",
    ),
    Param(
        "labeled_per_class",
        default="auto",
        constraints=(_Int(1), _AUTO),
        file_domain=int_in(1, MAX_BATCH, "auto"),
        part="batches",
    ),
    Param(
        "unlabeled_batch_size",
        default="auto",
        constraints=(_Int(1), _AUTO),
        file_domain=int_in(1, MAX_BATCH, "auto"),
        part="batches",
    ),
    Param(
        "unlabeled_sampling",
        default="replacement",
        constraints=(StrOptions(set(UNLABELED_SAMPLINGS)),),
        file_domain=one_of(*UNLABELED_SAMPLINGS),
        part="batches",
    ),
    Param(
        "max_iter",
        default="auto",
        constraints=(_Int(1), _AUTO),
        file_domain=int_in(1, MAX_STEPS, "auto"),
        part="schedule",
    ),
    Param(
        "learning_rate",
        default=1e-3,
        constraints=(Interval(Real, 0, _FLOAT32_MAX, closed="right"),),
        file_domain=float_in(0, 10, low_open=True),
        part="schedule",
        to_training=float,
    ),
    Param(
        "lr_decay",
        default=0.33,
        constraints=(Interval(Real, 0, 1, closed="right"),),
        file_domain=float_in(0, 1, low_open=True),
        part="schedule",
        to_training=float,
    ),
    Param(
        "lr_decay_steps",
        default="auto",
        constraints=(_Int(1), _AUTO),
        file_domain=int_in(1, MAX_STEPS, "auto"),
        part="schedule",
    ),
    Param(
        "lr_schedule",
        default="step",
        constraints=(StrOptions(set(LR_SCHEDULES)),),
        file_domain=one_of(*LR_SCHEDULES),
        part="schedule",
        to_training=_same,
    ),
    Param(
        "lr_warmup_steps",
        default=0,
        constraints=(_Int(0),),
        file_domain=int_in(0, MAX_STEPS),
        part="schedule",
    ),
    loss_weight("walker_weight", 1.0, stacked="vary"),
    loss_weight("visit_weight", 1.0, stacked="vary"),
    loss_weight("logit_weight", 1.0, stacked="vary"),
    Param(
        "association_delay",
        default=0,
        constraints=(_Int(0),),
        file_domain=int_in(0, MAX_STEPS),
        part="schedule",
        to_training=int,
    ),
    Param(
        "association_ramp_steps",
        default=0,
        constraints=(_Int(0),),
        file_domain=int_in(0, MAX_STEPS),
        part="schedule",
        to_training=int,
    ),
    Param(
        "l2_scale",
        default="auto",
        constraints=(_WEIGHT, _AUTO),
        file_domain=float_in(0, MAX_WEIGHT, "auto"),
        part="optimizer",
    ),
    Param(
        "augmentation",
        default="auto",
        constraints=(None, StrOptions({"auto", "paper"}), dict),
        file_domain=augmentation_domain,
        part="batches",
    ),
    Param(
        "consistency_weight",
        default="auto",
        constraints=(_WEIGHT, _AUTO),
        file_domain=float_in(0, MAX_WEIGHT, "auto"),
        part="losses",
    ),
    loss_weight("balance_weight", 0.0),
    Param(
        "ema_decay",
        default=None,
        constraints=(None, Interval(Real, 0, 1, closed="left")),
        file_domain=float_in(0, 1, None, high_open=True),
        part="optimizer",
        to_training=_same,
    ),
    Param(
        "precision",
        default="auto",
        constraints=(StrOptions(set(_PRECISIONS)),),
        file_domain=one_of(*_PRECISIONS),
        part="device",
    ),
    Param(
        "cuda_graph",
        default="auto",
        constraints=("boolean", _AUTO),
        file_domain=one_of(True, False, "auto"),
        part="device",
    ),
    Param(
        "compile",
        default=False,
        constraints=("boolean", dict),
        file_domain=NOT_FROM_FILES,
        part="device",
    ),
    Param(
        "device",
        default="auto",
        constraints=(str, torch.device),
        file_domain=NOT_FROM_FILES,
        part="device",
    ),
    Param(
        "predict_batch_size",
        default="auto",
        constraints=(_Int(1), _AUTO),
        file_domain=int_in(1, MAX_PREDICT_BATCH, "auto"),
        part="prediction",
    ),
    Param(
        "random_state",
        default=None,
        constraints=("random_state",),
        file_domain=int_in(0, 2**32 - 1, None),
        part="fit",
    ),
    Param(
        "verbose",
        default=0,
        constraints=("verbose",),
        file_domain=int_in(0, 100, True, False),
        part="fit",
        to_training=_same,
    ),
    Param(
        "warm_start",
        default=False,
        constraints=("boolean",),
        file_domain=one_of(True, False),
        part="fit",
    ),
    Param(
        "validation_interval",
        default=500,
        constraints=(_Int(1),),
        file_domain=int_in(1, MAX_STEPS),
        part="validation",
        to_training=int,
    ),
    Param(
        "unlabeled_pool",
        default="unlabeled",
        constraints=(StrOptions(set(UNLABELED_POOLS)),),
        file_domain=one_of(*UNLABELED_POOLS),
        part="batches",
    ),
    Param(
        "early_stopping",
        default=False,
        constraints=("boolean",),
        file_domain=one_of(True, False),
        part="validation",
        to_training=bool,
    ),
    Param(
        "validation_fraction",
        default=0.1,
        constraints=(Interval(Real, 0, 1, closed="neither"),),
        file_domain=_open_unit_interval,
        part="validation",
    ),
    Param(
        "n_iter_no_change",
        default=10,
        constraints=(_Int(1),),
        file_domain=int_in(1, MAX_STEPS),
        part="validation",
        to_training=int,
    ),
    Param(
        "tol",
        default=1e-4,
        constraints=(Interval(Real, 0, MAX_WEIGHT, closed="both"),),
        file_domain=float_in(0, MAX_WEIGHT),
        part="validation",
        to_training=float,
    ),
    Param(
        "class_weight",
        default=None,
        constraints=(None, StrOptions({"balanced"}), dict),
        file_domain=class_weight_domain,
        part="batches",
    ),
    Param(
        "class_prior",
        default="auto",
        constraints=(StrOptions({"auto", "uniform"}), "array-like"),
        file_domain=is_class_prior,
        part="prediction",
    ),
    Param(
        "fit_report",
        default=True,
        constraints=("boolean",),
        file_domain=one_of(True, False),
        part="fit",
    ),
    Param(
        "callbacks",
        default=None,
        constraints=(None, list, tuple),
        # Callbacks are code: a model file never carries them.
        file_domain=NOT_FROM_FILES,
        part="fit",
    ),
    Param(
        "devices",
        default=None,
        constraints=(None, StrOptions({"all"}), list, tuple),
        # Hardware: a model file never chooses it.
        file_domain=NOT_FROM_FILES,
        part="device",
    ),
    Param(
        "resume_from",
        default=None,
        constraints=(None, str, os.PathLike, RunStore),
        # A path to read: a model file never points at another file.
        file_domain=NOT_FROM_FILES,
        part="fit",
    ),
)

#: ``_parameter_constraints`` of the estimator.
PARAMETER_CONSTRAINTS = {p.name: list(p.constraints) for p in PARAMS}
#: The hyperparameters a model file may set, each with the values it may take.
SAFE_PARAMS = {
    p.name: p.file_domain for p in PARAMS if p.file_domain is not NOT_FROM_FILES
}
#: The parameters a model file never sets: they reach a compiler, the
#: hardware, code (callbacks) or other files.
NEVER_FROM_FILE = tuple(p.name for p in PARAMS if p.file_domain is NOT_FROM_FILES)


def varying_params():
    """The parameters in which stacked candidates may differ.

    The rows of :data:`PARAMS` whose ``stacked`` is ``"vary"``, read at
    call time: a loss term may add its weight while the process runs.
    Stacked candidates share every other parameter.

    Returns
    -------
    names : tuple of str
    """
    return tuple(p.name for p in PARAMS if p.stacked == "vary")


def param_value(estimator, name):
    """The value of the parameter ``name`` on ``estimator``.

    A row added at run time (with a loss term) is a parameter of the classes
    made for it, not of an estimator built without it: that one takes the
    row's default (a loss weight of 0, say).

    Raises
    ------
    KeyError
        If :data:`PARAMS` has no row ``name``.
    """
    default = {p.name: p.default for p in PARAMS}[name]
    return getattr(estimator, name, default)


# The rows of the table's source, which remove_param leaves alone.
_SOURCE_ROWS = frozenset(p.name for p in PARAMS)


def add_param(param):
    """Add ``param`` to the table and to everything derived from it.

    For a row that the table's source does not hold: the weight of a loss
    term registered while the process runs (see ``skassoc._engine._loss_terms``).
    The estimator needs the constructor argument too (a subclass's).

    Raises
    ------
    ValueError
        If the table has a row of that name, the row is no loss weight
        (other settings need code in ``skassoc._settings``), or a model file
        may not set it (``NEVER_FROM_FILE`` is fixed when the model-file
        modules load).
    """
    global PARAMS
    if any(p.name == param.name for p in PARAMS):
        raise ValueError(f"The table has a row {param.name!r} already.")
    if param.part != "losses" or param.file_domain is NOT_FROM_FILES:
        raise ValueError(
            f"{param.name}: a row added at run time is the weight of a loss "
            "term (part 'losses') that a model file may set (a file_domain)."
        )
    PARAMS = (*PARAMS, param)
    # In place: the estimator and the model-file modules hold these dicts.
    PARAMETER_CONSTRAINTS[param.name] = list(param.constraints)
    SAFE_PARAMS[param.name] = param.file_domain


def remove_param(name):
    """Remove the row ``name`` that :func:`add_param` added."""
    global PARAMS
    if name in _SOURCE_ROWS or name not in PARAMETER_CONSTRAINTS:
        raise ValueError(f"{name!r} is no row that add_param added.")
    PARAMS = tuple(p for p in PARAMS if p.name != name)
    del PARAMETER_CONSTRAINTS[name]
    del SAFE_PARAMS[name]
