"""Export a fitted estimator to ONNX, for inference without Python or PyTorch.

The exported graph maps a float32 batch of inputs to the class
probabilities of :meth:`~skassoc.SemiSupervisedAssociationClassifier.predict_proba`,
so that ONNX Runtime and other ONNX backends can serve the model.
"""

import copy
import importlib.util
import json
import numbers
import os
import tempfile
import warnings
from inspect import signature

import torch
from sklearn.model_selection._search import BaseSearchCV
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import check_is_fitted, check_scalar
from torch import nn

from ._classifier import SemiSupervisedAssociationClassifier
from ._fitted import get_fitted_state
from ._image_format import format_settings
from ._io._atomic import check_target, write_atomically
from .model_selection import StackedGridSearchCV

__all__ = ["export_onnx"]


class _Probabilities(nn.Module):
    """The fitted model, its softmax and the class frequencies: raw inputs ->
    class probabilities."""

    def __init__(self, model, class_prior):
        super().__init__()
        self.model = model
        # The logarithm in float64: a tiny frequency stays finite.
        log_prior = torch.log(torch.as_tensor(class_prior, dtype=torch.float64))
        self.register_buffer("log_prior", log_prior.float())

    def forward(self, x):
        # As predict_proba computes them (_classifier.run_model): the input
        # format and the embedder, the logit layer, a softmax over classes
        # weighed by the class frequencies (a softmax of logits plus their
        # logarithms).
        logits = self.model.logits(self.model.embed(x))
        return torch.softmax(logits + self.log_prior, dim=1)


def _uses_dynamo_exporter():
    """Whether torch.onnx.export offers the torch.export-based exporter.

    PyTorch 2.5 added ``dynamo=`` and 2.9 made it the default; the older
    TorchScript exporter cannot export the antialiased resize of
    ``image_size`` and is deprecated, so the new one is used where it exists.
    """
    return "dynamo" in signature(torch.onnx.export).parameters


def _check_packages(dynamo):
    needed = ["onnx", "onnxscript"] if dynamo else ["onnx"]
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"export_onnx needs the packages {', '.join(needed)}; install "
            f"{' and '.join(missing)} (e.g. pip install {' '.join(missing)})."
        )


def _export_arguments(dynamo, input_name, output_name, opset_version):
    """Keyword arguments of torch.onnx.export for a dynamic batch size."""
    kwargs = {
        "input_names": [input_name],
        "output_names": [output_name],
        "opset_version": opset_version,
        # The dynamo exporter prints its progress to stdout unless told not to.
        "verbose": False,
    }
    if dynamo:
        # One self-contained file (weights inside, not in a .data file).
        kwargs.update(
            dynamo=True,
            external_data=False,
            dynamic_shapes=({0: torch.export.Dim("batch")},),
        )
    else:
        kwargs["dynamic_axes"] = {input_name: {0: "batch"}, output_name: {0: "batch"}}
    return kwargs


def _check_exportable(estimator, dynamo):
    """Refuse what the exporter at hand cannot export, before it tries."""
    size, _ = format_settings(estimator.model_.input_format)
    if size is not None and not dynamo:
        raise ValueError(
            f"This estimator resizes its images (image_size={size}), and the "
            f"ONNX exporter of torch {torch.__version__} cannot export the "
            "antialiased resize; export with torch 2.5 or later."
        )


def _example_input(estimator):
    """A batch of two zero inputs in the network's layout.

    Two, not one: the exporters would take a batch of one for a constant.
    """
    if estimator.input_shape_ is not None:
        return torch.zeros(2, *estimator.input_shape_)
    return torch.zeros(2, estimator.n_features_in_)


def _check_estimator(estimator):
    """Refuse what is not a SemiSupervisedAssociationClassifier, saying what
    to pass instead of a pipeline or a search."""
    if isinstance(estimator, SemiSupervisedAssociationClassifier):
        return
    name = type(estimator).__name__
    if isinstance(estimator, Pipeline):
        steps = ", ".join(step for step, _ in estimator.steps[:-1]) or "none"
        hint = (
            "pass its last step (pipeline[-1]) and apply its other steps "
            f"({steps}) to the inputs before the ONNX graph: they are not exported."
        )
    elif isinstance(estimator, (BaseSearchCV, StackedGridSearchCV)):
        hint = (
            "pass the refitted best estimator (search.best_estimator_; its "
            "last step if that is a Pipeline)."
        )
    else:
        hint = "pass a fitted SemiSupervisedAssociationClassifier."
    raise TypeError(
        f"export_onnx exports a SemiSupervisedAssociationClassifier, not a {name}: "
        + hint
    )


