import gzip
import hashlib
import http.server
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import scipy.io

from skassoc.datasets import (
    _mnist,
    load_mnist,
    load_stl10,
    load_svhn,
    make_semi_supervised_labels,
)

MNIST_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
TEST_FILES = ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@pytest.fixture
def mnist_dir():
    if not all((MNIST_DIR / (name + ".gz")).is_file() for name in _mnist._SHA256):
        pytest.skip(f"real MNIST files not found in {MNIST_DIR}")
    return MNIST_DIR


@pytest.fixture
def no_env(monkeypatch, tmp_path):
    """Keep the user's environment from choosing the data folder."""
    monkeypatch.delenv("SKASSOC_MNIST_DIR", raising=False)
    monkeypatch.delenv("SKASSOC_SVHN_DIR", raising=False)
    monkeypatch.delenv("SKASSOC_STL10_DIR", raising=False)
    monkeypatch.setenv("SCIKIT_LEARN_DATA", str(tmp_path / "sklearn_data"))


def idx_bytes(array, type_code=0x08):
    """Encode ``array`` as an IDX file."""
    header = bytes([0, 0, type_code, array.ndim])
    header += np.asarray(array.shape, dtype=">u4").tobytes()
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def _sha256(content):
    return hashlib.sha256(content).hexdigest()


