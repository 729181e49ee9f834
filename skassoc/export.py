"""Export a fitted estimator to ONNX, for inference without Python or PyTorch.

The exported graph maps a float32 batch of inputs to the class
probabilities of :meth:`~skassoc.SemiSupervisedAssociationClassifier.predict_proba`,
so that ONNX Runtime and other ONNX backends can serve the model.
"""

import copy
import importlib.util
import itertools
import json
import numbers
import os
import tempfile
import warnings
from inspect import signature

import torch
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import check_is_fitted, check_scalar
from torch import nn

from ._classifier import SemiSupervisedAssociationClassifier
from ._fitted import get_fitted_state
from ._io._atomic import check_target, write_atomically
from ._io._model_file import as_path
from ._nn._image_format import format_settings

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


def _export_arguments(dynamo, opset_version):
    """Keyword arguments of torch.onnx.export for a dynamic batch size.

    The user's names are given to the graph's input and output after the
    export (:func:`_name_input_and_output`): an exporter gives a name it is
    asked for even where a value inside the graph has it already.
    """
    # The dynamo exporter prints its progress to stdout unless told not to.
    kwargs = {"opset_version": opset_version, "verbose": False}
    if dynamo:
        # One self-contained file (weights inside, not in a .data file); the
        # exporter names the input and output itself, uniquely.
        kwargs.update(
            dynamo=True,
            external_data=False,
            dynamic_shapes=({0: torch.export.Dim("batch")},),
        )
    else:
        # Names that the TorchScript exporter's own ("onnx::Gemm_0",
        # "/model/Gemm_output_0", parameter names) never are.
        kwargs.update(
            input_names=["skassoc::input"],
            output_names=["skassoc::output"],
            dynamic_axes={
                "skassoc::input": {0: "batch"},
                "skassoc::output": {0: "batch"},
            },
        )
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
    elif _is_search(estimator):
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


def _is_search(estimator):
    """Whether ``estimator`` is a hyper-parameter search (scikit-learn's or
    skassoc's): a refitted best estimator, or the ``estimator``, ``cv`` and
    ``refit`` parameters that searches share, without importing
    scikit-learn's private base class."""
    if hasattr(estimator, "best_estimator_"):
        return True
    return all(hasattr(estimator, name) for name in ("estimator", "cv", "refit"))


def _check_names(input_name, output_name):
    """The graph's input and output need distinct, non-empty names (ONNX
    Runtime refuses a graph without) that ONNX can store (as UTF-8)."""
    for name, value in (("input_name", input_name), ("output_name", output_name)):
        check_scalar(value, name, str)
        if not value:
            raise ValueError(f"{name} must be a non-empty string, got ''.")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(
                f"{name} must be text that UTF-8 can encode (ONNX stores names "
                f"as UTF-8); the character at index {error.start} of {value!r} "
                f"cannot be ({error.reason}). Pass a name without it."
            ) from None
    if input_name == output_name:
        raise ValueError(
            f"input_name and output_name must differ; both are {input_name!r}."
        )


def _check_opset_version(opset_version):
    """An integer opset that the installed onnx package knows, or None."""
    import onnx

    if opset_version is None:
        return
    if isinstance(opset_version, bool):
        raise TypeError(
            f"opset_version must be an int or None, not a bool ({opset_version})."
        )
    check_scalar(opset_version, "opset_version", numbers.Integral, min_val=1)
    newest = onnx.defs.onnx_opset_version()
    if opset_version > newest:
        raise ValueError(
            f"opset_version={opset_version} is beyond opset {newest}, the newest "
            f"that onnx {onnx.__version__} knows; pass {newest} or lower, or None."
        )


def _value_names(graph):
    """The names of all values of ``graph`` and of its subgraphs."""
    names = {value.name for value in (*graph.input, *graph.output, *graph.value_info)}
    names.update(tensor.name for tensor in graph.initializer)
    names.update(sparse.values.name for sparse in graph.sparse_initializer)
    for node in graph.node:
        names.update(node.input, node.output)
        for subgraph in _subgraphs(node):
            names |= _value_names(subgraph)
    # An omitted optional input of a node is named "".
    names.discard("")
    return names


