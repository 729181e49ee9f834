"""Save a fitted estimator to a model file, and load it back, without pickle.

The format is described in ``_format``; this module puts the other parts
together: the metadata, the weights, the optional training state and the
archive.
"""

import os

from .._diagnosis import FitReport
from .._engine._device import resolve_device
from .._fitted import FittedState, get_fitted_state, set_fitted_state
from .._nn._model import placed, spec_of_model
from .._nn._networks import NETWORKS
from ._archive import read_archive, write_archive
from ._format import FORMAT_VERSION, WEIGHTS_MEMBER, InvalidModelFile
from ._metadata import (
    check_checksum,
    check_format,
    decode_class_prior,
    decode_classes,
    decode_feature_names,
    decode_history,
    decode_n_iter,
    decode_output_config,
    decode_params,
    decode_spec,
    encode_metadata,
    encode_params,
    field,
    metadata_bytes,
)
from ._refit_cost import refit_cost_problem
from ._training_state import (
    check_training_state,
    encode_training_state,
    read_training_state,
)
from ._weights import (
    build_loaded,
    check_weights_fit,
    expected_weights,
    logit_width,
    read_weights,
    safetensors_header,
    weights_bytes,
)

__all__ = ["save_model", "load_model", "as_path", "decode_file"]


# ----------------------------------------------------------------- saving


def save_model(estimator, path, *, training_state=False):
    """Save a fitted estimator to one file, without pickle.

    Parameters
    ----------
    estimator : SemiSupervisedAssociationClassifier
        A fitted estimator with a built-in network.
    path : str, bytes or os.PathLike
        Where to write the model (see the estimator's ``save``).
    training_state : bool, default=False
        Whether to store ``training_state_`` too (a checkpoint), so that a
        warm start of the loaded estimator continues the run.

    Raises
    ------
    sklearn.exceptions.NotFittedError
        If the estimator is not fitted.
    ValueError
        If the estimator uses a custom network, a parameter or the labels
        cannot be stored as JSON, a parameter (or their refit cost) is
        outside the values that :func:`load_model` accepts, ``path`` is
        not a regular file, or ``training_state`` is True and the estimator
        has none (its run cannot be continued). Nothing is written then.
    """
    path = as_path(path)
    state = get_fitted_state(estimator)
    _check_builtin(state.network)
    spec = spec_of_model(
        state.model, state.network, state.input_shape, state.n_features_in
    )
    params = encode_params(estimator.get_params(deep=False))
    _check_savable_cost(params, spec)
    entry = data = None
    if training_state:
        _check_continuable(state)
        entry, data = encode_training_state(state.training_state, spec, state.n_iter)
    weights = weights_bytes(state.model)
    metadata = encode_metadata(estimator, state, spec, params, weights)
    if entry is not None:
        metadata["training_state"] = entry
    if state.fit_report is not None:
        metadata["fit_report"] = state.fit_report.to_dict()
    write_archive(path, metadata_bytes(metadata), weights, data)


def _check_continuable(state):
    if state.training_state is None:
        raise ValueError(
            "Cannot save the training state: this estimator has none "
            "(training_state_ is None), so its run cannot be continued. Early "
            "stopping kept the weights of an earlier step, the fit failed, or "
            "the estimator was loaded from a file saved without it. Save the "
            "model without it (training_state=False)."
        )


def _check_builtin(network):
    if network not in NETWORKS:
        raise ValueError(
            "save can only save estimators with a built-in network "
            f"({sorted(NETWORKS)}); this one uses a custom torch.nn.Module, "
            "whose code a model file cannot hold without pickle. Pickle it "
            "(trusted files only), or save the weights with "
            "torch.save(estimator.model_.state_dict(), path); to load them, fit "
            "an estimator with the same network for max_iter=1 on data of the "
            "same shape and classes, then call estimator.model_.load_state_dict("
            "torch.load(path, weights_only=True))."
        )


def _check_savable_cost(params, spec):
    problem = refit_cost_problem(params, spec)
    if problem is not None:
        raise ValueError(
            f"Cannot save these parameters: {problem}, which is more than a "
            "model file may ask a refit for (load would refuse the file). "
            "The fitted model does not need them: lower max_iter or the "
            "batch sizes with set_params before saving, and set them again "
            "after loading."
        )