def synthetic_mnist(n=5, seed=0):
    rng = np.random.RandomState(seed)
    images = rng.randint(0, 256, size=(n, 28, 28)).astype(np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    return images, labels


# --------------------------------------------------------------------------
# A real HTTP server on the loopback interface, standing in for the mirrors.


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture
def http_root(tmp_path, monkeypatch):
    """Serve a folder over HTTP on 127.0.0.1; yield (folder, base_url, paths).

    ``paths`` lists the path of every request the server received.
    """
    root = tmp_path / "www"
    root.mkdir()
    requests = []

    class Handler(_Handler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # A short poll interval keeps shutdown(), which waits for it, quick.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    # A proxy configured on the machine must not intercept local requests.
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}/", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def leftovers(folder):
    return sorted(p.name for p in Path(folder).iterdir()) if folder.exists() else []


# --------------------------------------------------------------------------
# load_mnist on the real files


def test_load_mnist_train(mnist_dir):
    bunch = load_mnist("train", data_home=mnist_dir, download_if_missing=False)
    assert bunch.data.shape == (60000, 28, 28)
    assert bunch.data.dtype == np.uint8
    assert bunch.target.shape == (60000,)
    assert bunch.target.dtype == np.int64
    assert np.bincount(bunch.target).tolist() == MNIST_TRAIN_COUNTS
    assert bunch.data.max() == 255
    assert bunch.data_home == str(mnist_dir)
    assert "MNIST" in bunch.DESCR


def test_load_mnist_test_return_X_y(mnist_dir):
    X, y = load_mnist(
        "test", data_home=mnist_dir, download_if_missing=False, return_X_y=True
    )
    assert X.shape == (10000, 28, 28)
    assert X.dtype == np.uint8
    assert y.dtype == np.int64
    assert np.bincount(y).tolist() == MNIST_TEST_COUNTS


def test_load_mnist_env_var(mnist_dir, no_env, monkeypatch):
    monkeypatch.setenv("SKASSOC_MNIST_DIR", str(mnist_dir))
    bunch = load_mnist("test", download_if_missing=False)
    assert bunch.data_home == str(mnist_dir)
    assert np.bincount(bunch.target).tolist() == MNIST_TEST_COUNTS


def test_load_mnist_data_home_beats_env_var(mnist_dir, no_env, monkeypatch, tmp_path):
    monkeypatch.setenv("SKASSOC_MNIST_DIR", str(tmp_path / "elsewhere"))
    bunch = load_mnist("test", data_home=mnist_dir, download_if_missing=False)
    assert bunch.data_home == str(mnist_dir)


def test_load_mnist_default_folder(no_env, tmp_path):
    expected = os.path.join(tmp_path / "sklearn_data", "mnist")
    with pytest.raises(FileNotFoundError) as excinfo:
        load_mnist("test", download_if_missing=False)
    message = str(excinfo.value)
    assert repr(expected) in message
    assert "t10k-images-idx3-ubyte" in message
    assert "SKASSOC_MNIST_DIR" in message
    assert "download_if_missing=True" in message


def test_load_mnist_uncompressed(mnist_dir, tmp_path):
    for name in TEST_FILES:
        with gzip.open(mnist_dir / (name + ".gz"), "rb") as src:
            (tmp_path / name).write_bytes(src.read())
    X_raw, y_raw = load_mnist("test", data_home=tmp_path, return_X_y=True)
    X_gz, y_gz = load_mnist("test", data_home=mnist_dir, return_X_y=True)
    np.testing.assert_array_equal(X_raw, X_gz)
    np.testing.assert_array_equal(y_raw, y_gz)


# --------------------------------------------------------------------------
# IDX parsing on small synthetic files


@pytest.mark.parametrize("compress", [False, True])
def test_load_mnist_synthetic(tmp_path, compress):
    images, labels = synthetic_mnist(n=7)
    for name, array in zip(TEST_FILES, (images, labels)):
        content = idx_bytes(array)
        if compress:
            (tmp_path / (name + ".gz")).write_bytes(gzip.compress(content))
        else:
            (tmp_path / name).write_bytes(content)
    X, y = load_mnist("test", data_home=tmp_path, return_X_y=True)
    np.testing.assert_array_equal(X, images)
    np.testing.assert_array_equal(y, labels)
    assert y.dtype == np.int64


@pytest.mark.parametrize(
    "type_code, dtype",
    [(0x08, np.uint8), (0x09, np.int8), (0x0B, np.int16), (0x0C, np.int32),
     (0x0D, np.float32), (0x0E, np.float64)],
)  # fmt: skip
def test_read_idx_dtypes(tmp_path, type_code, dtype):
    array = np.arange(-3, 21).reshape(2, 3, 4).astype(dtype)
    path = tmp_path / "data-idx"
    path.write_bytes(idx_bytes(array, type_code))
    result = _mnist._read_idx(path)
    assert result.dtype == np.dtype(dtype)
    assert result.dtype.isnative
    np.testing.assert_array_equal(result, array)


@pytest.mark.parametrize(
    "content, match",
    [
        (b"\x00\x00\x07\x01" + b"\x00" * 8, "bad magic number"),
        (b"\x01\x00\x08\x01" + b"\x00" * 8, "bad magic number"),
        (b"\x00\x00", "ends inside the header"),
        (b"\x00\x00\x08\x03\x00\x00\x00\x02", "ends inside the header"),
        (idx_bytes(np.zeros((2, 3), np.uint8))[:-1], "holds 5 bytes"),
        (idx_bytes(np.zeros((2, 3), np.uint8)) + b"\x00", "holds more bytes"),
        (b"\x00\x00\x0e\x03" + b"\xff" * 12, "more than the file can hold"),
    ],
)
def test_read_idx_invalid(tmp_path, content, match):
    path = tmp_path / "broken-idx"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=match) as excinfo:
        _mnist._read_idx(path)
    assert str(path) in str(excinfo.value)


def test_read_idx_huge_header_gzip(tmp_path):
    path = tmp_path / "huge-idx.gz"
    path.write_bytes(gzip.compress(b"\x00\x00\x08\x02" + b"\x00\x10\x00\x00" * 2))
    with pytest.raises(ValueError, match="more than the file can hold"):
        _mnist._read_idx(path)


def test_read_idx_corrupted_gzip(tmp_path):
    path = tmp_path / "broken-idx.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros((4, 4), np.uint8)))[:-6])
    with pytest.raises(ValueError, match="not a valid gzip file"):
        _mnist._read_idx(path)


def test_load_mnist_wrong_content(tmp_path):
    images, labels = synthetic_mnist(n=4)
    (tmp_path / TEST_FILES[0]).write_bytes(idx_bytes(images))
    (tmp_path / TEST_FILES[1]).write_bytes(idx_bytes(labels[:3]))
    with pytest.raises(ValueError, match="holds 4 images but .* holds 3 labels"):
        load_mnist("test", data_home=tmp_path)

    (tmp_path / TEST_FILES[1]).write_bytes(idx_bytes(images))
    with pytest.raises(ValueError, match="does not hold MNIST labels"):
        load_mnist("test", data_home=tmp_path)

    labels = labels.copy()
    labels[2] = 200
    (tmp_path / TEST_FILES[1]).write_bytes(idx_bytes(labels))
    with pytest.raises(ValueError, match="expected digits 0-9, got 200"):
        load_mnist("test", data_home=tmp_path)


