"""Tests of skassoc.export: ONNX export checked against predict_proba."""

import importlib.util
import json

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError
from torch import nn

from skassoc import SemiSupervisedAssociationClassifier
from skassoc import export as export_module
from skassoc.export import export_onnx

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")
if export_module._uses_dynamo_exporter():
    pytest.importorskip("onnxscript")


def _run(path, inputs, input_name="input"):
    session = onnxruntime.InferenceSession(
        str(path), providers=["CPUExecutionProvider"]
    )
    (proba,) = session.run(None, {input_name: inputs.astype(np.float32)})
    return proba


def _assert_same_predictions(proba, clf, X, atol):
    """Probabilities within ``atol``, and the same class where not a near tie.

    Where the top two probabilities are within the rounding differences of
    two runtimes, either class may come out of either of them.
    """
    expected = clf.predict_proba(X)
    np.testing.assert_allclose(proba, expected, rtol=0, atol=atol)
    top_two = np.sort(expected, axis=1)[:, -2:]
    clear = top_two[:, 1] - top_two[:, 0] > 2 * atol
    assert clear.mean() > 0.95
    np.testing.assert_array_equal(
        clf.classes_[proba.argmax(axis=1)][clear], clf.predict(X)[clear]
    )


@pytest.fixture
def digits_semi(_digits):
    """300 digits as flat rows of pixels 0..240, every third one labeled.

    Pixels 0..240, not 0..16: the image networks divide by 255.
    """
    X, y = _digits
    y_semi = y[:300].copy()
    y_semi[np.arange(300) % 3 != 0] = -1
    return (X[:300] * 15).astype(np.float32), y_semi


def test_mlp_export_matches_predict_proba(
    blobs_semi, fast_params, tmp_path, torch_single_thread
):
    X, y = blobs_semi
    clf = SemiSupervisedAssociationClassifier(**fast_params).fit(X, y)
    path = export_onnx(clf, tmp_path / "mlp.onnx")
    assert path == tmp_path / "mlp.onnx"
    _assert_same_predictions(_run(path, X), clf, X, atol=1e-4)
    # The batch axis is dynamic: one sample, and an odd number of them.
    _assert_same_predictions(_run(path, X[:1]), clf, X[:1], atol=1e-4)
    _assert_same_predictions(_run(path, X[:7]), clf, X[:7], atol=1e-4)


def test_image_network_export_matches_predict_proba(
    digits_semi, tmp_path, torch_single_thread
):
    X, y = digits_semi  # flat rows of 8x8 images: the input is (n, 1, 8, 8)
    clf = SemiSupervisedAssociationClassifier(
        network="mnist",
        input_shape=(8, 8),
        labeled_per_class=3,
        max_iter=20,
        device="cpu",
        # The ONNX graph computes in float32; "auto" may predict in bf16.
        precision="fp32",
        random_state=0,
    ).fit(X, y)
    assert clf.network_ == "mnist"
    path = export_onnx(clf, tmp_path / "digits.onnx")
    proba = _run(path, X.reshape(-1, 1, 8, 8))
    _assert_same_predictions(proba, clf, X, atol=1e-4)


def test_resized_images_agree_to_the_resize_difference(
    digits_semi, tmp_path, torch_single_thread
):
    if not export_module._uses_dynamo_exporter():
        pytest.skip("The TorchScript exporter cannot export an antialiased resize.")
    X, y = digits_semi
    clf = SemiSupervisedAssociationClassifier(
        input_shape=(8, 8),
        image_size=(12, 12),
        labeled_per_class=3,
        max_iter=20,
        device="cpu",
        # The ONNX graph computes in float32; "auto" may predict in bf16.
        precision="fp32",
        random_state=0,
    ).fit(X, y)
    proba = _run(export_onnx(clf, tmp_path / "resized.onnx"), X.reshape(-1, 1, 8, 8))
    # ONNX Runtime's antialiased resize differs from PyTorch's in the last
    # digits.
    _assert_same_predictions(proba, clf, X, atol=2e-3)


