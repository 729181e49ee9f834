"""Tests of skassoc.export: ONNX export checked against predict_proba."""

import importlib.util
import json
import os
import stat

import numpy as np
import pytest
import torch
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch import nn

from skassoc import SemiSupervisedAssociationClassifier
from skassoc import export as export_module
from skassoc.export import export_onnx

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

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


@pytest.fixture
def tiny_clf(blobs_semi, fast_params):
    X, y = blobs_semi
    return SemiSupervisedAssociationClassifier(**{**fast_params, "max_iter": 2}).fit(
        X, y
    )


def _classes_of(path):
    model = onnx.load(str(path))
    return json.loads({p.key: p.value for p in model.metadata_props}["classes"])


def test_a_link_is_replaced_not_written_through(tiny_clf, tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_bytes(b"not yours")
    link = tmp_path / "model.onnx"
    link.symlink_to(target)
    export_onnx(tiny_clf, link)
    assert target.read_bytes() == b"not yours"
    assert not link.is_symlink()
    assert _classes_of(link) == [0, 1, 2]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        export_onnx(tiny_clf, tmp_path / "no such folder" / "model.onnx")


@pytest.fixture
def alarm():
    """Fail, rather than hang, a test that blocks for more than 30 seconds."""
    import signal

    def timeout(signum, frame):
        raise TimeoutError("export_onnx blocked")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_target_that_is_not_a_regular_file_is_refused(
    tiny_clf, tmp_path, alarm, make_special_file, kind
):
    path = tmp_path / "model.onnx"
    make_special_file(path, kind)
    with pytest.raises(ValueError, match="is not a regular file.*ONNX files are"):
        export_onnx(tiny_clf, path)
    assert os.path.exists(path) and not os.path.isfile(path)


def test_a_failed_export_leaves_the_old_file_whole(tiny_clf, tmp_path, monkeypatch):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"the previous model")

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    # Between the graph and its classes: where a crash used to leave a file
    # without them.
    monkeypatch.setattr(onnx.helper, "set_model_props", crash)
    with pytest.raises(KeyboardInterrupt):
        export_onnx(tiny_clf, path)
    assert path.read_bytes() == b"the previous model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
    monkeypatch.undo()
    export_onnx(tiny_clf, path)
    assert _classes_of(path) == [0, 1, 2]


@pytest.mark.skipif(fcntl is None, reason="needs POSIX file locks")
def test_a_crashed_exports_temporary_is_removed_and_a_live_one_kept(tiny_clf, tmp_path):
    # As save does: a temporary file nobody holds a lock on belongs to an
    # export that died; one that is locked is another export's, still running.
    path = tmp_path / "model.onnx"
    stale = tmp_path / "model.onnx.0123456789ab.skassoc-tmp"
    stale.write_bytes(b"half an export")
    live = tmp_path / "model.onnx.ba9876543210.skassoc-tmp"
    with open(live, "wb") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        export_onnx(tiny_clf, path)
        assert not stale.exists()
        assert live.exists()
    assert _classes_of(path) == [0, 1, 2]


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
def test_an_export_keeps_the_permissions_of_the_file_it_replaces(tiny_clf, tmp_path):
    # A private model stays private when it is exported again.
    path = tmp_path / "private.onnx"
    path.write_bytes(b"an older export")
    path.chmod(0o600)
    previous = os.umask(0o022)
    try:
        export_onnx(tiny_clf, path)
        # A new file gets the process's default (its umask).
        export_onnx(tiny_clf, tmp_path / "new.onnx")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "new.onnx").stat().st_mode) == 0o644
    assert _classes_of(path) == [0, 1, 2]


def test_an_opset_the_exporter_cannot_write_is_refused(tiny_clf, tmp_path):
    path = tmp_path / "model.onnx"
    with pytest.raises(ValueError, match="cannot write this model in opset 7"):
        export_onnx(tiny_clf, path, opset_version=7)
    assert not path.exists()
    for bad in (0, "18", 18.0):
        with pytest.raises((TypeError, ValueError), match="opset_version"):
            export_onnx(tiny_clf, path, opset_version=bad)


@pytest.mark.parametrize(
    "names, message",
    [
        (("x", "x"), "must differ"),
        (("", "p"), "input_name must be a non-empty string"),
        (("x", ""), "output_name must be a non-empty string"),
        ((3, "p"), "input_name must be an instance of str"),
        (("\ud800", "p"), "input_name must be text that UTF-8 can encode"),
        (("x", "ab\udfff"), "output_name .*character at index 2"),
    ],
)
def test_names_the_runtime_would_refuse_are_refused(tiny_clf, tmp_path, names, message):
    path = tmp_path / "model.onnx"
    input_name, output_name = names
    with pytest.raises((TypeError, ValueError), match=message):
        export_onnx(tiny_clf, path, input_name=input_name, output_name=output_name)
    assert not path.exists()