def test_load_mnist_invalid_subset(tmp_path):
    with pytest.raises(ValueError, match="subset must be one of"):
        load_mnist("validation", data_home=tmp_path)


# --------------------------------------------------------------------------
# Download from (local) mirrors


def test_download_real_files(mnist_dir, http_root, monkeypatch, tmp_path):
    root, url, requests = http_root
    (root / "good").mkdir()
    for name in TEST_FILES:
        shutil.copy(mnist_dir / (name + ".gz"), root / "good")
    # The first mirror lacks the files (404), so the second one must be used.
    monkeypatch.setattr(_mnist, "MNIST_MIRRORS", (url + "empty/", url + "good/"))
    cache = tmp_path / "cache"

    X, y = load_mnist("test", data_home=cache, return_X_y=True)
    assert X.shape == (10000, 28, 28)
    assert np.bincount(y).tolist() == MNIST_TEST_COUNTS
    assert leftovers(cache) == sorted(name + ".gz" for name in TEST_FILES)
    assert len(requests) == 4

    # Cached: the second call does not reach the server.
    X2, y2 = load_mnist("test", data_home=cache, return_X_y=True)
    assert len(requests) == 4
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)


def test_download_only_missing_file(http_root, monkeypatch, tmp_path):
    root, url, requests = http_root
    images, labels = synthetic_mnist()
    (root / (TEST_FILES[1] + ".gz")).write_bytes(gzip.compress(idx_bytes(labels)))
    monkeypatch.setattr(_mnist, "MNIST_MIRRORS", (url,))
    monkeypatch.setitem(_mnist._SHA256, TEST_FILES[1], _sha256(idx_bytes(labels)))
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / TEST_FILES[0]).write_bytes(idx_bytes(images))

    X, y = load_mnist("test", data_home=cache, return_X_y=True)
    np.testing.assert_array_equal(X, images)
    np.testing.assert_array_equal(y, labels)
    assert requests == [f"/{TEST_FILES[1]}.gz"]


def test_download_uncompressed_response(http_root, monkeypatch, tmp_path):
    # A server may hand out the decompressed content under the .gz name;
    # it is kept under the name without suffix so that it is not mistaken
    # for a gzip file.
    root, url, _ = http_root
    images, labels = synthetic_mnist()
    for name, array in zip(TEST_FILES, (images, labels)):
        (root / (name + ".gz")).write_bytes(idx_bytes(array))
        monkeypatch.setitem(_mnist._SHA256, name, _sha256(idx_bytes(array)))
    monkeypatch.setattr(_mnist, "MNIST_MIRRORS", (url,))
    cache = tmp_path / "cache"

    X, _ = load_mnist("test", data_home=cache, return_X_y=True)
    np.testing.assert_array_equal(X, images)
    assert leftovers(cache) == sorted(TEST_FILES)


def test_download_checksum_mismatch(mnist_dir, http_root, monkeypatch, tmp_path):
    # Valid gzip, valid IDX, wrong content: checked against the real digests.
    root, url, _ = http_root
    shutil.copy(mnist_dir / (TEST_FILES[0] + ".gz"), root)
    _, labels = synthetic_mnist(n=10000)
    (root / (TEST_FILES[1] + ".gz")).write_bytes(gzip.compress(idx_bytes(labels)))
    monkeypatch.setattr(_mnist, "MNIST_MIRRORS", (url,))
    cache = tmp_path / "cache"

    with pytest.raises(OSError, match="Checksum mismatch") as excinfo:
        load_mnist("test", data_home=cache)
    message = str(excinfo.value)
    assert TEST_FILES[1] in message
    assert _mnist._SHA256[TEST_FILES[1]] in message
    assert _sha256(idx_bytes(labels)) in message
    assert "retry" in message
    assert not isinstance(excinfo.value, FileNotFoundError)
    # The verified images are kept; nothing of the bad labels is left.
    assert leftovers(cache) == [TEST_FILES[0] + ".gz"]