def test_resize_needs_the_dynamo_exporter(digits_semi, tmp_path, monkeypatch):
    X, y = digits_semi
    clf = SemiSupervisedAssociationClassifier(
        input_shape=(8, 8),
        image_size=(12, 12),
        labeled_per_class=3,
        max_iter=2,
        device="cpu",
    ).fit(X, y)
    # As with torch < 2.5, whose torch.onnx.export has no dynamo exporter.
    monkeypatch.setattr(export_module, "_uses_dynamo_exporter", lambda: False)
    with pytest.raises(ValueError, match="cannot export the antialiased resize"):
        export_onnx(clf, tmp_path / "resized.onnx")


def test_names_and_classes_are_in_the_file(blobs_semi, fast_params, tmp_path):
    X, y = blobs_semi
    labels = np.array(["ant", "bee", "cat"])
    y_str = np.where(y == -1, "-1", labels[np.maximum(y, 0)])
    clf = SemiSupervisedAssociationClassifier(**fast_params).fit(X, y_str)
    path = export_onnx(
        clf, str(tmp_path / "named.onnx"), input_name="x", output_name="p"
    )
    model = onnx.load(path)
    assert [i.name for i in model.graph.input] == ["x"]
    assert [o.name for o in model.graph.output] == ["p"]
    props = {p.key: p.value for p in model.metadata_props}
    assert json.loads(props["classes"]) == ["ant", "bee", "cat"]
    _assert_same_predictions(_run(path, X, "x"), clf, X, atol=1e-4)
    # One file, weights inside.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["named.onnx"]


def test_export_leaves_the_estimator_as_it_was(digits_semi, tmp_path):
    X, y = digits_semi
    clf = SemiSupervisedAssociationClassifier(
        input_shape=(8, 8), labeled_per_class=3, max_iter=5, device="cpu"
    ).fit(X, y)
    before = clf.predict_proba(X)
    model = clf.model_
    conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    channels_last = conv.weight.is_contiguous(memory_format=torch.channels_last)
    export_onnx(clf, tmp_path / "m.onnx")
    assert clf.model_ is model
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) == (
        channels_last
    )
    np.testing.assert_array_equal(clf.predict_proba(X), before)


def test_not_fitted(tmp_path):
    with pytest.raises(NotFittedError):
        export_onnx(SemiSupervisedAssociationClassifier(), tmp_path / "m.onnx")


class _Branching(nn.Module):
    """Branches on its input's values: not traceable into one graph."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 8)

    def forward(self, x):
        if x.sum() > 0:
            return self.linear(x)
        return -self.linear(x)


def test_custom_networks(blobs_semi, fast_params, tmp_path):
    X, y = blobs_semi
    params = {**fast_params, "max_iter": 5}
    traceable = nn.Sequential(nn.Linear(4, 16), nn.ELU(), nn.Linear(16, 8))
    clf = SemiSupervisedAssociationClassifier(**{**params, "network": traceable})
    clf.fit(X, y)
    path = export_onnx(clf, tmp_path / "custom.onnx")
    _assert_same_predictions(_run(path, X), clf, X, atol=1e-4)

    clf = SemiSupervisedAssociationClassifier(**{**params, "network": _Branching()})
    clf.fit(X, y)
    with pytest.raises(ValueError, match="custom network module could not be"):
        export_onnx(clf, tmp_path / "branching.onnx")


def test_missing_packages_are_named(blobs_semi, fast_params, tmp_path, monkeypatch):
    X, y = blobs_semi
    clf = SemiSupervisedAssociationClassifier(**{**fast_params, "max_iter": 2})
    clf.fit(X, y)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "onnx" else find_spec(name, *args),
    )
    with pytest.raises(ImportError, match="install onnx"):
        export_onnx(clf, tmp_path / "m.onnx")
