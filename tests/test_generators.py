import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.neighbors import NearestCentroid

from skassoc.datasets import _generators, make_mnist_m_like, make_synthetic_digits

pytest.importorskip("PIL")

LUMA = np.array([0.299, 0.587, 0.114]).reshape(1, 3, 1, 1)


def matplotlib_font(name):
    """Path of a font bundled with matplotlib, or skip the test."""
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or spec.origin is None:
        pytest.skip("matplotlib is not installed")
    path = Path(spec.origin).parent / "mpl-data" / "fonts" / "ttf" / name
    if not path.is_file():
        pytest.skip(f"matplotlib has no {name}")
    return str(path)


def digit_images(n=6, shape=(28, 28), seed=0):
    """Grey "digits": a random white box on black, with grey edges."""
    rng = np.random.RandomState(seed)
    images = np.zeros((n, *shape), dtype=np.uint8)
    for k in range(n):
        top, left = rng.randint(0, shape[0] // 2), rng.randint(0, shape[1] // 2)
        images[k, top : top + shape[0] // 3, left : left + shape[1] // 4] = 255
        images[k, top, left : left + shape[1] // 4] = 128
    return images


# --------------------------------------------------------------------------
# make_synthetic_digits


@pytest.mark.parametrize("image_size", [32, 20])
def test_synthetic_digits_shapes_and_values(image_size):
    X, y = make_synthetic_digits(25, image_size=image_size, random_state=0)
    assert X.shape == (25, 3, image_size, image_size)
    assert X.dtype == np.uint8
    assert X.flags.c_contiguous
    assert y.shape == (25,)
    assert y.dtype == np.int64
    # Balanced classes: counts differ by at most one.
    counts = np.bincount(y, minlength=10)
    assert len(counts) == 10 and counts.min() == 2 and counts.max() == 3
    # Every image shows something: the digit stands out from the background.
    luma = (X * LUMA).sum(axis=1)
    assert np.all(luma.max(axis=(1, 2)) - luma.min(axis=(1, 2)) > 40)


def test_synthetic_digits_bunch():
    bunch = make_synthetic_digits(30, random_state=0, return_X_y=False)
    X, y = make_synthetic_digits(30, random_state=0)
    np.testing.assert_array_equal(bunch.data, X)
    np.testing.assert_array_equal(bunch.target, y)
    assert bunch.font.shape == (30,)
    assert bunch.font.dtype == np.int64
    assert 0 <= bunch.font.min() and bunch.font.max() < len(bunch.font_names)
    assert all(isinstance(name, str) for name in bunch.font_names)
    assert "Synthetic" in bunch.DESCR


def test_synthetic_digits_seed():
    a, ya = make_synthetic_digits(40, random_state=3)
    b, yb = make_synthetic_digits(40, random_state=3)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ya, yb)
    c, _ = make_synthetic_digits(40, random_state=np.random.RandomState(3))
    np.testing.assert_array_equal(a, c)
    d, _ = make_synthetic_digits(40, random_state=4)
    assert not np.array_equal(a, d)


def test_synthetic_digits_more_than_one_chunk():
    n = _generators._CHUNK_SIZE + 10
    X, y = make_synthetic_digits(n, image_size=8, fonts=["default"], random_state=0)
    assert X.shape == (n, 3, 8, 8)
    assert np.bincount(y).min() >= n // 10


def test_synthetic_digits_are_readable():
    # A nearest-centroid classifier on the polarity-free grey images, halved
    # in size, gets most test digits right (chance: 10%).
    X, y = make_synthetic_digits(2000, random_state=0)
    assert set(y.tolist()) == set(range(10))
    grey = (X * LUMA).sum(axis=1)
    grey = np.abs(grey - np.median(grey, axis=(1, 2), keepdims=True))
    features = grey.reshape(-1, 16, 2, 16, 2).mean(axis=(2, 4)).reshape(len(X), -1)
    features /= features.std(axis=1, keepdims=True) + 1e-6
    clf = NearestCentroid().fit(features[:1500], y[:1500])
    assert clf.score(features[1500:], y[1500:]) > 0.5


def test_synthetic_digits_user_fonts():
    sans = matplotlib_font("DejaVuSans.ttf")
    serif = matplotlib_font("DejaVuSerif-Italic.ttf")
    bunch = make_synthetic_digits(
        40, fonts=[sans, Path(serif)], random_state=0, return_X_y=False
    )
    assert bunch.font_names == [sans, serif]
    assert set(bunch.font.tolist()) == {0, 1}

    one = make_synthetic_digits(20, fonts=sans, random_state=0, return_X_y=False)
    assert one.font_names == [sans]
    assert one.font.tolist() == [0] * 20
    other, _ = make_synthetic_digits(20, fonts=[serif], random_state=0)
    assert not np.array_equal(one.data, other)

    # A relative path is accepted and reported as an absolute one.
    relative = os.path.relpath(sans)
    bunch = make_synthetic_digits(5, fonts=[relative], return_X_y=False)
    assert bunch.font_names == [os.path.abspath(relative)]


def test_synthetic_digits_default_font():
    bunch = make_synthetic_digits(
        12, fonts=["default"], random_state=0, return_X_y=False
    )
    assert len(bunch.font_names) == 1
    assert bunch.font_names[0].startswith("Pillow's default")


def test_bitmap_font_fallback(monkeypatch):
    # Pillow < 10.1 has no scalable default font: its bitmap font is used.
    from PIL import ImageFont

    if not hasattr(ImageFont, "load_default_imagefont"):
        pytest.skip("this Pillow cannot load its bitmap font on its own")

    def load_default(size=None):
        if size is not None:
            raise TypeError("load_default() got an unexpected keyword argument")
        return ImageFont.load_default_imagefont()

    monkeypatch.setattr(ImageFont, "load_default", load_default)
    _generators._glyph_atlas.cache_clear()
    try:
        bunch = make_synthetic_digits(
            10, fonts=["default"], random_state=0, return_X_y=False
        )
    finally:
        _generators._glyph_atlas.cache_clear()
    assert bunch.font_names == ["Pillow's default bitmap font"]
    assert bunch.data.shape == (10, 3, 32, 32)


def test_found_fonts_leave_out_symbol_fonts():
    good = matplotlib_font("DejaVuSans.ttf")
    symbols = [
        matplotlib_font(name)
        for name in ("cmsy10.ttf", "cmex10.ttf", "LastResortHE-Regular.ttf")
    ]
    empty = matplotlib_font("STIXSizOneSymReg.ttf")
    atlas, widths, heights, names = _generators._glyph_atlas(
        ("default", *symbols, empty, good, good), 40, check_resemblance=True
    )
    # The repeated font is kept once.
    assert names[1:] == [good]
    assert names[0].startswith("Pillow's default font")
    assert atlas.shape == (20, 1, 40, 40)
    assert widths.shape == (2, 10) and heights.shape == (2,)


@pytest.mark.parametrize("n_samples", [0, -3, 2.5, True, "10", None])
def test_synthetic_digits_invalid_n_samples(n_samples):
    with pytest.raises(ValueError, match="n_samples must be an integer >= 1"):
        make_synthetic_digits(n_samples)


@pytest.mark.parametrize("image_size", [7, 0, 32.0, False])
def test_synthetic_digits_invalid_image_size(image_size):
    with pytest.raises(ValueError, match="image_size must be an integer >= 8"):
        make_synthetic_digits(5, image_size=image_size)


def test_synthetic_digits_invalid_fonts(tmp_path):
    missing = str(tmp_path / "no-such-font.ttf")
    with pytest.raises(ValueError, match="does not exist") as excinfo:
        make_synthetic_digits(5, fonts=[missing])
    assert missing in str(excinfo.value)
    with pytest.raises(ValueError, match="is a folder"):
        make_synthetic_digits(5, fonts=[str(tmp_path)])

    not_a_font = tmp_path / "notes.ttf"
    not_a_font.write_text("not a font")
    with pytest.raises(ValueError, match="could not be loaded as a TrueType"):
        make_synthetic_digits(5, fonts=[not_a_font])

    with pytest.raises(ValueError, match="fonts is an empty list"):
        make_synthetic_digits(5, fonts=[])
    with pytest.raises(ValueError, match="fonts must be None or a list"):
        make_synthetic_digits(5, fonts=3)


def test_synthetic_digits_fonts_without_digits():
    last_resort = matplotlib_font("LastResortHE-Regular.ttf")
    with pytest.raises(ValueError, match="same glyph for the digits 0 and 1"):
        make_synthetic_digits(5, fonts=[last_resort])
    size_symbols = matplotlib_font("STIXSizOneSymReg.ttf")
    with pytest.raises(ValueError, match="draws nothing for the digit"):
        make_synthetic_digits(5, fonts=[size_symbols])


def test_synthetic_digits_without_pillow(monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match="pip install pillow"):
        make_synthetic_digits(5)


# --------------------------------------------------------------------------
# make_mnist_m_like


@pytest.mark.parametrize(
    "shape, expected",
    [((4, 28, 28), (4, 3, 28, 28)), ((3, 1, 20, 24), (3, 3, 20, 24))],
)
def test_mnist_m_shapes(shape, expected):
    images = digit_images(shape[0], shape[-2:]).reshape(shape)
    X = make_mnist_m_like(images, random_state=0)
    assert X.shape == expected
    assert X.dtype == np.uint8
    assert X.flags.c_contiguous


def test_mnist_m_is_abs_texture_minus_digit():
    digits = digit_images(8)
    # Black digits leave the texture itself.
    textures = make_mnist_m_like(np.zeros_like(digits), random_state=1)
    X = make_mnist_m_like(digits, random_state=1)
    expected = np.abs(textures.astype(np.int16) - digits[:, None])
    np.testing.assert_array_equal(X, expected)
    background = np.broadcast_to(digits[:, None] == 0, X.shape)
    np.testing.assert_array_equal(X[background], textures[background])
    white = np.broadcast_to(digits[:, None] == 255, X.shape)
    np.testing.assert_array_equal(X[white], 255 - textures[white])
    # The input is left alone, and other integer types give the same result.
    np.testing.assert_array_equal(digits, digit_images(8))
    np.testing.assert_array_equal(
        make_mnist_m_like(digits.astype(np.int64), random_state=1), X
    )


def test_mnist_m_textures_vary():
    textures = make_mnist_m_like(np.zeros((20, 28, 28), np.uint8), random_state=0)
    flat = textures.reshape(20, -1)
    # Each image has its own texture, and most are not flat.
    assert len({row.tobytes() for row in flat}) == 20
    assert np.mean(textures.std(axis=(1, 2, 3)) > 5) > 0.8
    assert textures.min() < 50 and textures.max() > 200


def test_mnist_m_seed():
    digits = digit_images(5)
    a = make_mnist_m_like(digits, random_state=7)
    np.testing.assert_array_equal(a, make_mnist_m_like(digits, random_state=7))
    np.testing.assert_array_equal(
        a, make_mnist_m_like(digits, random_state=np.random.RandomState(7))
    )
    assert not np.array_equal(a, make_mnist_m_like(digits, random_state=8))


def test_mnist_m_user_textures():
    rng = np.random.RandomState(0)
    digits = np.zeros((40, 8, 10), np.uint8)

    same_size = rng.randint(0, 256, (1, 3, 8, 10)).astype(np.uint8)
    X = make_mnist_m_like(digits, textures=same_size, random_state=0)
    np.testing.assert_array_equal(X, np.broadcast_to(same_size, X.shape))

    photos = [
        rng.randint(0, 256, (3, 12, 15)).astype(np.uint8),
        rng.randint(0, 256, (3, 9, 30)).astype(np.uint8),
    ]
    X = make_mnist_m_like(digits, textures=photos, random_state=0)
    used = set()
    for image in X:
        crops = [
            (k, top, left)
            for k, photo in enumerate(photos)
            for top in range(photo.shape[1] - 8 + 1)
            for left in range(photo.shape[2] - 10 + 1)
            if np.array_equal(photo[:, top : top + 8, left : left + 10], image)
        ]
        assert crops, "an output is not a patch of the textures"
        used.add(crops[0][0])
    assert used == {0, 1}
    np.testing.assert_array_equal(
        X, make_mnist_m_like(digits, textures=photos, random_state=0)
    )


@pytest.mark.parametrize(
    "images, match",
    [
        (np.zeros((2, 3, 28, 28), np.uint8), "grey images of shape"),
        (np.zeros((28, 28), np.uint8), "grey images of shape"),
        (np.zeros((0, 28, 28), np.uint8), "at least one image"),
        (np.zeros((2, 28, 28)), r"\(images \* 255\)\.round\(\)"),
        (np.full((2, 28, 28), 256), "values 0-255, got values from 256 to 256"),
        (np.full((2, 28, 28), -1), "values 0-255"),
        (np.zeros((2, 28, 28), bool), "integer pixel values"),
    ],
)
def test_mnist_m_invalid_images(images, match):
    with pytest.raises(ValueError, match=match):
        make_mnist_m_like(images)


@pytest.mark.parametrize(
    "textures, match",
    [
        (np.zeros((3, 40, 40), np.uint8), r"shape \(n_textures, 3, height, width\)"),
        ([np.zeros((40, 40, 3), np.uint8)], r"np\.moveaxis"),
        ([np.zeros((1, 40, 40), np.uint8)], r"shape \(3, height, width\)"),
        ([np.zeros((3, 40, 20), np.uint8)], "smaller than the images"),
        (np.zeros((2, 3, 40, 40), np.float32), "integer pixel values 0-255"),
        (np.full((2, 3, 40, 40), 300), "values 0-255, got values from 300 to 300"),
        ([], "textures is empty"),
    ],
)
def test_mnist_m_invalid_textures(textures, match):
    with pytest.raises(ValueError, match=match):
        make_mnist_m_like(digit_images(2), textures=textures)


# --------------------------------------------------------------------------
# The shared texture generator


def test_procedural_textures():
    rng = np.random.RandomState(0)
    textures = _generators._procedural_textures(6, 10, 14, rng)
    assert textures.shape == (6, 3, 10, 14)
    assert textures.min() >= 0 and textures.max() <= 1
    flat = _generators._procedural_textures(4, 10, 14, rng, flat_probability=1.0)
    assert (flat.amax(dim=(2, 3)) == flat.amin(dim=(2, 3))).all()


def test_upsampling_matrix_is_bicubic_interpolation():
    import torch
    import torch.nn.functional as F

    lattice = torch.rand(2, 3, 5, 5)
    expected = F.interpolate(lattice, size=(17, 11), mode="bicubic")
    actual = (
        _generators._upsampling_matrix(5, 17)
        @ lattice
        @ _generators._upsampling_matrix(5, 11).T
    )
    torch.testing.assert_close(actual, expected)