def test_download_corrupted_gzip(http_root, monkeypatch, tmp_path):
    root, url, _ = http_root
    images, _ = synthetic_mnist()
    truncated = gzip.compress(idx_bytes(images))[:-10]
    (root / (TEST_FILES[0] + ".gz")).write_bytes(truncated)
    monkeypatch.setattr(_mnist, "MNIST_MIRRORS", (url,))
    monkeypatch.setitem(_mnist._SHA256, TEST_FILES[0], _sha256(idx_bytes(images)))
    cache = tmp_path / "cache"

    with pytest.raises(OSError, match="Checksum mismatch.*unreadable content"):
        load_mnist("test", data_home=cache)
    assert leftovers(cache) == []


def test_download_next_mirror_after_bad_content(http_root, monkeypatch, tmp_path):
    root, url, requests = http_root
    images, labels = synthetic_mnist()
    (root / "bad").mkdir()
    (root / "good").mkdir()
    for name, array in zip(TEST_FILES, (images, labels)):
        (root / "bad" / (name + ".gz")).write_bytes(b"garbage")
        (root / "good" / (name + ".gz")).write_bytes(gzip.compress(idx_bytes(array)))
        monkeypatch.setitem(_mnist._SHA256, name, _sha256(idx_bytes(array)))
    monkeypatch.setattr(_mnist, "MNIST_MIRRORS", (url + "bad/", url + "good/"))
    cache = tmp_path / "cache"

    X, _ = load_mnist("test", data_home=cache, return_X_y=True)
    np.testing.assert_array_equal(X, images)
    assert len(requests) == 4
    assert leftovers(cache) == sorted(name + ".gz" for name in TEST_FILES)


def test_download_missing_everywhere(http_root, monkeypatch, tmp_path):
    _, url, requests = http_root
    monkeypatch.setattr(_mnist, "MNIST_MIRRORS", (url + "a/", url + "b/"))
    cache = tmp_path / "new" / "cache"

    with pytest.raises(FileNotFoundError) as excinfo:
        load_mnist("test", data_home=cache)
    message = str(excinfo.value)
    assert "t10k-images-idx3-ubyte" in message
    assert repr(str(cache)) in message
    assert "SKASSOC_MNIST_DIR" in message
    # The download was tried: no advice to allow it.
    assert "download_if_missing" not in message
    for mirror in ("a/", "b/"):
        assert f"{url}{mirror}t10k-images-idx3-ubyte.gz: HTTP Error 404" in message
    assert requests == [
        "/a/t10k-images-idx3-ubyte.gz",
        "/b/t10k-images-idx3-ubyte.gz",
    ]
    # The folders made for the download are removed again.
    assert not (tmp_path / "new").exists()


def test_no_download_when_not_allowed(http_root, monkeypatch, tmp_path):
    _, url, requests = http_root
    monkeypatch.setattr(_mnist, "MNIST_MIRRORS", (url,))
    with pytest.raises(FileNotFoundError, match="t10k-images-idx3-ubyte"):
        load_mnist("test", data_home=tmp_path / "cache", download_if_missing=False)
    with pytest.raises(FileNotFoundError, match="download_if_missing=True"):
        load_mnist("test", data_home=tmp_path / "cache", download_if_missing=False)
    assert requests == []
    assert not (tmp_path / "cache").exists()


# --------------------------------------------------------------------------
# load_svhn


def write_svhn(folder, name="train_32x32.mat", n=7, seed=0, **overrides):
    rng = np.random.RandomState(seed)
    X = rng.randint(0, 256, size=(32, 32, 3, n)).astype(np.uint8)
    y = (np.arange(n) % 10 + 1).astype(np.uint8).reshape(-1, 1)
    mat = {"X": X, "y": y, **overrides}
    scipy.io.savemat(folder / name, mat)
    return mat["X"], mat["y"]


