"""Resizing and grey/colour conversion in front of the network."""

import numpy as np
import pytest
import torch

from skassoc import SemiSupervisedAssociationClassifier
from skassoc._nn._image_format import ImageFormat, check_image_size, formatted_shape

pytestmark = pytest.mark.usefixtures("torch_single_thread")


def test_grey_becomes_colour_by_repeating_the_channel():
    grey = torch.rand(2, 1, 5, 6) * 255
    colour = ImageFormat(channels=3)(grey)
    assert colour.shape == (2, 3, 5, 6)
    for channel in range(3):
        torch.testing.assert_close(colour[:, channel], grey[:, 0])


def test_colour_becomes_grey_by_its_luma():
    colour = torch.zeros(1, 3, 2, 2)
    colour[0, 0] = 100.0  # red
    colour[0, 1] = 200.0  # green
    grey = ImageFormat(channels=1)(colour)
    assert grey.shape == (1, 1, 2, 2)
    torch.testing.assert_close(
        grey, torch.full((1, 1, 2, 2), 0.299 * 100 + 0.587 * 200)
    )


def test_resize_keeps_the_value_range_and_the_picture():
    image = torch.zeros(1, 1, 28, 28)
    image[..., :, 14:] = 255.0  # right half white
    resized = ImageFormat(size=(32, 32))(image)
    assert resized.shape == (1, 1, 32, 32)
    assert resized.min() >= 0.0 and resized.max() <= 255.0
    assert resized[..., :, :14].max() == 0.0
    assert resized[..., :, 18:].min() == 255.0
    # Shrinking averages (antialiasing), it does not drop rows.
    stripes = torch.zeros(1, 1, 96, 96)
    stripes[..., ::2, :] = 255.0
    small = ImageFormat(size=32)(stripes)
    # Without antialiasing every row would be a sampled 0 or 255.
    assert small.min() > 85.0 and small.max() < 170.0
    assert abs(small.mean().item() - 127.5) < 5.0


def test_identity_format_returns_the_batch():
    batch = torch.rand(3, 3, 8, 8)
    assert ImageFormat(size=(8, 8), channels=3)(batch) is batch


@pytest.mark.parametrize("size", [0, (3,), (3, 0), (2.5, 3), "32", True])
def test_bad_sizes_are_refused(size):
    with pytest.raises(ValueError, match="image_size must be"):
        check_image_size(size)


def test_colour_to_grey_makes_no_tensor_from_the_host(monkeypatch):
    # A tensor built from host values inside the step cannot be captured in
    # a CUDA graph; the luma weights must be plain numbers.
    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was created from host data")

    colour = torch.rand(2, 3, 4, 4)
    expected = ImageFormat(channels=1)(colour)
    monkeypatch.setattr(torch.Tensor, "new_tensor", refuse)
    monkeypatch.setattr(torch, "tensor", refuse)
    monkeypatch.setattr(torch, "as_tensor", refuse)
    torch.testing.assert_close(ImageFormat(channels=1)(colour), expected)


def test_bad_channels_are_refused():
    with pytest.raises(ValueError, match="channels must be None, 1 or 3"):
        ImageFormat(channels=2)
    with pytest.raises(ValueError, match="only grey"):
        ImageFormat(channels=3)(torch.zeros(1, 2, 4, 4))


def test_formatted_shape():
    assert formatted_shape((1, 28, 28), (32, 32), 3) == (3, 32, 32)
    assert formatted_shape((3, 32, 32), None, None) == (3, 32, 32)
    assert formatted_shape((3, 96, 96), (32, 32), None) == (3, 32, 32)


# ------------------------------------------------------------ in the estimator


@pytest.fixture
def small_digit_images(digits_images):
    X, y = digits_images
    y_semi = y.copy()
    y_semi[np.arange(len(y)) % 4 != 0] = -1
    return X, y, y_semi


def make_clf(**params):
    defaults = dict(
        max_iter=3, device="cpu", random_state=0, labeled_per_class=2, precision="fp32"
    )
    return SemiSupervisedAssociationClassifier(**{**defaults, **params})


def test_resized_grey_digits_use_the_colour_32x32_network(small_digit_images, tmp_path):
    X, y, y_semi = small_digit_images  # (n, 8, 8) grey
    clf = make_clf(image_size=32, image_channels=3).fit(X, y_semi)
    assert clf.network_ == "svhn"
    # The inputs keep their own format; the network sees 3x32x32.
    assert clf.input_shape_ == (1, 8, 8)
    assert clf.model_.embedder.features[0].in_channels == 3
    assert clf.predict(X).shape == (len(X),)
    assert clf.transform(X[:5]).shape == (5, 128)
    # A saved model rebuilds the same conversion.
    path = tmp_path / "model.skassoc"
    clf.save(path)
    loaded = SemiSupervisedAssociationClassifier.load(path, device="cpu")
    np.testing.assert_array_equal(loaded.predict_proba(X), clf.predict_proba(X))