def _check_names(input_name, output_name):
    """The graph's input and output need distinct, non-empty names (ONNX
    Runtime refuses a graph without)."""
    for name, value in (("input_name", input_name), ("output_name", output_name)):
        check_scalar(value, name, str)
        if not value:
            raise ValueError(f"{name} must be a non-empty string, got ''.")
    if input_name == output_name:
        raise ValueError(
            f"input_name and output_name must differ; both are {input_name!r}."
        )


def _check_opset(model, opset_version):
    """Refuse a graph of another opset than the one asked for: the exporters
    may fall back to their own when they cannot convert, with only a log line."""
    written = {o.domain: o.version for o in model.opset_import}.get("")
    if opset_version is not None and written != opset_version:
        raise ValueError(
            f"The ONNX exporter of torch {torch.__version__} cannot write this "
            f"model in opset {opset_version} (it wrote opset {written}); choose "
            "an opset it supports, such as that one, or opset_version=None."
        )


def _export_to_memory(module, example, kwargs):
    """The exported graph as an ``onnx.ModelProto`` (the exporters write only
    files: one in a private folder, never the target)."""
    import onnx

    with tempfile.TemporaryDirectory(prefix="skassoc_onnx_") as folder:
        exported = os.path.join(folder, "model.onnx")
        with warnings.catch_warnings():
            # The exporters' notes on their own internals mean nothing to a
            # user of this function.
            warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning))
            torch.onnx.export(module, (example,), exported, **kwargs)
        return onnx.load(exported)


def _add_classes(graph, classes):
    """Record ``classes_`` in the graph's metadata, in the columns' order."""
    import onnx

    classes = json.dumps(classes.tolist(), default=str)
    onnx.helper.set_model_props(graph, {"classes": classes})