def test_load_svhn(tmp_path):
    X, _ = write_svhn(tmp_path, n=12)
    bunch = load_svhn(data_home=tmp_path)
    assert bunch.data.shape == (12, 3, 32, 32)
    assert bunch.data.dtype == np.uint8
    assert bunch.data.flags.c_contiguous
    assert bunch.target.dtype == np.int64
    # Label 10 stands for the digit 0.
    assert bunch.target.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2]
    for i, c, h, w in [(0, 0, 0, 0), (3, 2, 5, 31), (11, 1, 30, 7)]:
        assert bunch.data[i, c, h, w] == X[h, w, c, i]
    np.testing.assert_array_equal(bunch.data, X.transpose(3, 2, 0, 1))
    assert bunch.data_home == str(tmp_path)
    assert "SVHN" in bunch.DESCR


@pytest.mark.parametrize(
    "subset, name",
    [("train", "train_32x32.mat"), ("test", "test_32x32.mat"),
     ("extra", "extra_32x32.mat")],
)  # fmt: skip
def test_load_svhn_subsets_and_env_var(tmp_path, no_env, monkeypatch, subset, name):
    X, _ = write_svhn(tmp_path, name=name, n=3)
    monkeypatch.setenv("SKASSOC_SVHN_DIR", str(tmp_path))
    data, target = load_svhn(subset, return_X_y=True)
    np.testing.assert_array_equal(data, X.transpose(3, 2, 0, 1))
    assert target.tolist() == [1, 2, 3]


def test_load_svhn_row_labels(tmp_path):
    # scipy.io.savemat stores 1-D arrays as rows.
    write_svhn(tmp_path, n=3, y=np.array([10, 1, 2], dtype=np.uint8))
    _, target = load_svhn(data_home=tmp_path, return_X_y=True)
    assert target.tolist() == [0, 1, 2]


def test_load_svhn_missing(no_env, tmp_path):
    with pytest.raises(FileNotFoundError) as excinfo:
        load_svhn("test")
    message = str(excinfo.value)
    assert "test_32x32.mat" in message
    assert repr(os.path.join(tmp_path / "sklearn_data", "svhn")) in message
    assert "http://ufldl.stanford.edu/housenumbers/" in message
    assert "SKASSOC_SVHN_DIR" in message


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"X": np.zeros((32, 32, 1, 7), np.uint8)}, "does not hold SVHN images"),
        ({"X": np.zeros((32, 32, 3, 7), np.float64)}, "does not hold SVHN images"),
        ({"y": np.ones((6, 1), np.uint8)}, r"expected 'y' of shape \(7, 1\)"),
        ({"y": np.ones((7, 2), np.uint8)}, r"expected 'y' of shape \(7, 1\)"),
        ({"y": np.zeros((7, 1), np.uint8)}, "labels 1-10"),
        ({"y": np.full((7, 1), 11.0)}, "labels 1-10"),
        (
            {"y": np.full((7, 1), 1.5)},
            r"labels 1-10 in 'y', got 7 other value\(s\), e.g. \[1.5",
        ),
        ({"y": np.full((7, 1), np.nan)}, "labels 1-10"),
    ],
)
def test_load_svhn_invalid(tmp_path, overrides, match):
    write_svhn(tmp_path, **overrides)
    with pytest.raises(ValueError, match=match):
        load_svhn(data_home=tmp_path)


@pytest.mark.parametrize("keep", [0.0, 0.05, 0.5, 0.99])
def test_load_svhn_truncated(tmp_path, keep):
    write_svhn(tmp_path)
    path = tmp_path / "train_32x32.mat"
    content = path.read_bytes()
    path.write_bytes(content[: int(len(content) * keep)])
    with pytest.raises(ValueError, match="train_32x32.mat.*download it again"):
        load_svhn(data_home=tmp_path)


def test_load_svhn_missing_variable(tmp_path):
    scipy.io.savemat(tmp_path / "train_32x32.mat", {"X": np.zeros((32, 32, 3, 1))})
    with pytest.raises(ValueError, match="expected variables 'X' and 'y'"):
        load_svhn(data_home=tmp_path)


def test_load_svhn_invalid_subset(tmp_path):
    with pytest.raises(ValueError, match="subset must be one of"):
        load_svhn("valid", data_home=tmp_path)


# --------------------------------------------------------------------------
# make_semi_supervised_labels