def test_colour_to_grey_in_the_estimator(small_digit_images):
    X, _, y_semi = small_digit_images
    colour = np.repeat(X[:, None], 3, axis=1)
    clf = make_clf(image_channels=1, network="mnist").fit(colour, y_semi)
    assert clf.model_.embedder.features[0].in_channels == 1
    assert clf.input_shape_ == (3, 8, 8)


def test_the_format_is_applied_in_fit_and_predict(small_digit_images):
    """A model fed pre-formatted inputs predicts like one that formats them."""
    X, _, y_semi = small_digit_images
    inside = make_clf(image_size=(16, 16), network="mnist").fit(X, y_semi)
    outside = ImageFormat(size=(16, 16))(torch.as_tensor(X[:, None]).float())
    reference = make_clf(network="mnist").fit(outside.numpy(), y_semi)
    np.testing.assert_allclose(
        inside.predict_proba(X), reference.predict_proba(outside.numpy()), atol=1e-5
    )


@pytest.mark.parametrize(
    "params, n_features",
    [
        ({"image_size": 16}, 256),
        ({"image_size": (8, 4)}, 32),
        ({"image_channels": 3}, 192),
    ],
)
def test_the_mlp_sees_formatted_images(small_digit_images, params, n_features):
    X, _, y_semi = small_digit_images
    clf = make_clf(network="mlp", **params).fit(X, y_semi)
    assert clf.model_.embedder.mean.shape == (n_features,)
    # Its standardisation is that of the formatted images.
    fmt = ImageFormat(params.get("image_size"), params.get("image_channels"))
    formatted = fmt(torch.as_tensor(X[:, None]).float()).flatten(1).double()
    torch.testing.assert_close(
        clf.model_.embedder.mean, formatted.mean(dim=0), check_dtype=False
    )
    assert clf.predict_proba(X).shape == (len(X), 10)


def test_auto_picks_the_mlp_for_images_shrunk_below_8x8(small_digit_images):
    X, _, y_semi = small_digit_images
    clf = make_clf(image_size=4).fit(X, y_semi)
    assert clf.network_ == "mlp"
    assert clf.predict(X).shape == (len(X),)


def test_format_parameters_need_images(blobs_semi):
    X, y = blobs_semi
    with pytest.raises(ValueError, match="need image inputs"):
        make_clf(network="mlp", image_size=32).fit(X, y)
    with pytest.raises(ValueError, match="need image inputs"):
        make_clf(network="mlp", image_channels=3).fit(X, y)


def test_format_parameters_are_validated(small_digit_images):
    X, _, y_semi = small_digit_images
    with pytest.raises(ValueError, match="image_channels"):
        make_clf(image_channels=2).fit(X, y_semi)
    with pytest.raises(ValueError, match="image_size must be"):
        make_clf(image_size=(32, 0)).fit(X, y_semi)
    two_channels = np.repeat(X[:, None], 2, axis=1)
    with pytest.raises(ValueError, match="the images have 2 channels"):
        make_clf(image_channels=3).fit(two_channels, y_semi)


# ------------------------------------------------------ format_images (NumPy)


def test_format_images_matches_the_estimators_conversion():
    from skassoc.datasets import format_images

    rng = np.random.RandomState(0)
    grey = rng.randint(0, 256, size=(10, 28, 28)).astype(np.uint8)
    out = format_images(grey, size=32, channels=3)
    assert out.shape == (10, 3, 32, 32) and out.dtype == np.uint8
    expected = ImageFormat((32, 32), 3)(torch.as_tensor(grey[:, None]).float())
    np.testing.assert_allclose(out, expected.round().clamp(0, 255).numpy(), atol=0)
    floats = format_images(grey.astype(np.float64) / 255, channels=3)
    assert floats.dtype == np.float32 and floats.shape == (10, 3, 28, 28)
    assert format_images(grey[:0], size=32).shape == (0, 1, 32, 32)


def test_format_images_rejects_bad_input():
    from skassoc.datasets import format_images

    with pytest.raises(ValueError, match="images must be"):
        format_images(np.zeros((3, 4)))
    with pytest.raises(ValueError, match="channels must be"):
        format_images(np.zeros((3, 4, 4)), channels=2)
    with pytest.raises(ValueError, match="the images have 2 channels"):
        format_images(np.zeros((3, 2, 4, 4)), channels=3)
    with pytest.raises(ValueError, match="size must be"):
        format_images(np.zeros((3, 4, 4)), size=(0, 4))