def _subgraphs(node):
    """The graphs in ``node``'s attributes (the branches of an If, a Loop's
    body), which may use the values of the graph around them by name."""
    import onnx

    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            yield attribute.g
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            yield from attribute.graphs


def _rename_value(graph, old, new):
    """Rename the value ``old`` of ``graph`` to ``new``, wherever it is
    defined or used (its subgraphs included)."""
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.name == old:
            value.name = new
    for tensor in (
        *graph.initializer,
        *(sparse.values for sparse in graph.sparse_initializer),
    ):
        if tensor.name == old:
            tensor.name = new
    for annotation in graph.quantization_annotation:
        if annotation.tensor_name == old:
            annotation.tensor_name = new
    for node in graph.node:
        for names in (node.input, node.output):
            for index, name in enumerate(names):
                if name == old:
                    names[index] = new
        for subgraph in _subgraphs(node):
            _rename_value(subgraph, old, new)


def _name_input_and_output(model, input_name, output_name):
    """Give the graph's input and output the names asked for.

    A value inside the graph that has one of them already (a node's output
    such as ``"div"``, a weight such as ``"model.embedder.layers.0.weight"``)
    is renamed first, to a name the graph does not use: two values of one
    name make a graph that ONNX Runtime refuses to load.
    """
    graph = model.graph
    wanted = {input_name, output_name}
    for value, name in ((graph.input[0], input_name), (graph.output[0], output_name)):
        if value.name == name:
            continue
        taken = _value_names(graph)
        if name in taken:
            free = next(
                f"{name}_{n}"
                for n in itertools.count(1)
                if f"{name}_{n}" not in taken | wanted
            )
            _rename_value(graph, name, free)
        _rename_value(graph, value.name, name)


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
        Any text that UTF-8 can encode: where a value inside the graph
        has the name already (a node's output such as ``"div"``, a weight
        such as ``"model.embedder.layers.0.weight"``), that value is
        renamed (``"div_1"``, ...), so that the graph stays valid.
    output_name : str, default="probabilities"
        Name of the graph's output, float32 of shape ``(batch, n_classes)``;
        as ``input_name``, any text that UTF-8 can encode.
    opset_version : int, default=None
        ONNX opset to target, from 1 to the newest that the installed
        ``onnx`` package knows (``onnx.defs.onnx_opset_version()``); None
        lets PyTorch choose. An opset that the exporter cannot write this
        model in is refused (the graph's opset is checked), not replaced by
        another. A runtime may support fewer opsets than ``onnx`` knows.

    Returns
    -------
    path : str or os.PathLike
        ``path``, as given.

    Raises
    ------
    TypeError
        If ``estimator`` is not a SemiSupervisedAssociationClassifier (the
        message says what to pass for a pipeline or a search), a name
        is not a string, or ``opset_version`` is not an integer (a bool is
        not taken for one).
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
        empty, equal or not encodable as UTF-8 (a lone surrogate), if
        ``opset_version`` is out of range, or if the exporter cannot
        write it.

    Notes
    -----
    A model fitted on sparse rows (network ``"sparse_mlp"``) exports its
    dense path, which computes the same probabilities: its graph takes
    dense float32 rows, as ONNX runtimes have no sparse inputs. Densify a
    batch of rows at a time for it (``X[i:j].toarray()``).

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
    path_name = as_path(path)
    # Refused before the export, which takes a while, rather than after it.
    check_target(path_name, "ONNX files")
    dynamo = _uses_dynamo_exporter()
    _check_packages(dynamo)
    _check_opset_version(opset_version)
    _check_exportable(estimator, dynamo)
    state = get_fitted_state(estimator)
    model = copy.deepcopy(state.model).to("cpu", torch.float32)
    model = model.to(memory_format=torch.contiguous_format)
    model = _Probabilities(model, state.class_prior).eval()
    kwargs = _export_arguments(dynamo, opset_version)
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
    _name_input_and_output(graph, input_name, output_name)
    _add_classes(graph, state.classes)
    data = graph.SerializeToString()
    write_atomically(path_name, lambda handle: handle.write(data), "ONNX files")
    return path