def as_path(path):
    """``path`` as a str; a clear TypeError for what is not a path."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(
            f"path must be a str, bytes or os.PathLike file name; got "
            f"{type(path).__name__}. (File objects are not supported: the "
            "model is written under a temporary name and renamed.)"
        )
    return os.fsdecode(os.fspath(path))


# ---------------------------------------------------------------- loading


def load_model(estimator_class, path, *, device="auto"):
    """Read a model file written by :func:`save_model`.

    Parameters
    ----------
    estimator_class : type
        The estimator to build (``SemiSupervisedAssociationClassifier``).
    path : str, bytes or os.PathLike
        The model file.
    device : str or torch.device, default="auto"
        Where to place the model.

    Returns
    -------
    estimator : estimator_class
        Fitted, with the file's parameters (``device`` is this function's)
        and output configuration, the model on ``device``, and the file's
        training state on the CPU (``training_state_``; None without one).

    Raises
    ------
    ValueError
        If the file is not a valid model file, asks for more than the
        limits allow, was written by a newer skassoc, or is of format 1 or
        2 (see :func:`~skassoc.convert_model_file`).
    """
    resolved = resolve_device(device)
    name = as_path(path)
    try:
        archive = read_archive(name)
        metadata = archive.metadata
        version = check_format(
            metadata,
            name,
            archive.weights_member,
            has_training_state=archive.training_state is not None,
        )
        if version < FORMAT_VERSION:
            raise ValueError(_legacy_advice(name, metadata, version))
        params, state, output = decode_file(
            metadata, archive.weights, resolved, archive.training_state
        )
    except InvalidModelFile as exc:
        raise ValueError(f"{name!r} is not a valid skassoc model file: {exc}") from None
    estimator = estimator_class(**params, device=device)
    set_fitted_state(estimator, state)
    if output:
        estimator.set_output(**output)
    return estimator


def _legacy_advice(path, metadata, version):
    return (
        f"{path!r} is a skassoc model file of format version {version} "
        f"(skassoc {str(metadata.get('skassoc_version', '?'))[:40]}), whose "
        "weights are a torch pickle; this skassoc reads only format "
        f"{FORMAT_VERSION}, which holds no pickle. Convert the file once with "
        f"skassoc.convert_model_file({path!r}, new_path), which reads the old "
        "weights without unpickling them and checks them as load does, or "
        "fit the model again and save it."
    )


def decode_file(metadata, weights, device, training_state=None):
    """The parameters, fitted state and output configuration of a file.

    ``training_state`` is the content of ``training_state.safetensors``
    (None where the archive has no such member).
    """
    params = decode_params(field(metadata, "params", dict))
    output = decode_output_config(metadata.get("output_config"))
    state = _decode_state(metadata, weights, device, params, training_state)
    return params, state, output


def _decode_state(metadata, weights, device, params, training_state):
    """The fitted state of the file: its tensors read only once all are checked."""
    check_checksum(metadata, weights, WEIGHTS_MEMBER)
    present = safetensors_header(weights)
    classes = decode_classes(field(metadata, "classes", dict), logit_width(present))
    spec = decode_spec(field(metadata, "network", dict), len(classes))
    check_weights_fit(expected_weights(spec), present)
    problem = refit_cost_problem(params, spec)
    if problem is not None:
        raise InvalidModelFile(
            f"its parameters ask a refit for more than a model file may: {problem}."
        )
    names = decode_feature_names(metadata.get("feature_names_in"), spec.n_features)
    n_iter = decode_n_iter(metadata)
    checked = check_training_state(
        metadata.get("training_state"), training_state, spec, n_iter
    )
    state_dict = read_weights(weights, present)
    model = build_loaded(spec, state_dict)
    return FittedState(
        model=placed(model, device, spec),
        classes=classes,
        class_prior=decode_class_prior(metadata, len(classes)),
        input_shape=spec.input_shape,
        network=spec.network,
        n_features_in=spec.n_features,
        feature_names_in=names,
        n_iter=n_iter,
        history=decode_history(field(metadata, "history", dict)),
        device=device,
        training_state=read_training_state(checked),
        fit_report=_decode_fit_report(metadata.get("fit_report"), classes),
    )


def _decode_fit_report(entry, classes):
    """``fit_report_`` of a model file: data only, checked (absent: None)."""
    if entry is None:
        return None
    try:
        return FitReport.from_dict(entry, classes)
    except ValueError as error:
        raise InvalidModelFile(str(error)) from None
