"""Signals: inputs one value high, the 1-D network and its augmentation."""

import numpy as np
import pytest
import torch

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._engine._augmentation import augmentation_module, resolve_augmentation
from skassoc._engine._signal_augmentation import (
    SIGNAL_AUGMENTATION,
    SignalAugmentation,
    resolve_signal_augmentation,
)
from skassoc._inputs import resolve_image_shape, validate_training_inputs
from skassoc._nn._networks import auto_network_name, build_network
from skassoc._nn._signal import SignalNet, signal_plan
from skassoc._settings import resolve_fit_settings
from skassoc.datasets import make_synthetic_signals

#: A tiny 1-D network trained for a few steps.
FAST = {
    "embedding_dim": 8,
    "labeled_per_class": 3,
    "unlabeled_batch_size": 16,
    "max_iter": 5,
    "device": "cpu",
    "random_state": 0,
}


# Fits of a few steps are too short to be good ones, which the fit report
# may say; what they check is the plumbing.
pytestmark = pytest.mark.filterwarnings("ignore:fit_report_ finds this fit suspect")


@pytest.fixture(autouse=True)
def _one_thread(torch_single_thread):
    """Every test here trains or runs tiny networks: one thread."""


@pytest.fixture(scope="module")
def signals():
    """60 one-channel signals of 40 values, 3 classes, all but 4 a class unlabeled."""
    X, y = make_synthetic_signals(60, length=40, random_state=0)
    y_semi = y.copy()
    for label in range(3):
        y_semi[np.flatnonzero(y == label)[4:]] = -1
    return X, y, y_semi


@pytest.mark.parametrize(
    "input_shape, expected",
    [((40,), (1, 1, 40)), ((1, 40), (1, 1, 40)), ((3, 1, 40), (3, 1, 40))],
)
def test_input_shape_of_a_signal_is_one_value_high(input_shape, expected):
    assert resolve_image_shape(None, input_shape, 40 * expected[0]) == expected


def test_two_sides_stay_an_image():
    # (height, width) keeps its meaning: a grey image, not channels.
    assert resolve_image_shape(None, (8, 8), 64) == (1, 8, 8)
    assert auto_network_name((1, 8, 8)) == "small"


@pytest.mark.parametrize(
    "shape, name",
    [((1, 1, 128), "signal"), ((6, 1, 100), "signal"), ((1, 1, 7), "mlp")],
)
def test_auto_picks_the_signal_network_for_inputs_one_value_high(shape, name):
    assert auto_network_name(shape) == name