def test_semi_supervised_counts():
    y = np.repeat(np.arange(4), [10, 20, 5, 7])
    y_semi = make_semi_supervised_labels(y, 3, random_state=0)
    assert y_semi.dtype == y.dtype
    assert y_semi.shape == y.shape
    assert (y_semi == -1).sum() == y.size - 4 * 3
    for c in range(4):
        assert (y_semi == c).sum() == 3
    # Kept labels are where they were; y itself is untouched.
    kept = y_semi != -1
    np.testing.assert_array_equal(y_semi[kept], y[kept])
    assert (y != -1).all()


def test_semi_supervised_all_labeled_when_asking_class_size():
    y = np.array([0, 0, 1, 1])
    np.testing.assert_array_equal(make_semi_supervised_labels(y, 2), y)


def test_semi_supervised_determinism():
    y = np.tile(np.arange(10), 50)
    a = make_semi_supervised_labels(y, 4, random_state=42)
    b = make_semi_supervised_labels(y, 4, random_state=42)
    c = make_semi_supervised_labels(y, 4, random_state=43)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    rng = np.random.RandomState(42)
    np.testing.assert_array_equal(
        make_semi_supervised_labels(y, 4, random_state=rng), a
    )


def test_semi_supervised_string_labels():
    y = ["cat", "dog", "cat", "bird", "dog", "cat", "bird"]
    y_semi = make_semi_supervised_labels(y, 1, random_state=0)
    assert y_semi.dtype == object
    assert sorted(v for v in y_semi.tolist() if v != -1) == ["bird", "cat", "dog"]
    assert y_semi.tolist().count(-1) == 4

    y_semi = make_semi_supervised_labels(y, 2, unlabeled_label="?", random_state=0)
    assert y_semi.tolist().count("?") == 1


@pytest.mark.parametrize(
    "y, unlabeled_label, dtype",
    [
        (np.array([1, 2, 1, 2], np.int32), -1, np.int32),
        (np.array([1, 2, 1, 2], np.uint8), -1, np.int16),
        (np.array([1.0, 2.0, 1.0, 2.0], np.float32), -1, np.float32),
        (np.array([1, 2, 1, 2]), "unlabeled", object),
    ],
)
def test_semi_supervised_dtype(y, unlabeled_label, dtype):
    y_semi = make_semi_supervised_labels(
        y, 1, random_state=0, unlabeled_label=unlabeled_label
    )
    assert y_semi.dtype == dtype
    assert sum(v == unlabeled_label for v in y_semi.tolist()) == 2


def test_semi_supervised_errors():
    y = np.array([0, 0, 0, 1, 1, 2])
    with pytest.raises(ValueError, match=r"classes: 1 \(2\), 2 \(1\)"):
        make_semi_supervised_labels(y, 3)
    with pytest.raises(ValueError, match="already contains the unlabeled marker"):
        make_semi_supervised_labels(np.array([0, 1, -1]), 1)
    with pytest.raises(ValueError, match="already contains the unlabeled marker"):
        make_semi_supervised_labels(["a", "b", "?"], 1, unlabeled_label="?")
    # The estimator reads "-1" in string labels as unlabeled too.
    for strings in (np.array(["a", "-1", "b"]), np.array(["a", "-1", "b"], object)):
        with pytest.raises(ValueError, match="unlabeled marker '-1'"):
            make_semi_supervised_labels(strings, 1)
    with pytest.raises(ValueError, match="all strings or all numbers"):
        make_semi_supervised_labels(np.array(["a", 1, "a", 1], object), 1)
    for bad in (0, -2, 1.5, True, "3"):
        with pytest.raises(ValueError, match="labeled_per_class must be"):
            make_semi_supervised_labels(y, bad)
    with pytest.raises(ValueError, match="must be 1-D"):
        make_semi_supervised_labels(y.reshape(2, 3), 1)


# --------------------------------------------------------------------------
# load_stl10 on small synthetic binary files

STL10_NAMES = [
    "airplane", "bird", "car", "cat", "deer",
    "dog", "horse", "monkey", "ship", "truck",
]  # fmt: skip