def export_onnx(
    estimator,
    path,
    *,
    input_name="input",
    output_name="probabilities",
    opset_version=None,
):
    """Export a fitted classifier's class probabilities to an ONNX file.

    The ONNX graph takes a float32 batch of inputs of any size and returns
    the class probabilities of ``estimator.predict_proba``, one column per
    class of ``classes_``, in that order; the file's metadata
    holds the classes as a JSON list under ``"classes"``. The export runs on
    a CPU copy of the network; the estimator is left as it is.

    Parameters
    ----------
    estimator : SemiSupervisedAssociationClassifier
        A fitted estimator. Not a pipeline: pass its last step
        (``pipeline[-1]``) and apply the preprocessing steps to the inputs
        before the graph; they are not exported. Not a search either: pass
        its ``best_estimator_``.
    path : str or os.PathLike
        Where to write the ONNX model (extension ``.onnx``): a new file, or
        a regular file or a symbolic link, which is replaced (the link
        itself, not the file it points to).
    input_name : str, default="input"
        Name of the graph's input, not empty and not ``output_name``:
        float32 of shape ``(batch, n_features)`` for feature rows,
        ``(batch, channels, height, width)`` for images
        (``estimator.input_shape_``, also when ``fit`` took flat rows with
        ``input_shape``). Cast uint8 pixels to float32; do not rescale them.
    output_name : str, default="probabilities"
        Name of the graph's output, float32 of shape ``(batch, n_classes)``.
    opset_version : int, default=None
        ONNX opset to target; None lets PyTorch choose. An opset that the
        exporter cannot write this model in is refused (the graph's opset
        is checked), not replaced by another.

    Returns
    -------
    path : str or os.PathLike
        ``path``, as given.

    Raises
    ------
    TypeError
        If ``estimator`` is not a SemiSupervisedAssociationClassifier (the
        message says what to pass for a pipeline or a search), or a name
        is not a string.
    sklearn.exceptions.NotFittedError
        If the estimator is not fitted.
    FileNotFoundError
        If the folder of ``path`` does not exist.
    ImportError
        If ``onnx`` (and, with PyTorch 2.5 or later, ``onnxscript``) is
        not installed.
    ValueError
        If a custom ``network`` module cannot be exported (for example one
        whose ``forward`` branches on the values of its input, or calls
        NumPy), if the estimator resizes images (``image_size``) and
        PyTorch is older than 2.5, if ``path`` exists and is not a regular
        file or a link (a directory, FIFO or device), if the names are
        empty or equal, or if the exporter cannot write ``opset_version``.

    Notes
    -----
    The graph computes in float32. Where the estimator predicts in lower
    precision (``precision="bf16"``, which ``"auto"`` picks for images on
    CPUs with native bf16 arithmetic, or TF32 on GPUs), its probabilities
    differ from the graph's by that precision's rounding.

    With PyTorch 2.5 or later the export uses ``torch.onnx.export(...,
    dynamo=True)``; older versions use the TorchScript exporter, which
    cannot export the antialiased resize of ``image_size``. ONNX Runtime
    computes that resize slightly differently from PyTorch: probabilities of
    models with ``image_size`` agree to about 1e-3, the others to about 1e-5.

    The file is written whole or not at all: the graph and its ``classes``
    are written to a temporary file beside ``path`` that is then renamed
    over it, so that a reader never sees a partial file, and an error or a
    crash leaves an existing file as it was. The temporary file of an export
    that crashed is removed by the next export to the same path (on Windows
    it stays, named ``<path>.<random>.skassoc-tmp``), as for model files.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.datasets import make_blobs
    >>> from skassoc import SemiSupervisedAssociationClassifier
    >>> from skassoc.export import export_onnx
    >>> X, y = make_blobs(n_samples=60, centers=3, random_state=0)
    >>> y[10:] = -1
    >>> clf = SemiSupervisedAssociationClassifier(
    ...     "mlp", labeled_per_class=2, max_iter=5, device="cpu", random_state=0
    ... ).fit(X, y)
    >>> import os, tempfile
    >>> path = export_onnx(clf, os.path.join(tempfile.mkdtemp(), "model.onnx"))

    Run it with the reference runtime that ships with the ``onnx`` package
    (``onnxruntime.InferenceSession(path).run(None, {"input": ...})`` serves
    it the same way, faster):

    >>> from onnx.reference import ReferenceEvaluator
    >>> (proba,) = ReferenceEvaluator(path).run(None, {"input": X.astype(np.float32)})
    >>> bool(np.allclose(proba, clf.predict_proba(X), atol=1e-5))
    True
    """
    _check_estimator(estimator)
    check_is_fitted(estimator)
    _check_names(input_name, output_name)
    if opset_version is not None:
        check_scalar(opset_version, "opset_version", numbers.Integral, min_val=1)
    path_name = os.fsdecode(path)
    # Refused before the export, which takes a while, rather than after it.
    check_target(path_name, "ONNX files")
    dynamo = _uses_dynamo_exporter()
    _check_packages(dynamo)
    _check_exportable(estimator, dynamo)
    state = get_fitted_state(estimator)
    model = copy.deepcopy(state.model).to("cpu", torch.float32)
    model = model.to(memory_format=torch.contiguous_format)
    model = _Probabilities(model, state.class_prior).eval()
    kwargs = _export_arguments(dynamo, input_name, output_name, opset_version)
    try:
        graph = _export_to_memory(model, _example_input(estimator), kwargs)
    except Exception as error:
        if estimator.network_ != "custom":
            raise
        raise ValueError(
            "The custom network module could not be exported to ONNX "
            f"(torch.onnx.export raised {type(error).__name__}; see above). "
            "ONNX export traces forward once: it must not branch on the "
            "values of its input or leave PyTorch (NumPy, .item(), .tolist())."
        ) from error
    _check_opset(graph, opset_version)
    _add_classes(graph, state.classes)
    data = graph.SerializeToString()
    write_atomically(path_name, lambda handle: handle.write(data), "ONNX files")
    return path
