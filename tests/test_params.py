"""The parameter table (skassoc._params): everything derived from it matches it.

The constructor and the class docstring are written out by hand; these tests
make them, and every list derived from the table, unable to drift from it.
"""

import inspect
import json
import re
from dataclasses import fields

import numpy as np
import pytest
import torch
from sklearn.utils._param_validation import (
    InvalidParameterError,
    validate_parameter_constraints,
)

from skassoc import RECIPES, SemiSupervisedAssociationClassifier
from skassoc._defaults import network_macs
from skassoc._engine._config import TrainingConfig
from skassoc._inputs import validate_training_inputs
from skassoc._io._metadata import decode_params, encode_params
from skassoc._nn._networks import NETWORKS
from skassoc._params import (
    NEVER_FROM_FILE,
    NOT_FROM_FILES,
    PARAMETER_CONSTRAINTS,
    PARAMS,
    PARTS,
    SAFE_PARAMS,
    varying_params,
)
from skassoc._settings import (
    copied_settings,
    resolve_fit_settings,
    resolve_precision,
)
from skassoc._stacked import check_candidate_params

Classifier = SemiSupervisedAssociationClassifier
NAMES = [p.name for p in PARAMS]


def signature_rows(cls):
    """``(name, default)`` of every constructor parameter, in order."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return [(p.name, p.default) for p in parameters if p.name != "self"]


def documented_parameters(cls):
    """The names the Parameters section of ``cls``'s docstring describes."""
    doc = inspect.cleandoc(cls.__doc__)
    section = doc.split("Parameters\n----------\n")[1].split("\n\nAttributes\n")[0]
    names = []
    for line in section.splitlines():
        match = re.match(r"(\w+(?:, \w+)*) :", line)
        if match:
            names.extend(match.group(1).split(", "))
    return names


def test_the_constructor_is_the_table():
    assert signature_rows(Classifier) == [(p.name, p.default) for p in PARAMS]
    kinds = {p.name: p.kind for p in inspect.signature(Classifier).parameters.values()}
    # Only the network may be passed by position, as in scikit-learn.
    assert kinds.pop("network") is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert set(kinds.values()) == {inspect.Parameter.KEYWORD_ONLY}


def test_every_parameter_is_documented_once_in_table_order():
    assert documented_parameters(Classifier) == NAMES


def test_get_params_is_the_table():
    assert list(Classifier().get_params()) == sorted(NAMES)
    assert Classifier().get_params() == {p.name: p.default for p in PARAMS}


def test_parameter_constraints_are_the_tables():
    constraints = Classifier._parameter_constraints
    assert list(constraints) == NAMES
    for param in PARAMS:
        assert constraints[param.name] == list(param.constraints), param.name
    assert constraints is PARAMETER_CONSTRAINTS


def test_every_default_is_valid_and_can_be_saved():
    defaults = {p.name: p.default for p in PARAMS}
    validate_parameter_constraints(PARAMETER_CONSTRAINTS, defaults, "test")
    stored = json.loads(json.dumps(encode_params(defaults)))
    assert decode_params(stored) == {n: defaults[n] for n in SAFE_PARAMS}


def test_the_model_files_parameters_are_the_tables():
    assert NEVER_FROM_FILE == (
        "compile",
        "device",
        "callbacks",
        "devices",
        "resume_from",
    )
    assert list(SAFE_PARAMS) == [n for n in NAMES if n not in NEVER_FROM_FILE]
    for param in PARAMS:
        if param.file_domain is NOT_FROM_FILES:
            assert param.name not in SAFE_PARAMS
        else:
            assert SAFE_PARAMS[param.name] is param.file_domain


@pytest.mark.parametrize("name", NETWORKS)
def test_every_network_of_the_registry_is_accepted_and_costed(name):
    # A network family added to the registry is a valid value of `network`
    # everywhere, and max_iter="auto" can estimate its cost.
    Classifier(name)._validate_params()
    assert SAFE_PARAMS["network"](name)
    shape = None if name == "mlp" else (3, 96, 96)
    assert network_macs(name, shape, 16) > 0