def write_stl10(folder, subset="train", n=7, seed=0, labels=None, class_names=None):
    """Write STL-10 files of ``n`` random images; return them as (n, 3, 96, 96).

    The images are returned indexed ``[image, channel, row, column]`` and
    written as the official files store them: every channel column by column.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(seed)
    images = rng.randint(0, 256, size=(n, 3, 96, 96)).astype(np.uint8)
    images.swapaxes(2, 3).tofile(folder / f"{subset}_X.bin")
    if subset != "unlabeled":
        if labels is None:
            labels = np.arange(n) % 10 + 1
        np.asarray(labels, dtype=np.uint8).tofile(folder / f"{subset}_y.bin")
    if class_names is not None:
        (folder / "class_names.txt").write_text("\n".join(class_names) + "\n")
    return images


def test_load_stl10_column_major_pixels(tmp_path):
    # One bright pixel per image at a known place of the file: the files store
    # image i, channel k, column c, row r at byte i*27648 + k*9216 + c*96 + r.
    spots = [(0, 0, 0, 1), (1, 2, 5, 90), (2, 1, 95, 3), (3, 0, 40, 41)]
    raw = np.zeros(len(spots) * 3 * 96 * 96, dtype=np.uint8)
    for value, (i, k, r, c) in enumerate(spots, start=1):
        raw[i * 27648 + k * 9216 + c * 96 + r] = value
    raw.tofile(tmp_path / "test_X.bin")
    np.arange(1, len(spots) + 1, dtype=np.uint8).tofile(tmp_path / "test_y.bin")
    for mmap in (False, True):
        data, _ = load_stl10("test", data_home=tmp_path, return_X_y=True, mmap=mmap)
        assert data.shape == (len(spots), 3, 96, 96)
        for value, (i, k, r, c) in enumerate(spots, start=1):
            assert data[i, k, r, c] == value
            assert data[i].sum() == value  # and nowhere else


def test_load_stl10_train(tmp_path):
    images = write_stl10(tmp_path, "train", n=7)
    bunch = load_stl10(data_home=tmp_path)
    assert bunch.data.shape == (7, 3, 96, 96)
    assert bunch.data.dtype == np.uint8
    assert bunch.data.flags.c_contiguous
    assert not isinstance(bunch.data, np.memmap)
    np.testing.assert_array_equal(bunch.data, images)
    # Labels 1-10 of the files become 0-9.
    assert bunch.target.dtype == np.int64
    assert bunch.target.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert bunch.target_names == STL10_NAMES
    assert bunch.data_home == str(tmp_path)
    assert "STL-10" in bunch.DESCR


def test_load_stl10_test_return_X_y(tmp_path):
    images = write_stl10(tmp_path, "test", n=12, seed=1)
    X, y = load_stl10("test", data_home=tmp_path, return_X_y=True)
    np.testing.assert_array_equal(X, images)
    assert y.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]


@pytest.mark.parametrize("mmap", ["auto", True])
def test_load_stl10_unlabeled_memmap(tmp_path, mmap):
    images = write_stl10(tmp_path, "unlabeled", n=5, seed=2)
    bunch = load_stl10("unlabeled", data_home=tmp_path, mmap=mmap)
    data = bunch.data
    # A read-only view of a memory map of the file, not a copy in memory.
    assert isinstance(data, np.memmap)
    assert data.shape == (5, 3, 96, 96)
    assert data.dtype == np.uint8
    assert not data.flags.writeable
    assert not data.flags.owndata
    np.testing.assert_array_equal(data, images)
    with pytest.raises(ValueError, match="read-only"):
        data[0, 0, 0, 0] = 1
    assert bunch.target.dtype == np.int64
    assert bunch.target.tolist() == [-1] * 5
    assert bunch.target_names == STL10_NAMES


def test_load_stl10_mmap_options(tmp_path):
    images = write_stl10(tmp_path, "unlabeled", n=3)
    data, target = load_stl10(
        "unlabeled", data_home=tmp_path, return_X_y=True, mmap=False
    )
    assert not isinstance(data, np.memmap)
    assert data.flags.c_contiguous and data.flags.writeable
    np.testing.assert_array_equal(data, images)
    assert target.tolist() == [-1, -1, -1]

    images = write_stl10(tmp_path, "train", n=3)
    data, _ = load_stl10("train", data_home=tmp_path, return_X_y=True, mmap=True)
    assert isinstance(data, np.memmap)
    np.testing.assert_array_equal(data, images)
    for bad in ("yes", None, 1):
        with pytest.raises(ValueError, match="mmap must be 'auto', True or False"):
            load_stl10("train", data_home=tmp_path, mmap=bad)


def test_load_stl10_class_names_file(tmp_path):
    names = [f"class {i}" for i in range(10)]
    write_stl10(tmp_path, "test", n=3, class_names=names)
    assert load_stl10("test", data_home=tmp_path).target_names == names

    write_stl10(tmp_path, "test", n=3, class_names=names[:9])
    with pytest.raises(ValueError, match="expected 10 non-empty lines, got 9"):
        load_stl10("test", data_home=tmp_path)


def test_load_stl10_stl10_binary_subfolder(tmp_path):
    # The archive extracts to stl10_binary/: its parent folder is accepted too.
    images = write_stl10(tmp_path / "stl10_binary", "train", n=4)
    bunch = load_stl10("train", data_home=tmp_path)
    np.testing.assert_array_equal(bunch.data, images)
    assert bunch.data_home == str(tmp_path / "stl10_binary")
    bunch = load_stl10("train", data_home=tmp_path / "stl10_binary")
    assert bunch.data_home == str(tmp_path / "stl10_binary")


@pytest.mark.parametrize("subset", ["train", "test", "unlabeled"])
def test_load_stl10_env_var(tmp_path, no_env, monkeypatch, subset):
    images = write_stl10(tmp_path / "stl", subset, n=3)
    monkeypatch.setenv("SKASSOC_STL10_DIR", str(tmp_path / "stl"))
    data, target = load_stl10(subset, return_X_y=True)
    np.testing.assert_array_equal(data, images)
    expected = [-1, -1, -1] if subset == "unlabeled" else [0, 1, 2]
    assert target.tolist() == expected


def test_load_stl10_data_home_beats_env_var(tmp_path, no_env, monkeypatch):
    write_stl10(tmp_path, "test", n=2)
    monkeypatch.setenv("SKASSOC_STL10_DIR", str(tmp_path / "elsewhere"))
    assert load_stl10("test", data_home=tmp_path).data_home == str(tmp_path)


def test_load_stl10_missing(no_env, tmp_path):
    with pytest.raises(FileNotFoundError) as excinfo:
        load_stl10("unlabeled")
    message = str(excinfo.value)
    assert "unlabeled_X.bin" in message
    assert repr(os.path.join(tmp_path / "sklearn_data", "stl10")) in message
    assert "stl10_binary" in message
    assert "https://cs.stanford.edu/~acoates/stl10/" in message
    assert "SKASSOC_STL10_DIR" in message


def test_load_stl10_missing_labels(tmp_path):
    write_stl10(tmp_path, "train", n=2)
    (tmp_path / "train_y.bin").unlink()
    with pytest.raises(FileNotFoundError, match="'train_y.bin' was not found"):
        load_stl10("train", data_home=tmp_path)


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", r"size \(0 bytes\) is not a positive multiple of 3\*96\*96"),
        (b"\x00" * (27648 + 5), r"size \(27653 bytes\) is not a positive multiple"),
    ],
)
@pytest.mark.parametrize("mmap", [False, True])
def test_load_stl10_bad_image_file_size(tmp_path, content, match, mmap):
    (tmp_path / "unlabeled_X.bin").write_bytes(content)
    with pytest.raises(ValueError, match=match) as excinfo:
        load_stl10("unlabeled", data_home=tmp_path, mmap=mmap)
    assert "unlabeled_X.bin" in str(excinfo.value)


@pytest.mark.parametrize(
    "labels, match",
    [
        ([1, 2], "holds 3 images but .* holds 2 labels"),
        ([1, 2, 3, 4], "holds 3 images but .* holds 4 labels"),
        ([0, 1, 2], "expected values 1-10, got values from 0 to 2"),
        ([1, 11, 2], "expected values 1-10, got values from 1 to 11"),
    ],
)
def test_load_stl10_bad_labels(tmp_path, labels, match):
    write_stl10(tmp_path, "train", n=3, labels=labels)
    with pytest.raises(ValueError, match=match):
        load_stl10("train", data_home=tmp_path)


def test_load_stl10_invalid_subset(tmp_path):
    with pytest.raises(ValueError, match="subset must be one of"):
        load_stl10("extra", data_home=tmp_path)
