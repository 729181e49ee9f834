"""Bad input and faults: clear errors before training, state kept on failure."""

import copy
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import types
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.model_selection import GridSearchCV, cross_validate
from sklearn.utils._param_validation import Interval, InvalidParameterError

import skassoc._classifier
import skassoc._engine._builtin
import skassoc._engine._device
import skassoc._engine._loop
import skassoc._engine._optim
import skassoc._engine._sampling
import skassoc._engine._step
from skassoc import SemiSupervisedAssociationClassifier
from skassoc._engine._loop import NonFiniteLossError
from skassoc._engine._optim import load_torch_dynamo
from skassoc._engine._optim import sigint_held_back as _sigint_held_back
from skassoc._params import SAFE_PARAMS
from skassoc._settings import _compile_options
from skassoc.model_selection import SemiSupervisedStratifiedKFold, labeled_scorer

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def make_clf(fast_params, **overrides):
    return SemiSupervisedAssociationClassifier(**{**fast_params, **overrides})


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if a training step runs."""

    def step(self):
        raise AssertionError("a training step ran before the input was rejected")

    monkeypatch.setattr(skassoc._engine._step.AssociationStep, "__call__", step)


@pytest.fixture
def interrupt_at(monkeypatch):
    """Make the step raise KeyboardInterrupt once, after ``k`` steps (of any fit)."""

    def install(k):
        original = skassoc._engine._step.AssociationStep.__call__
        calls = {"n": 0}

        def step(self):
            calls["n"] += 1
            if calls["n"] == k + 1:
                raise KeyboardInterrupt
            return original(self)

        monkeypatch.setattr(skassoc._engine._step.AssociationStep, "__call__", step)

    return install


def fitted_state(clf, X):
    """What a fitted estimator exposes, to compare before and after a refit."""
    return {
        "keys": set(vars(clf)),
        "proba": clf.predict_proba(X),
        "classes": clf.classes_.copy(),
        "n_features_in": clf.n_features_in_,
        "n_iter": clf.n_iter_,
        "history": copy.deepcopy(clf.history_),
        "weights": {k: v.clone() for k, v in clf.model_.state_dict().items()},
        "params": clf.get_params(),
    }


def assert_same_state(clf, X, before):
    after = fitted_state(clf, X)
    assert after["keys"] == before["keys"]
    np.testing.assert_array_equal(after["proba"], before["proba"])
    np.testing.assert_array_equal(after["classes"], before["classes"])
    assert after["n_features_in"] == before["n_features_in"]
    assert after["n_iter"] == before["n_iter"]
    assert after["history"] == before["history"]
    assert after["weights"].keys() == before["weights"].keys()
    for name, value in before["weights"].items():
        assert torch.equal(after["weights"][name], value), name
    assert after["params"] == before["params"]


def assert_unfitted(clf, params):
    fitted = [key for key in vars(clf) if key.endswith("_") and not key.startswith("_")]
    assert fitted == []
    assert clf.get_params() == params


# ------------------------------------------------- rejected before training


class NotTwoD(torch.nn.Module):
    """Returns (n, 2, 2) embeddings: not 2-D."""

    def forward(self, x):
        return x.reshape(len(x), 2, 2)


def _bad_fit_cases():
    rng = np.random.RandomState(0)
    X = rng.rand(40, 4)
    y = np.arange(40) % 2
    nan_X = X.copy()
    nan_X[3, 1] = np.nan
    inf_X = X.copy()
    inf_X[5, 2] = np.inf
    return [
        pytest.param(nan_X, y, {}, "NaN", id="nan"),
        pytest.param(inf_X, y, {}, "infinity", id="inf"),
        pytest.param(X * 1e300, y, {}, "float32", id="beyond_float32"),
        pytest.param(X, np.full(40, -1), {}, "Every label in y is -1", id="all_-1"),
        pytest.param(
            X, np.where(y == 0, 0, -1), {}, r"only one class \(0\)", id="one_class"
        ),
        pytest.param(X, y[:-1], {}, "inconsistent numbers of samples", id="lengths"),
        pytest.param(X, np.c_[y, y], {}, "1d array", id="y_2d"),
        pytest.param(X + 1j, y, {}, "Complex data", id="complex"),
        pytest.param(X[:0], y[:0], {}, "0 sample", id="empty"),
        pytest.param(np.zeros((0, 8, 8)), y[:0], {}, "0 sample", id="empty_images"),
        pytest.param(
            np.array([["a", "b", "c", "d"]] * 40), y, {}, "string", id="strings"
        ),
        pytest.param(
            np.array([["a", "b", "c", "d"]] * 40, dtype=object),
            y,
            {},
            "could not convert",
            id="object_strings",
        ),
        pytest.param(X, y, {"input_shape": (3, 3)}, "input_shape", id="input_shape"),
        pytest.param(X, y, {"input_shape": (0, 4)}, "positive", id="input_shape_0"),
        pytest.param(
            X, y, {"input_shape": (1, 2, 2, 1)}, "input_shape", id="input_shape_4d"
        ),
        pytest.param(
            rng.rand(40, 8, 8), y, {"input_shape": (4, 16)}, "input_shape", id="both"
        ),
        pytest.param(X, y, {"network": NotTwoD()}, "embedding_dim", id="module_3d"),
        pytest.param(
            X,
            y,
            {
                "network": torch.nn.Sequential(
                    torch.nn.Linear(4, 1), torch.nn.Flatten(0)
                )
            },
            "embedding_dim",
            id="module_1d",
        ),
        pytest.param(
            X, y, {"network": "mnist"}, "needs image inputs", id="mnist_on_rows"
        ),
        pytest.param(
            rng.rand(40, 4, 4), y, {"network": "mnist"}, "at least 8x8", id="tiny"
        ),
        pytest.param(rng.rand(40, 1, 1, 2, 2), y, {}, "dimensions", id="5d"),
        pytest.param(X, y, {"device": "tpu"}, "device", id="unknown_device"),
        pytest.param(
            X,
            np.array(["a", 2] + [1, -1] * 19, dtype=object),
            {},
            "all strings or all numbers",
            id="mixed_label_types",
        ),
        pytest.param(
            X,
            np.array([0, "a", 1, "b", -1] * 8, dtype=object),
            {},
            "all strings or all numbers",
            id="mixed_label_types_number_first",
        ),
        pytest.param(X, np.array([b"a", b"b"] * 20), {}, "bytes", id="bytes_labels"),
        *(
            pytest.param(
                X,
                y,
                {"hidden_layer_sizes": sizes},
                r"hidden_layer_sizes must hold positive ints",
                id=f"hidden_layer_sizes_{sizes}",
            )
            for sizes in [(-5,), (0,), (16.5,), (True,), (8, "8")]
        ),
        *(
            pytest.param(
                X,
                y,
                {"input_shape": shape},
                "input_shape must be",
                id=f"input_shape_{shape}",
            )
            for shape in [(2.5, 2), ("2", "2"), (True, 2, 2), (2, None)]
        ),
        pytest.param(
            rng.rand(40, 8, 8), y, {"image_size": True}, "[Gg]ot True", id="image_size"
        ),
        pytest.param(
            X,
            y,
            {"network": torch.nn.Sequential(torch.nn.Linear(5, 4))},
            r"shape \(n, 4\) .*mat1 and mat2 .*in_features=4",
            id="module_first_linear_too_wide",
        ),
        pytest.param(
            rng.rand(40, 8, 8),
            y,
            {"network": "auto", "image_size": 2**16},
            r"network needs at least [\d,.]+ GiB .* Lower image_size or "
            "embedding_dim",
            id="image_size_beyond_memory",
        ),
        *(
            pytest.param(
                rng.rand(40, 8, 8),
                y,
                {"network": "mnist", "augmentation": augmentation},
                match,
                id=f"augmentation_{augmentation}",
            )
            for augmentation, match in [
                ({"affine_std": "0.1"}, r"'affine_std'\] must be a finite number"),
                ({"affine_std": None}, r"'affine_std'\] must be a finite number"),
                ({"translate_std": np.inf}, r"'translate_std'\] must be a finite"),
                ({"blur_sigma": 0}, r"blur_sigma'\] must be > 0"),
                (
                    {"elastic_alpha": 34, "elastic_sigma": 0},
                    r"elastic_sigma'\] must be > 0",
                ),
            ]
        ),
        pytest.param(
            rng.rand(40, 3, 3),
            y,
            {"network": "mlp", "augmentation": "paper"},
            "at least 4x4 pixels",
            id="blur_on_3x3_images",
        ),
    ]


@pytest.mark.parametrize("X, y, params, match", _bad_fit_cases())
def test_bad_input_rejected_before_training(
    fast_params, no_training, X, y, params, match
):
    clf = make_clf(fast_params, **params)
    expected_params = clf.get_params()
    with pytest.raises((ValueError, TypeError), match=match):
        clf.fit(X, y)
    assert_unfitted(clf, expected_params)


@pytest.mark.parametrize(
    "name, value",
    [
        ("logit_weight", 1e39),
        ("walker_weight", 1e7),
        ("visit_weight", np.inf),
        ("consistency_weight", 1e7),
        ("balance_weight", 1e7),
        ("l2_scale", 1e39),
        ("tol", 1e39),
        ("learning_rate", 1e39),
        ("embedding_dim", 10**9),
        ("image_size", 10**6),
        ("labeled_per_class", True),
        ("unlabeled_batch_size", True),
        ("max_iter", True),
    ],
)
def test_out_of_range_parameter_rejected_before_training(
    fast_params, blobs, no_training, name, value
):
    X, y = blobs
    clf = make_clf(fast_params, **{name: value})
    with pytest.raises(InvalidParameterError, match=f"'{name}' parameter .* range"):
        clf.fit(X, y)
    assert_unfitted(clf, clf.get_params())


@pytest.mark.parametrize(
    "name",
    [
        "walker_weight",
        "visit_weight",
        "logit_weight",
        "consistency_weight",
        "balance_weight",
        "l2_scale",
        "tol",
        "embedding_dim",
        "image_size",
    ],
)
def test_parameter_bounds_are_the_model_files(name):
    """What fits can be saved: the estimator's bound is the model file's."""
    constraints = SemiSupervisedAssociationClassifier._parameter_constraints[name]
    interval = next(c for c in constraints if isinstance(c, Interval))
    assert SAFE_PARAMS[name](interval.right)
    assert not SAFE_PARAMS[name](interval.right * 2)
    assert not interval.is_satisfied_by(interval.right * 2)


def test_network_beyond_free_memory_rejected_before_it_is_built(
    fast_params, blobs, no_training, monkeypatch
):
    X, y = blobs
    monkeypatch.setattr(skassoc._classifier, "available_memory_bytes", lambda d: 2**20)
    clf = make_clf(fast_params, hidden_layer_sizes=(1024, 1024))
    with pytest.raises(
        ValueError, match=r"[\d,]+ parameters .*1.0 MiB .* hidden_layer_sizes"
    ):
        clf.fit(X, y)
    assert_unfitted(clf, clf.get_params())


@pytest.mark.parametrize(
    "X_val, y_val, match",
    [
        ("X", None, "X_val and y_val go together"),
        (None, "y", "X_val and y_val go together"),
        ("X", "y_with_unlabeled", r"marks 1 of its samples as unlabeled \(-1\)"),
        ("X", "y_unknown_label", r"no labeled sample of y has: \[7\]"),
        ("X", "y_as_strings", "no labeled sample of y has"),
        ("X", "y_mixed", "all strings or all numbers"),
        ("X", "y_short", "inconsistent numbers of samples"),
        (
            "X_five_features",
            "y",
            "X_val does not fit the training inputs X: .*5 features",
        ),
        ("X_empty", "y_empty", "0 sample"),
    ],
)
def test_bad_validation_set_rejected_before_training(
    fast_params, blobs, no_training, X_val, y_val, match
):
    X, y = blobs
    X_val = {
        None: None,
        "X": X[:20],
        "X_five_features": np.hstack([X[:20], X[:20, :1]]),
        "X_empty": X[:0],
    }[X_val]
    y_val = {
        None: None,
        "y": y[:20],
        "y_with_unlabeled": np.where(np.arange(20) == 3, -1, y[:20]),
        "y_unknown_label": np.where(np.arange(20) == 3, 7, y[:20]),
        "y_as_strings": y[:20].astype(str),
        "y_mixed": np.array(["a", *y[1:20]], dtype=object),
        "y_short": y[:19],
        "y_empty": y[:0],
    }[y_val]
    clf = make_clf(fast_params)
    expected_params = clf.get_params()
    with pytest.raises(ValueError, match=match):
        clf.fit(X, y, X_val=X_val, y_val=y_val)
    assert_unfitted(clf, expected_params)


def test_unknown_compile_option_rejected_before_training(
    fast_params, blobs, no_training
):
    X, y = blobs
    clf = make_clf(fast_params, compile={"mode": "default", "fuse_all": True})
    with pytest.raises(ValueError, match=r"unknown keys \['fuse_all'\]"):
        clf.fit(X, y)
    assert_unfitted(clf, clf.get_params())


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_compile_modes_with_graphs_of_their_own_need_no_cuda_graph(fast_params, mode):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")

    def options(device, **params):
        clf = make_clf(fast_params, **params)
        return _compile_options(clf.compile, clf.cuda_graph, device)

    with pytest.raises(ValueError, match="captures CUDA graphs of its own"):
        options(cuda, compile={"mode": mode})
    # Without skassoc's graph (or on a CPU), the mode is torch.compile's to run.
    assert options(cuda, compile={"mode": mode}, cuda_graph=False) == {"mode": mode}
    assert options(cpu, compile={"mode": mode}) == {"mode": mode}
    assert options(cuda, compile=True) == {}
    assert options(cuda) is None
    graphs = {"options": {"triton.cudagraphs": True}}
    with pytest.raises(ValueError, match="option 'triton.cudagraphs' captures"):
        options(cuda, compile=graphs)
    both = {"mode": "default", "options": {"max_autotune": True}}
    with pytest.raises(ValueError, match="'mode' or 'options', not both"):
        options(cpu, compile=both)
    # NumPy booleans pass parameter validation, and mean what they say.
    assert options(cuda, compile=np.True_) == {}
    assert options(cuda, compile=np.False_) is None


@pytest.mark.parametrize(
    "unlabeled_batch_size, consistency_weight, warns",
    [(4100, 0.0, True), (2050, 0.0, False), (2050, 1.0, True)],
)
def test_compile_warns_when_the_batch_is_embedded_in_chunks(
    fast_params, digits_images, unlabeled_batch_size, consistency_weight, warns
):
    # Chunks hold 4,096 images. 20 labeled and 2,050 unlabeled images fit in
    # one; with the second view of the consistency loss, 4,120 do not.
    X, y = digits_images
    clf = make_clf(
        fast_params,
        network="mnist",
        max_iter=1,
        labeled_per_class=2,
        unlabeled_batch_size=unlabeled_batch_size,
        compile={"backend": "eager"},
        augmentation={"blur_probability": 0.0, "unlabeled": False},
        consistency_weight=consistency_weight,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clf.fit(X, np.where(np.arange(len(y)) % 2 == 0, y, -1))
    messages = [str(warning.message) for warning in caught]
    assert any("compile has no effect on this fit" in m for m in messages) == warns


def test_cuda_requested_without_cuda(fast_params, blobs, no_training, monkeypatch):
    X, y = blobs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    clf = make_clf(fast_params, device="cuda")
    with pytest.raises(ValueError, match="CUDA is not available"):
        clf.fit(X, y)
    assert not hasattr(clf, "n_features_in_")


@pytest.mark.parametrize(
    "param, value",
    [
        ("walker_weight", -1.0),
        ("visit_weight", -0.5),
        ("max_iter", 0),
        ("labeled_per_class", 0),
        ("unlabeled_batch_size", 0),
        ("learning_rate", 0.0),
        ("lr_decay", 0.0),
        ("embedding_dim", 0),
        ("network", "resnet"),
        ("precision", "fp8"),
        ("device", 3),
    ],
)
def test_invalid_params(fast_params, blobs, no_training, param, value):
    X, y = blobs
    clf = make_clf(fast_params, **{param: value})
    with pytest.raises(InvalidParameterError, match=f"'{param}' parameter"):
        clf.fit(X, y)
    assert not hasattr(clf, "n_features_in_")


def test_predict_with_wrong_number_of_features(labeled_params, blobs):
    X, y = blobs
    clf = make_clf(labeled_params, max_iter=3).fit(X, y)
    with pytest.raises(ValueError, match="X has 5 features.*expecting 4 features"):
        clf.predict(np.hstack([X, X[:, :1]]))
    with pytest.raises(ValueError, match="X has 3 features"):
        clf.transform(X[:, :3])


def test_predict_images_with_wrong_number_of_pixels(labeled_params, digits_images):
    X, y = digits_images
    clf = make_clf(labeled_params, network="auto", max_iter=2).fit(X, y)
    with pytest.raises(ValueError, match="81 features.*expecting 64"):
        clf.predict(np.zeros((3, 9, 9)))


@pytest.mark.parametrize("shape", [(4, 16), (2, 8, 4), (64, 1, 1)])
def test_predict_images_with_wrong_shape(labeled_params, digits_images, shape):
    X, y = digits_images
    clf = make_clf(labeled_params, network="auto", max_iter=2).fit(X, y)
    with pytest.raises(ValueError, match=r"shape.*\(1, 8, 8\)"):
        clf.predict(X.reshape(len(X), *shape))


def test_predict_images_on_feature_model(labeled_params, blobs):
    X, y = blobs
    clf = make_clf(labeled_params, max_iter=2).fit(X, y)
    with pytest.raises(ValueError, match="feature rows"):
        clf.predict(X.reshape(len(X), 2, 2))


def test_predict_before_fit(fast_params, blobs):
    from sklearn.exceptions import NotFittedError

    X, _ = blobs
    with pytest.raises(NotFittedError):
        make_clf(fast_params).predict(X)


def test_features_constant_in_float32_warn(
    labeled_params, blobs, tmp_path, write_memmap
):
    # An offset of 1e8 leaves float32 steps of 8: a spread of 0.1 vanishes.
    X, y = blobs
    X = np.array(X, dtype=np.float64)
    X[:, 2] = 1e8 + 0.1 * np.random.default_rng(0).normal(size=len(X))
    for data in (X, write_memmap(tmp_path / "x.npy", X)):
        with pytest.warns(UserWarning, match=r"1 feature\(s\) of X \(e.g. index 2\)"):
            make_clf(labeled_params, max_iter=2).fit(data, y)
    X[:, 2] -= 1e8
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*rounded to float32")
        make_clf(labeled_params, max_iter=2).fit(X, y)


def test_small_class_warns_once(fast_params, blobs):
    X, y = blobs
    y = np.where(np.arange(len(y)) < 140, y, -1)
    y[np.flatnonzero(y == 2)[2:]] = -1  # class 2 keeps 2 labels
    clf = make_clf(fast_params, labeled_per_class=5, max_iter=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clf.fit(X, y)
    messages = [str(w.message) for w in caught if w.category is UserWarning]
    assert sum("fewer than" in m for m in messages) == 1, messages
    assert clf.n_iter_ == 10
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    assert set(clf.predict(X)) <= {0, 1, 2}


# ----------------------------------------------- failed fit leaves no trace


@pytest.mark.parametrize(
    "bad_X, bad_y, match",
    [
        (None, "all_unlabeled", "Every label"),
        (None, "one_class", "only one class"),
        ("five_features_nan", None, "NaN"),
        ("strings", None, "string"),
    ],
)
def test_failed_refit_keeps_previous_fit(labeled_params, blobs, bad_X, bad_y, match):
    X, y = blobs
    clf = make_clf(labeled_params, max_iter=20).fit(X, y)
    before = fitted_state(clf, X)
    X_bad = {
        None: X,
        "five_features_nan": np.hstack([X, np.full((len(X), 1), np.nan)]),
        "strings": np.full(X.shape, "x"),
    }[bad_X]
    y_bad = {None: y, "all_unlabeled": np.full_like(y, -1), "one_class": y * 0}[bad_y]
    with pytest.raises((ValueError, TypeError), match=match):
        clf.fit(X_bad, y_bad)
    assert_same_state(clf, X, before)


def test_failed_refit_keeps_feature_names(labeled_params, blobs):
    import pandas as pd

    X, y = blobs
    df = pd.DataFrame(X, columns=list("abcd"))
    clf = make_clf(labeled_params, max_iter=5).fit(df, y)
    with pytest.raises(ValueError, match="Every label"):
        clf.fit(X, np.full_like(y, -1))  # no feature names, and bad y
    np.testing.assert_array_equal(clf.feature_names_in_, list("abcd"))
    clf.predict(df)  # no feature-name warning or error


# ----------------------------------------------------------------- divergence


def _unnormalised_module():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8))


@pytest.mark.parametrize(
    "scale, params",
    [
        (1e30, {"network": "custom"}),
        (1.0, {"network": "custom", "learning_rate": 1e30}),
        (1.0, {"learning_rate": 1e30}),  # the MLP, standardised inputs
    ],
    ids=["huge_inputs", "huge_lr_custom", "huge_lr_mlp"],
)
def test_divergence_raises_and_keeps_unfitted(labeled_params, blobs, scale, params):
    X, y = blobs
    if params.get("network") == "custom":
        params = {**params, "network": _unnormalised_module()}
    clf = make_clf(labeled_params, **params)
    expected_params = clf.get_params()
    with pytest.raises(FloatingPointError, match=r"at step \d+") as info:
        clf.fit(X * scale, y)
    assert isinstance(info.value, NonFiniteLossError)
    assert "NaN or infinite" in str(info.value)
    assert_unfitted(clf, expected_params)


def test_divergence_on_warm_start_keeps_previous_fit(labeled_params, blobs):
    X, y = blobs
    clf = make_clf(labeled_params, network=_unnormalised_module(), warm_start=True)
    clf.fit(X, y)
    before = fitted_state(clf, X)
    with pytest.raises(FloatingPointError, match=r"step \d+"):
        clf.fit(X * 1e30, y)
    assert_same_state(clf, X, before)
    clf.set_params(learning_rate=1e30)
    before["params"]["learning_rate"] = 1e30
    with pytest.raises(FloatingPointError, match=r"step \d+"):
        clf.fit(X, y)
    assert_same_state(clf, X, before)


def test_failure_inside_training_keeps_previous_fit(labeled_params, blobs, monkeypatch):
    X, y = blobs
    clf = make_clf(labeled_params, warm_start=True, max_iter=20).fit(X, y)
    before = fitted_state(clf, X)
    original = skassoc._engine._step.AssociationStep.__call__
    calls = {"n": 0}

    def failing_step(self):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("simulated out of memory")
        return original(self)

    monkeypatch.setattr(skassoc._engine._step.AssociationStep, "__call__", failing_step)
    with pytest.raises(RuntimeError, match="simulated"):
        clf.fit(X, y)
    assert_same_state(clf, X, before)


# --------------------------------------------------------- KeyboardInterrupt


@pytest.mark.parametrize("k", [7, 25])
def test_keyboard_interrupt_keeps_partial_model_and_raises(
    labeled_params, blobs, interrupt_at, k
):
    X, y = blobs
    interrupt_at(k)
    clf = make_clf(labeled_params, max_iter=50)
    with pytest.raises(KeyboardInterrupt, match=f"interrupted after {k} of 50"):
        clf.fit(X, y)
    assert clf.n_iter_ == k
    # The losses of the completed steps are kept (logged every 10 steps).
    assert clf.history_["step"][-1] == k
    assert all(step <= k for step in clf.history_["step"])
    assert np.isfinite(clf.history_["total"]).all()
    proba = clf.predict_proba(X)
    assert np.isfinite(proba).all()
    assert clf.predict(X).shape == (len(X),)
    assert not clf.model_.training


def test_keyboard_interrupt_after_divergence_raises(
    labeled_params, blobs, interrupt_at
):
    X, y = blobs
    interrupt_at(3)  # before the first loss read-back (every 10 steps)
    clf = make_clf(labeled_params, network=_unnormalised_module(), max_iter=50)
    expected_params = clf.get_params()
    with pytest.raises(FloatingPointError, match=r"step \d+"):
        clf.fit(X * 1e30, y)
    assert_unfitted(clf, expected_params)


def test_keyboard_interrupt_outside_training_propagates(
    labeled_params, blobs, monkeypatch
):
    """An interrupt before training leaves the previous fit as it was."""
    X, y = blobs
    clf = make_clf(labeled_params, max_iter=5).fit(X, y)
    before = fitted_state(clf, X)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(
        skassoc._engine._sampling.AssociationBatchSampler, "__init__", interrupted
    )
    with pytest.raises(KeyboardInterrupt):
        clf.fit(X * 2, y)
    assert_same_state(clf, X, before)


@pytest.mark.parametrize("search", ["GridSearchCV", "cross_validate"])
def test_keyboard_interrupt_stops_a_search(
    fast_params, blobs_semi, interrupt_at, search
):
    """One Ctrl-C ends the search: no truncated fit is scored as finished."""
    X, y = blobs_semi
    clf = make_clf(fast_params, max_iter=20)
    cv, scoring = SemiSupervisedStratifiedKFold(2), labeled_scorer()
    interrupt_at(5)
    with pytest.raises(KeyboardInterrupt, match="interrupted after 5 of 20"):
        if search == "GridSearchCV":
            grid = {"visit_weight": [0.5, 1.0]}
            GridSearchCV(clf, grid, cv=cv, scoring=scoring).fit(X, y)
        else:
            cross_validate(clf, X, y, cv=cv, scoring=scoring)


def test_sigint_during_a_block_is_delivered_when_it_ends():
    handler = signal.getsignal(signal.SIGINT)
    ran = []
    with pytest.raises(KeyboardInterrupt):
        with _sigint_held_back():
            signal.raise_signal(signal.SIGINT)
            ran.append("the rest of the block")
    assert ran == ["the rest of the block"]
    assert signal.getsignal(signal.SIGINT) is handler


def _fit_interrupted_at_line(clf, X, y, code, line):
    """Fit ``clf``, raising KeyboardInterrupt the first time ``code`` runs
    ``line``; whether it was reached."""
    reached = []

    def at_line(frame, event, arg):
        if event == "line" and frame.f_lineno == line:
            sys.settrace(previous)
            frame.f_trace = None
            reached.append(line)
            raise KeyboardInterrupt
        return at_line

    def on_call(frame, event, arg):
        return at_line if frame.f_code is code else None

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        clf.fit(X, y, X_val=X[:30], y_val=y[:30])
    except KeyboardInterrupt:
        assert reached
    finally:
        sys.settrace(previous)
    return bool(reached)


def _assert_whole_history(clf):
    history = clf.history_
    losses = {k: v for k, v in history.items() if not k.startswith("validation")}
    assert len({len(v) for v in losses.values()}) == 1, losses
    assert len(history["validation_step"]) == len(history["validation_score"])
    for steps in (history["step"], history["validation_step"]):
        assert steps == sorted(set(steps)), history
    assert history["step"][-1] == clf.n_iter_, history
    assert all(value > 0 for value in history["total"]), history


@pytest.mark.parametrize(
    "function",
    [
        skassoc._engine._loop._Loop._log,
        skassoc._engine._builtin.append_entry,
        skassoc._engine._builtin.History.on_log,
        skassoc._engine._builtin.Validation.on_log,
    ],
)
def test_keyboard_interrupt_at_any_line_of_logging_keeps_history_whole(
    labeled_params, blobs, function
):
    """An interrupt while the history is written leaves every entry whole,
    once: no step twice (with zero losses), no lists of unequal lengths."""
    X, y = blobs
    code = function.__code__
    lines = sorted({line for _, _, line in code.co_lines() if line is not None})
    reached = 0
    for line in lines:
        clf = make_clf(labeled_params, max_iter=10, validation_interval=5)
        if _fit_interrupted_at_line(clf, X, y, code, line):
            reached += 1
            _assert_whole_history(clf)
    # All but the lines of error handling and early returns.
    assert reached >= len(lines) // 2


def test_keyboard_interrupt_during_validation_keeps_best_weights_and_score(
    labeled_params, blobs, monkeypatch
):
    """A Ctrl-C that comes while the best weights are kept is delivered once
    their score is in the history."""
    X, y = blobs
    original = skassoc._engine._builtin.BestWeights.update

    def update_then_interrupt(self, score, step):
        stop = original(self, score, step)
        signal.raise_signal(signal.SIGINT)
        return stop

    monkeypatch.setattr(
        skassoc._engine._builtin.BestWeights, "update", update_then_interrupt
    )
    clf = make_clf(
        labeled_params, max_iter=10, validation_interval=5, early_stopping=True
    )
    with pytest.raises(KeyboardInterrupt, match=r"best-scoring weights \(step 5\)"):
        clf.fit(X, y, X_val=X[:30], y_val=y[:30])
    assert clf.history_["validation_step"] == [5]
    assert clf.best_validation_score_ == clf.history_["validation_score"][0]
    _assert_whole_history(clf)


def _without_torch_dynamo(monkeypatch, error):
    """sys.modules as before torch._dynamo's first import, whose attempt
    raises ``error``."""
    for name in list(sys.modules):
        if name == "torch._dynamo" or name.startswith(("torch._dynamo.", "sympy")):
            monkeypatch.delitem(sys.modules, name)

    def failing_import(name):
        raise error

    monkeypatch.setattr(
        skassoc._engine._optim.importlib, "import_module", failing_import
    )


def test_a_half_imported_torch_dynamo_gives_a_clear_error(monkeypatch):
    _without_torch_dynamo(
        monkeypatch, AttributeError("module 'sympy' has no attribute 'printing'")
    )
    # What an interrupted import leaves: a submodule without its package.
    leftover = types.ModuleType("sympy.printing")
    monkeypatch.setitem(sys.modules, "sympy.printing", leftover)
    with pytest.raises(RuntimeError, match=r"interrupted.*sympy\.printing.*Restart"):
        load_torch_dynamo()


def test_a_torch_dynamo_import_failing_otherwise_keeps_its_own_error(monkeypatch):
    _without_torch_dynamo(monkeypatch, ImportError("No module named 'missing_dep'"))
    with pytest.raises(ImportError, match="missing_dep"):
        load_torch_dynamo()


# A Ctrl-C in the middle of torch's lazy import of sympy, as a first fit
# triggers it; without the hold-back, every later fit of the process fails.
_INTERRUPTED_FIRST_FIT = textwrap.dedent(
    """
    import importlib.abc, signal, sys
    import numpy as np
    from skassoc import SemiSupervisedAssociationClassifier

    class InterruptSympy(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "sympy.printing":
                sys.meta_path.remove(self)
                signal.raise_signal(signal.SIGINT)

    assert "torch._dynamo" not in sys.modules
    rng = np.random.RandomState(0)
    X, y = rng.rand(40, 3), np.repeat([0, 1, -1, -1], 10)
    params = dict(network="mlp", max_iter=3, device="cpu", random_state=0)
    sys.meta_path.insert(0, InterruptSympy())
    try:
        SemiSupervisedAssociationClassifier(**params).fit(X, y)
    except KeyboardInterrupt:
        pass
    assert not any(isinstance(f, InterruptSympy) for f in sys.meta_path)
    SemiSupervisedAssociationClassifier(**params).fit(X, y)
    print("second fit ok")
    """
)


def test_keyboard_interrupt_during_the_first_fits_imports_spares_later_fits():
    result = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_FIRST_FIT],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "second fit ok" in result.stdout


# ---------------------------------------------------------------- warm start


def test_warm_start_continues_training(fast_params, blobs_semi):
    X, y = blobs_semi
    params = dict(max_iter=60)
    fresh = make_clf(fast_params, **params).fit(X, y)
    # The classification loss: the total also holds the visit loss, which
    # starts and stays near its floor log(unlabeled_batch_size).
    first_fresh, last_fresh = fresh.history_["logit"][0], fresh.history_["logit"][-1]
    assert last_fresh < 0.7 * first_fresh  # the first fit did learn

    clf = make_clf(fast_params, **params, warm_start=True).fit(X, y)
    np.testing.assert_array_equal(clf.history_["total"], fresh.history_["total"])
    weights_after_first = {k: v.clone() for k, v in clf.model_.state_dict().items()}
    clf.fit(X, y)
    first_warm = clf.history_["logit"][0]
    # Starts about where the first fit ended, far below a fresh start.
    assert first_warm < last_fresh + 0.25 * (first_fresh - last_fresh)
    assert clf.history_["total"][0] < fresh.history_["total"][0]
    assert clf.n_iter_ == 60
    # The model kept training: its weights moved on from the first fit's.
    moved = [
        not torch.equal(clf.model_.state_dict()[k], v)
        for k, v in weights_after_first.items()
        if v.is_floating_point()
        and k not in ("embedder.mean", "embedder.scale", "embedder.clip")
    ]
    assert all(moved)

    # warm_start=False starts over: the same curve as the fresh fit.
    clf.set_params(warm_start=False).fit(X, y)
    np.testing.assert_array_equal(clf.history_["total"], fresh.history_["total"])


def test_warm_start_with_other_classes_raises(labeled_params, blobs):
    X, y = blobs
    clf = make_clf(labeled_params, warm_start=True, max_iter=10).fit(X, y)
    before = fitted_state(clf, X)
    with pytest.raises(ValueError, match="needs the classes of the previous fit"):
        clf.fit(X, np.where(y == 2, 1, y))
    assert_same_state(clf, X, before)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"embedding_dim": 4}, "embedding_dim: 8 -> 4"),
        ({"hidden_layer_sizes": (8,)}, r"hidden_layer_sizes: \(16,\) -> \(8,\)"),
        ({"network": "auto"}, None),  # "auto" picks the MLP again: allowed
        ({"network": torch.nn.Linear(4, 8)}, "network: 'mlp' -> 'a module'"),
    ],
)
def test_warm_start_with_another_network_raises(labeled_params, blobs, change, match):
    X, y = blobs
    clf = make_clf(labeled_params, warm_start=True, max_iter=10).fit(X, y)
    if match is None:
        # Allowed, and it continues from the fitted network like an
        # unchanged warm start does.
        unchanged = copy.deepcopy(clf).fit(X, y)
        clf.set_params(**change).fit(X, y)
        np.testing.assert_array_equal(clf.predict_proba(X), unchanged.predict_proba(X))
        return
    clf.set_params(**change)
    before = fitted_state(clf, X)
    with pytest.raises(ValueError, match=match):
        clf.fit(X, y)
    assert_same_state(clf, X, before)


def test_warm_start_with_another_image_format_raises(labeled_params, digits_images):
    X, y = digits_images
    clf = make_clf(labeled_params, network="mnist", warm_start=True, max_iter=3)
    clf.fit(X, y).set_params(image_size=10)
    before = fitted_state(clf, X)
    with pytest.raises(ValueError, match=r"image_size: None -> \(10, 10\)"):
        clf.fit(X, y)
    assert_same_state(clf, X, before)


def test_channels_last_images_warn(labeled_params):
    rng = np.random.RandomState(0)
    X = rng.randint(0, 255, size=(40, 12, 12, 3)).astype(np.uint8)
    y = np.arange(40) % 2
    with pytest.warns(UserWarning, match=r"np.moveaxis\(X, -1, 1\)"):
        make_clf(labeled_params, max_iter=2).fit(X, y)


def test_warm_start_with_other_features_raises(labeled_params, blobs):
    X, y = blobs
    clf = make_clf(labeled_params, warm_start=True, max_iter=10).fit(X, y)
    before = fitted_state(clf, X)
    with pytest.raises(ValueError, match="warm_start"):
        clf.fit(np.hstack([X, X[:, :1]]), y)
    assert_same_state(clf, X, before)


# ------------------------------------------------------------- memory, threads


@pytest.mark.parametrize("max_iter", [1, 2, 3])
def test_short_runs_record_and_check_their_losses(labeled_params, blobs, max_iter):
    X, y = blobs
    clf = make_clf(labeled_params, max_iter=max_iter, lr_decay_steps=1).fit(X, y)
    assert clf.history_["step"] == [max_iter]
    # The rate of the last step run, decayed after each step before it.
    last_rate = labeled_params["learning_rate"] * 0.33 ** (max_iter - 1)
    assert clf.history_["learning_rate"] == [pytest.approx(last_rate)]
    if max_iter == 1:
        return  # the losses of step 1 come before any update
    diverging = make_clf(labeled_params, max_iter=max_iter, learning_rate=1e30)
    with pytest.raises(FloatingPointError, match="step"):
        diverging.fit(X.astype(np.float32) * 1e36, y)


def test_overlapping_precision_contexts_restore_the_callers_flags():
    # Fits in threads enter and leave in any order; the process-wide TF32 and
    # cuDNN flags must come back to the caller's, not to another fit's.
    cuda = torch.device("cuda")  # the flags need no GPU to be set and read

    def flags():
        return (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.benchmark,
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.allow_tf32,
        )

    saved = flags()
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.allow_tf32 = False
        caller = flags()
        first = skassoc._engine._device.precision_context(cuda, "fp32")
        second = skassoc._engine._device.precision_context(cuda, "tf32")
        first.__enter__()
        assert flags() == (False, True, False, False)
        second.__enter__()
        assert flags() == (True, True, False, True)
        first.__exit__(None, None, None)
        assert flags() == (True, True, False, True)  # the second fit runs on
        second.__exit__(None, None, None)
        assert flags() == caller
    finally:
        (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.benchmark,
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.allow_tf32,
        ) = saved


def test_precision_context_works_with_frozen_torch_flags(monkeypatch):
    # torch.backends.disable_global_flags() forbids assigning cuDNN flags
    # (PyTorch's own test suites use it); fits must still run there.
    cuda = torch.device("cuda")
    before = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32)
    # What disable_global_flags() sets, undone after the test.
    flags_module_globals = torch.backends.flags_frozen.__globals__
    monkeypatch.setitem(
        flags_module_globals, "__allow_nonbracketed_mutation_flag", False
    )
    assert torch.backends.flags_frozen()
    with skassoc._engine._device.precision_context(cuda, "fp32"):
        assert torch.backends.cudnn.benchmark
        assert not torch.backends.cudnn.allow_tf32
    assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32) == before


def _stand_in_streams(monkeypatch):
    """torch.cuda.Stream and current_device without a GPU; returns the made."""
    made = []

    def stream(device=None):
        made.append(object())
        return made[-1]

    monkeypatch.setattr(torch.cuda, "Stream", stream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(skassoc._engine._device, "_STREAM_SETS", {})
    return made


def test_concurrent_cuda_fits_never_share_streams(monkeypatch):
    # torch.cuda.Stream() cycles through a pool of 32 streams per device; the
    # fits borrow fixed sets of three instead, never the same set at once,
    # and an extra fit waits for a set to come back. No GPU is needed to
    # check the bookkeeping: streams are stand-in objects here.
    made = _stand_in_streams(monkeypatch)
    limit = skassoc._engine._device.MAX_CONCURRENT_CUDA_FITS
    borrow = skassoc._engine._device.borrowed_streams
    got, release = {}, [threading.Event() for _ in range(limit + 1)]
    holding = threading.Semaphore(0)

    def fit(i):
        with borrow(torch.device("cuda", 0)) as streams:
            got[i] = streams
            holding.release()
            release[i].wait(timeout=10)

    with ThreadPoolExecutor(limit + 1) as pool:
        futures = [pool.submit(fit, i) for i in range(limit)]
        for _ in range(limit):
            assert holding.acquire(timeout=10)
        assert len({s for streams in got.values() for s in streams}) == 3 * limit
        assert len(made) == 3 * limit <= 32
        extra = pool.submit(fit, limit)
        assert not holding.acquire(timeout=0.2)  # all sets are out: it waits
        release[3].set()
        assert holding.acquire(timeout=10)
        assert got[limit] is got[3]  # it got the set given back
        for event in release:
            event.set()
        for future in [*futures, extra]:
            future.result(timeout=10)
    assert len(made) == 3 * limit  # no new streams were taken


def test_nested_cuda_fits_reuse_their_threads_streams(monkeypatch):
    _stand_in_streams(monkeypatch)
    borrow = skassoc._engine._device.borrowed_streams
    cuda = torch.device("cuda")
    with borrow(cuda) as outer:
        # A fit inside a fit (e.g. from user code) would otherwise wait for
        # a set that its own thread holds once all are out.
        with borrow(cuda) as inner:
            assert inner is outer
        with borrow(cuda) as again:
            assert again is outer
    # Back in the queue: all sets free again.
    free = skassoc._engine._device._STREAM_SETS[0]
    assert free.qsize() == skassoc._engine._device.MAX_CONCURRENT_CUDA_FITS


def test_failed_stream_creation_leaves_no_short_stream_queue(monkeypatch):
    calls = {"n": 0}

    def stream(device=None):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("CUDA error")
        return object()

    monkeypatch.setattr(torch.cuda, "Stream", stream)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(skassoc._engine._device, "_STREAM_SETS", {})
    borrow = skassoc._engine._device.borrowed_streams
    with pytest.raises(RuntimeError, match="CUDA error"):
        with borrow(torch.device("cuda")):
            pass
    # The next fit makes all sets afresh instead of waiting on a short queue.
    with borrow(torch.device("cuda")) as streams:
        assert len(streams) == 3
    free = skassoc._engine._device._STREAM_SETS[0]
    assert free.qsize() == skassoc._engine._device.MAX_CONCURRENT_CUDA_FITS


def test_history_is_bounded(labeled_params, blobs):
    X, y = blobs
    clf = make_clf(
        labeled_params,
        hidden_layer_sizes=(4,),
        embedding_dim=4,
        labeled_per_class=2,
        unlabeled_batch_size=8,
        max_iter=1000,
    ).fit(X, y)
    assert clf.n_iter_ == 1000
    lengths = {key: len(values) for key, values in clf.history_.items()}
    assert max(lengths.values()) <= 101, lengths
    assert len(set(lengths.values())) == 1, lengths
    assert clf.history_["step"][-1] == 1000
    # Plain floats, no tensors (which would hold device memory or graphs).
    for key, values in clf.history_.items():
        assert all(type(v) in (int, float) for v in values), key
    # Nothing else in the fitted estimator grows with the steps.
    assert len(pickle.dumps(clf.history_)) < 20_000
    assert not [k for k, v in vars(clf).items() if isinstance(v, torch.Tensor)]


def test_fitted_model_keeps_no_gradients(labeled_params, blobs):
    X, y = blobs
    clf = make_clf(labeled_params, max_iter=5).fit(X, y)
    assert all(p.grad is None for p in clf.model_.parameters())


def test_concurrent_predict(fast_params, blobs_semi):
    X, y = blobs_semi
    clf = make_clf(fast_params, predict_batch_size=16).fit(X, y)
    X_big = np.repeat(X, 4, axis=0) + np.random.RandomState(0).normal(
        scale=0.1, size=(4 * len(X), X.shape[1])
    )
    expected_pred = clf.predict(X_big)
    expected_proba = clf.predict_proba(X_big)
    with ThreadPoolExecutor(max_workers=4) as pool:
        preds = list(pool.map(lambda _: clf.predict(X_big), range(8)))
        probas = list(pool.map(lambda _: clf.predict_proba(X_big), range(8)))
    for pred in preds:
        np.testing.assert_array_equal(pred, expected_pred)
    for proba in probas:
        np.testing.assert_array_equal(proba, expected_proba)


# ---------------------------------------------------------- property-based


DTYPES = [np.uint8, np.int32, np.float32, np.float64]


def _elements(dtype):
    if dtype == np.uint8:
        return st.integers(0, 255)
    if dtype == np.int32:
        return st.integers(-(2**31), 2**31 - 1)
    return st.floats(
        -1e6,
        1e6,
        allow_nan=False,
        allow_infinity=False,
        width=np.dtype(dtype).itemsize * 8,
    )


@st.composite
def data_sets(draw):
    n = draw(st.integers(2, 30))
    n_features = draw(st.integers(1, 6))
    dtype = draw(st.sampled_from(DTYPES))
    X = draw(hnp.arrays(dtype, (n, n_features), elements=_elements(dtype)))
    layout = draw(
        st.sampled_from(
            ["all_unlabeled", "one_class", "random", "many", "strings", "str_array"]
        )
    )
    if layout == "all_unlabeled":
        y = np.full(n, -1)
    elif layout == "one_class":
        y = np.array(draw(st.lists(st.sampled_from([-1, 4]), min_size=n, max_size=n)))
    elif layout == "random":
        k = draw(st.integers(1, 5))
        y = np.array(draw(st.lists(st.integers(-1, k - 1), min_size=n, max_size=n)))
    elif layout == "many":
        y = np.arange(n) - (n // 4)  # many classes, one sample each, some -1
    else:
        names = ["ant", "bee", "cat", -1]
        y = draw(st.lists(st.sampled_from(names), min_size=n, max_size=n))
        if layout == "strings":
            y = np.array(y, dtype=object)
        else:
            y = np.array([str(v) for v in y])  # "-1" marks unlabeled
    return X, y


def _unlabeled(value):
    return value == -1 or value == "-1"


@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=data_sets())
def test_fit_predict_random_inputs(fast_params, data):
    X, y = data
    clf = make_clf(
        fast_params,
        hidden_layer_sizes=(4,),
        embedding_dim=4,
        labeled_per_class=2,
        unlabeled_batch_size=4,
        max_iter=3,
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            clf.fit(X, y)
    except (ValueError, TypeError) as exc:
        event(f"rejected: {type(exc).__name__}")
        assert str(exc).strip()
        assert not hasattr(clf, "classes_")
        labeled = {v for v in y.tolist() if not _unlabeled(v)}
        # Valid data must fit: only an unusable labeling is rejected.
        assert len(labeled) < 2, (exc, labeled)
        return
    event("fitted")
    labeled = sorted({v for v in y.tolist() if not _unlabeled(v)}, key=str)
    assert sorted(clf.classes_.tolist(), key=str) == labeled
    pred = clf.predict(X)
    assert pred.shape == (len(X),)
    assert set(pred.tolist()) <= set(clf.classes_.tolist())
    proba = clf.predict_proba(X)
    assert np.isfinite(proba).all()
    assert clf.n_iter_ == 3


@st.composite
def image_batches(draw):
    n = draw(st.integers(2, 12))
    shape = draw(
        st.one_of(
            st.tuples(st.integers(1, 10), st.integers(1, 10)),
            st.tuples(st.integers(1, 3), st.integers(1, 10), st.integers(1, 10)),
        )
    )
    X = draw(hnp.arrays(np.uint8, (n, *shape)))
    y = np.arange(n) % 2
    return X, y


@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=image_batches(), predict_shape=st.sampled_from(["same", "chw", "rows"]))
def test_fit_predict_random_images(labeled_params, data, predict_shape):
    X, y = data
    clf = make_clf(
        labeled_params,
        network="auto",
        embedding_dim=4,
        hidden_layer_sizes=(4,),
        labeled_per_class=1,
        unlabeled_batch_size=4,
        max_iter=2,
    )
    clf.fit(X, y)
    shape = X.shape[1:]
    expected_shape = (1, *shape) if len(shape) == 2 else shape
    assert clf.input_shape_ == expected_shape
    height, width = expected_shape[1:]
    big_enough = min(height, width) >= 8
    small_image = big_enough and max(height, width) < 28
    image_network = ("small" if small_image else "mnist") if big_enough else "mlp"
    # One value high and at least 8 long: a signal (network="auto"'s rule).
    signal = height == 1 and width >= 8
    assert clf.network_ == ("signal" if signal else image_network)
    X_pred = {
        "same": X,
        "chw": X.reshape(len(X), *expected_shape),
        "rows": X.reshape(len(X), -1),
    }[predict_shape]
    pred = clf.predict(X_pred)
    np.testing.assert_array_equal(pred, clf.predict(X))
    assert set(pred.tolist()) <= {0, 1}