@pytest.mark.parametrize("length", [8, 37, 300, 2000])
def test_the_network_takes_any_length_at_a_bounded_cost(length):
    net = build_network("signal", (2, 1, length), 2 * length, 16, ())
    assert net(torch.randn(3, 2, 1, length)).shape == (3, 16)
    plan = signal_plan(length)
    # The first convolution strides long signals down to a few hundred
    # positions, and no filter skips values.
    assert plan[0].kernel > plan[0].stride
    assert -(-length // plan[0].stride) <= 256


def test_network_reads_every_axis_but_the_last_as_channels():
    net = SignalNet((1, 4, 30), embedding_dim=8)
    assert net.features[0].in_channels == 4
    x = torch.randn(5, 1, 4, 30)
    torch.testing.assert_close(net(x), net(x.reshape(5, 4, 1, 30)))


def test_normalization_standardises_each_channel():
    x = torch.randn(50, 2, 1, 64) * torch.tensor([1.0, 100.0]).view(1, 2, 1, 1)
    x = x + torch.tensor([5.0, -300.0]).view(1, 2, 1, 1)
    net = SignalNet((2, 1, 64)).fit_normalization(x)
    z = (x.flatten(1, 2) - net.mean) / net.scale
    torch.testing.assert_close(z.mean(dim=(0, 2)), torch.zeros(2, dtype=z.dtype))
    torch.testing.assert_close(z.std(dim=(0, 2)), torch.ones(2), rtol=1e-2, atol=0)
    # A constant channel is only centred.
    constant = torch.full((4, 1, 1, 16), 3.0)
    net = SignalNet((1, 1, 16)).fit_normalization(constant)
    assert float(net.scale) == 1.0 and float(net.mean) == 3.0


def test_fit_predict_transform_on_rows_with_input_shape(signals):
    X, y, y_semi = signals
    rows = X.reshape(len(X), -1)
    clf = SemiSupervisedAssociationClassifier(input_shape=(40,), **FAST)
    clf.fit(rows, y_semi)
    assert clf.network_ == "signal" and clf.input_shape_ == (1, 1, 40)
    assert clf.predict(rows).shape == (60,)
    assert clf.predict_proba(rows).shape == (60, 3)
    assert clf.transform(rows).shape == (60, 8)
    # Rows and signals one value high are the same inputs.
    np.testing.assert_array_equal(clf.predict_proba(X), clf.predict_proba(rows))


def test_channels_reach_the_network(signals):
    X, _, y_semi = signals
    several = np.concatenate([X, -X, 2 * X], axis=1)  # (n, 3, 1, 40)
    clf = SemiSupervisedAssociationClassifier(**FAST).fit(several, y_semi)
    assert clf.network_ == "signal" and clf.input_shape_ == (3, 1, 40)
    assert clf.model_.embedder.features[0].in_channels == 3
    # (n, channels, length) arrays are grey images unless network="signal"
    # is named, which reads their rows as channels.
    named = SemiSupervisedAssociationClassifier(network="signal", **FAST)
    named.fit(several[:, :, 0, :], y_semi)
    assert named.model_.embedder.features[0].in_channels == 3


def test_signals_of_another_length_are_refused_at_inference(signals):
    X, _, y_semi = signals
    clf = SemiSupervisedAssociationClassifier(**FAST).fit(X, y_semi)
    # As many values in another layout: two channels of 20.
    with pytest.raises(ValueError, match="fitted on signals of 1 channel"):
        clf.predict(X.reshape(len(X), 2, 1, 20))
    with pytest.raises(ValueError, match="X has 30 features"):
        clf.predict(X[:, :, :, :30])


@pytest.mark.parametrize("container", [list, "object array"])
def test_ragged_signals_are_refused_clearly(container):
    samples = [np.zeros(40), np.zeros(40), np.zeros(35)]
    if container == "object array":
        X = np.empty(3, dtype=object)
        X[:] = samples
    else:
        X = container(samples)
    clf = SemiSupervisedAssociationClassifier(**FAST)
    with pytest.raises(ValueError, match=r"different shapes .*sample 2: \(35,\)"):
        clf.fit(X, [0, 1, -1])


def test_the_signal_network_needs_shaped_inputs():
    clf = SemiSupervisedAssociationClassifier(network="signal", **FAST)
    with pytest.raises(ValueError, match=r"needs signals: .*input_shape=\(length,\)"):
        clf.fit(np.zeros((6, 40)), [0, 1, -1, -1, -1, -1])


def test_save_and_load_keep_the_predictions(signals, tmp_path):
    X, _, y_semi = signals
    rows = X.reshape(len(X), -1)
    clf = SemiSupervisedAssociationClassifier(input_shape=(40,), **FAST)
    clf.fit(rows, y_semi)
    path = tmp_path / "signals.skassoc"
    clf.save(path)
    loaded = SemiSupervisedAssociationClassifier.load(path, device="cpu")
    assert loaded.input_shape == (40,) and loaded.network_ == "signal"
    np.testing.assert_array_equal(loaded.predict_proba(rows), clf.predict_proba(rows))


def test_onnx_export_matches_predict_proba(signals, tmp_path):
    pytest.importorskip("onnx")
    onnxruntime = pytest.importorskip("onnxruntime")
    from skassoc.export import _uses_dynamo_exporter, export_onnx

    if _uses_dynamo_exporter():
        pytest.importorskip("onnxscript")
    X, _, y_semi = signals
    # The ONNX graph computes in float32; "auto" may predict in bf16.
    clf = SemiSupervisedAssociationClassifier(precision="fp32", **FAST)
    clf.fit(X, y_semi)
    path = export_onnx(clf, tmp_path / "signals.onnx")
    session = onnxruntime.InferenceSession(
        str(path), providers=["CPUExecutionProvider"]
    )
    (proba,) = session.run(None, {"input": X.astype(np.float32)})
    np.testing.assert_allclose(proba, clf.predict_proba(X), rtol=0, atol=1e-4)


def test_auto_augmentation_of_signals_and_refused_settings(signals):
    X, _, y_semi = signals
    clf = SemiSupervisedAssociationClassifier(**FAST)
    inputs = validate_training_inputs(clf, X, y_semi)
    settings = resolve_fit_settings(clf, inputs)
    assert settings.training.augmentation == SIGNAL_AUGMENTATION
    for bad in ("paper", {"affine_std": 0.1}, {"feature_noise": 0.5}):
        with pytest.raises(ValueError, match="signals"):
            resolve_fit_settings(clf.set_params(augmentation=bad), inputs)
    # Signal settings on other inputs are refused too.
    with pytest.raises(ValueError, match="needs signals"):
        resolve_augmentation({"warp_std": 0.2}, feature_vectors=False)


def test_augmentation_without_change_is_the_identity():
    x = torch.randn(4, 2, 1, 50)
    off = SignalAugmentation(shift_std=0, warp_std=0, scale_std=0, noise_std=0)
    torch.testing.assert_close(off(x), x)


def test_shift_moves_a_spike_and_warp_keeps_the_ends():
    spike = torch.zeros(64, 1, 1, 101)
    spike[..., 50] = 1.0
    torch.manual_seed(0)
    shifted = SignalAugmentation(shift_std=0.1, warp_std=0, scale_std=0, noise_std=0)
    peaks = shifted(spike).squeeze().argmax(dim=1)
    assert (peaks != 50).float().mean() > 0.5
    ramp = torch.linspace(0, 1, 101).expand(64, 1, 1, 101)
    warped = SignalAugmentation(shift_std=0, warp_std=0.3, scale_std=0, noise_std=0)
    out = warped(ramp)
    torch.testing.assert_close(out[..., [0, -1]], ramp[..., [0, -1]])
    assert not torch.allclose(out, ramp, atol=1e-3)
    # Time never runs backwards: a rising ramp stays rising.
    assert (out.diff(dim=-1) >= -1e-6).all()


def test_scale_keeps_each_channel_mean_and_noise_follows_its_spread():
    torch.manual_seed(0)
    x = torch.randn(32, 2, 1, 200) * torch.tensor([1.0, 10.0]).view(1, 2, 1, 1) + 7
    scaled = SignalAugmentation(shift_std=0, warp_std=0, scale_std=0.3, noise_std=0)
    torch.testing.assert_close(scaled(x).mean(-1), x.mean(-1), rtol=1e-4, atol=1e-4)
    noisy = SignalAugmentation(shift_std=0, warp_std=0, scale_std=0, noise_std=0.1)
    added = (noisy(x) - x).std(dim=(0, 2, 3))
    torch.testing.assert_close(added, torch.tensor([0.1, 1.0]), rtol=0.1, atol=0)


def test_settings_dispatch_to_the_signal_augmentation():
    module, unlabeled = augmentation_module(dict(SIGNAL_AUGMENTATION), embedder=None)
    assert isinstance(module, SignalAugmentation) and unlabeled


def test_make_synthetic_signals():
    X, y = make_synthetic_signals(
        61, n_classes=6, length=32, n_channels=2, random_state=1
    )
    assert X.shape == (61, 2, 1, 32) and y.dtype == np.int64
    assert np.ptp(np.bincount(y)) <= 1 and set(y) == set(range(6))
    again, _ = make_synthetic_signals(
        61, n_classes=6, length=32, n_channels=2, random_state=1
    )
    np.testing.assert_array_equal(X, again)
    with pytest.raises(ValueError, match="n_classes must be at most 6"):
        make_synthetic_signals(10, n_classes=7)
    with pytest.raises(ValueError, match="length must be an integer >= 8"):
        make_synthetic_signals(10, length=4)


def test_the_signal_augmentation_reads_nothing_back_to_the_host():
    # What capture in the training step's CUDA graph needs, checked without
    # a GPU: on the meta device tensors hold no values, so any read back to
    # the host (.item(), a data-dependent shape) raises.
    batch = torch.empty(8, 3, 1, 64, device="meta")
    module, _ = augmentation_module(resolve_signal_augmentation("auto"), None)
    out = module(batch)
    assert out.shape == batch.shape and out.device.type == "meta"
    with pytest.raises(RuntimeError, match="meta"):
        (batch.std() > 0).item()  # the check does catch a host read