def test_unknown_network_names_are_refused():
    with pytest.raises(InvalidParameterError, match="network"):
        Classifier("resnet")._validate_params()
    assert not SAFE_PARAMS["network"]("resnet")


def test_rows_name_a_part_and_the_loss_weights_belong_to_the_losses():
    assert {p.part for p in PARAMS} <= set(PARTS)
    assert {p.stacked for p in PARAMS} <= {"share", "vary"}
    losses = {p.name for p in PARAMS if p.part == "losses"}
    assert losses == {n for n in NAMES if n.endswith("_weight") and n != "class_weight"}


def test_stacked_candidates_vary_only_the_tables_varying_parameters():
    varying = varying_params()
    assert varying == ("walker_weight", "visit_weight", "logit_weight")
    assert check_candidate_params([{n: 0.5 for n in varying}])
    shared = [n for n in NAMES if n not in varying]
    for name in shared:
        with pytest.raises(ValueError, match=f"differ too: \\['{name}'\\]"):
            check_candidate_params([{name: 1}])


def test_copied_settings_are_training_fields():
    training_fields = {f.name for f in fields(TrainingConfig)}
    copied = [p.name for p in PARAMS if p.to_training is not None]
    # The loss weights go into the dict loss_weights, the others to fields.
    weights = {p.name for p in PARAMS if p.part == "losses"}
    assert set(copied) - weights <= training_fields
    assert not weights & training_fields
    # A training field named as a parameter is either copied from it or
    # resolved by resolve_fit_settings: never left at the field's default.
    resolved = {
        "max_iter",
        "lr_decay_steps",
        "lr_warmup_steps",
        "l2_scale",
        "augmentation",
        "precision",
        "cuda_graph",
        "class_prior",
        "compile",
    }
    assert (training_fields & set(NAMES)) - set(copied) == resolved


def test_fit_settings_carry_every_copied_parameter():
    values = {
        "learning_rate": np.float32(0.5),
        "lr_decay": 0.5,
        "lr_schedule": "cosine",
        "walker_weight": 0.25,
        "visit_weight": np.float64(0.5),
        "logit_weight": 3,
        "association_delay": np.int64(3),
        "association_ramp_steps": 4,
        "balance_weight": 0.125,
        "ema_decay": 0.9,
        "verbose": 2,
        "validation_interval": np.int32(7),
        "early_stopping": np.True_,
        "n_iter_no_change": 3,
        "tol": 1e-2,
    }
    assert set(values) == {p.name for p in PARAMS if p.to_training is not None}
    clf = Classifier(network="mlp", max_iter=20, device="cpu", random_state=0)
    clf.set_params(**values)
    X = np.random.RandomState(0).rand(20, 3)
    y = np.array([0, 1] * 3 + [-1] * 14)
    training = resolve_fit_settings(clf, validate_training_inputs(clf, X, y)).training
    kinds = {p.name: p.to_training for p in PARAMS}
    weights = training.loss_weights
    for name, value in values.items():
        copied = weights[name] if name in weights else getattr(training, name)
        assert copied == value, name
        if kinds[name] in (float, int, bool):
            assert type(copied) is kinds[name], name
    copied = copied_settings(clf)
    assert copied.pop("loss_weights") == {
        n: weights[n] for n in values if n.endswith("_weight")
    }
    assert copied == {n: getattr(training, n) for n in values if n not in weights}


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipes_set_only_the_tables_parameters(name):
    assert set(RECIPES[name]) <= set(NAMES)


def test_the_table_is_frozen():
    with pytest.raises(AttributeError):
        PARAMS[0].default = "mlp"


@pytest.mark.parametrize(
    "capability, images, expected",
    [((9, 0), True, "bf16"), ((8, 0), True, "bf16"), ((7, 5), True, "tf32")]
    + [((9, 0), False, "tf32")],
)
def test_auto_precision_on_a_gpu_is_bf16_for_images_where_native(
    monkeypatch, capability, images, expected
):
    # Pre-Ampere GPUs emulate bf16 slowly; rows stay in TF32.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: capability)
    assert resolve_precision("auto", torch.device("cuda"), images) == expected
    assert resolve_precision("fp32", torch.device("cuda"), images) == "fp32"