@pytest.mark.parametrize(
    "opset, error, message",
    [(True, TypeError, "not a bool"), (10**20, ValueError, "beyond opset")],
)
def test_an_opset_that_is_no_opset_is_refused_before_the_export(
    tiny_clf, tmp_path, monkeypatch, opset, error, message
):
    def exported(*args, **kwargs):
        raise AssertionError("exported before opset_version was checked")

    monkeypatch.setattr(export_module, "_export_to_memory", exported)
    with pytest.raises(error, match=message):
        export_onnx(tiny_clf, tmp_path / "model.onnx", opset_version=opset)


def test_names_that_values_inside_the_graph_have_can_be_given(
    tiny_clf, blobs_semi, tmp_path
):
    """A node's output or a weight that has the name asked for is renamed;
    ONNX Runtime loads the graph and computes the same probabilities."""
    X, _ = blobs_semi
    default = export_onnx(tiny_clf, tmp_path / "default.onnx")
    graph = onnx.load(default).graph
    node_output, weight = graph.node[0].output[0], graph.initializer[0].name
    expected = _run(default, X)
    for input_name, output_name in [(node_output, weight), (weight, node_output)]:
        path = export_onnx(
            tiny_clf,
            tmp_path / "m.onnx",
            input_name=input_name,
            output_name=output_name,
        )
        graph = onnx.load(path).graph
        assert [value.name for value in graph.input] == [input_name]
        assert [value.name for value in graph.output] == [output_name]
        np.testing.assert_array_equal(_run(path, X, input_name), expected)


def _graph_with_subgraphs():
    """input x -> div = x / two -> If(cond): div, else -div -> output out;
    the If's branches use ``div`` of the graph around them."""
    helper, FLOAT = onnx.helper, onnx.TensorProto.FLOAT

    def branch(name, op):
        outputs = [helper.make_tensor_value_info(name, FLOAT, None)]
        return helper.make_graph(
            [helper.make_node(op, ["div"], [name])], name, [], outputs
        )

    nodes = [
        helper.make_node("Div", ["x", "two"], ["div"]),
        helper.make_node(
            "If",
            ["cond"],
            ["out"],
            then_branch=branch("then_out", "Identity"),
            else_branch=branch("else_out", "Neg"),
        ),
    ]
    constants = [
        helper.make_tensor("two", FLOAT, [], [2.0]),
        helper.make_tensor("cond", onnx.TensorProto.BOOL, [], [True]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", FLOAT, [None, 2])],
        [helper.make_tensor_value_info("out", FLOAT, [None, 2])],
        initializer=constants,
    )
    opsets = [helper.make_opsetid("", 17)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


@pytest.mark.parametrize(
    "input_name, output_name",
    [("div", "then_out"), ("out", "x"), ("two", "cond"), ("else_out", "div_1")],
)
def test_renamed_values_are_renamed_in_subgraphs_too(input_name, output_name):
    model = _graph_with_subgraphs()
    export_module._name_input_and_output(model, input_name, output_name)
    onnx.checker.check_model(model)
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    assert [value.name for value in session.get_inputs()] == [input_name]
    assert [value.name for value in session.get_outputs()] == [output_name]
    x = np.array([[1.0, -3.0]], dtype=np.float32)
    (out,) = session.run(None, {input_name: x})
    np.testing.assert_array_equal(out, x / 2)


def test_pipelines_and_searches_are_refused_with_what_to_pass(
    blobs_semi, fast_params, tmp_path
):
    X, y = blobs_semi
    params = {**fast_params, "max_iter": 2}
    clf = SemiSupervisedAssociationClassifier(**params)
    pipeline = make_pipeline(StandardScaler(), clf).fit(X, y)
    with pytest.raises(TypeError, match=r"pipeline\[-1\].*\(standardscaler\)"):
        export_onnx(pipeline, tmp_path / "m.onnx")
    search = GridSearchCV(clf, {"visit_weight": [1.0]}, cv=2).fit(X, y)
    with pytest.raises(TypeError, match=r"not a GridSearchCV.*best_estimator_"):
        export_onnx(search, tmp_path / "m.onnx")
    with pytest.raises(TypeError, match="not a StandardScaler"):
        export_onnx(StandardScaler().fit(X), tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []
    # What the messages say to pass exports.
    export_onnx(pipeline[-1], tmp_path / "m.onnx")
    assert _classes_of(tmp_path / "m.onnx") == [0, 1, 2]
