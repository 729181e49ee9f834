"""The package's metadata and archives: license, extras, long description and
the files a source archive must carry for its own tests."""

import re
import runpy
import sys
import warnings
from pathlib import Path

import pytest

# Python 3.12's venv installs no setuptools; these tests read its metadata.
setuptools = pytest.importorskip("setuptools")
from setuptools.command.egg_info import FileList  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: Folders the tests read besides the package (docs pages and examples for
#: test_docs.py, benchmark scripts and results for test_benchmarks.py and
#: test_bench_mnist.py), less what a build or a run leaves there.
TESTED_FOLDERS = ("docs", "benchmarks", "examples", "tests")
BUILD_OUTPUTS = re.compile(
    r"(^|/)(__pycache__|_build|auto_examples|generated)(/|$)|\.py[cod]$|\.shard"
)


@pytest.fixture(scope="module")
def setup_kwargs():
    """The keyword arguments that setup.py passes to ``setuptools.setup``."""
    captured = {}
    original = setuptools.setup
    setuptools.setup = lambda **kwargs: captured.update(kwargs)
    try:
        runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    finally:
        setuptools.setup = original
    return captured


def test_license_file_is_bsd_3_clause():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("BSD 3-Clause License")
    assert "Copyright (c) 2026, skassoc developers" in text
    assert "Neither the name of the copyright holder" in text


def test_license_metadata_is_an_spdx_expression(setup_kwargs, monkeypatch):
    """PEP 639 metadata, which setuptools accepts without a deprecation
    warning (a license classifier gets one)."""
    # Older setuptools (Python 3.10/3.11 venvs) warn on license_expression.
    pytest.importorskip("setuptools", minversion="77.0.3")
    assert setup_kwargs["license_expression"] == "BSD-3-Clause"
    assert setup_kwargs["license_files"] == ["LICENSE"]
    assert "license" not in setup_kwargs
    classifiers = setup_kwargs.get("classifiers", [])
    assert not [c for c in classifiers if c.startswith("License ::")]
    monkeypatch.chdir(ROOT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = setuptools.Distribution(dict(setup_kwargs))
        dist.parse_config_files(filenames=[])
    assert dist.metadata.license_expression == "BSD-3-Clause"
    assert dist.metadata.license_files == ["LICENSE"]


def test_build_system_asks_for_a_setuptools_with_license_expressions():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    floor = re.search(r'requires = \["setuptools>=([\d.]+)"\]', text)
    assert floor, "pyproject.toml's build-system should require setuptools>=..."
    # setuptools 77.0 added license expressions, 77.0.3 fixed their import.
    assert tuple(map(int, floor.group(1).split("."))) >= (77, 0, 3)


def test_long_description_leaves_out_the_relative_image(setup_kwargs):
    """A package index page cannot show an image by a path in the repository."""
    readme = (ROOT / "README.rst").read_text(encoding="utf-8")
    assert ".. image:: docs/" in readme
    description = setup_kwargs["long_description"]
    assert ".. image::" not in description
    assert ":alt:" not in description and ":width:" not in description
    # Everything else stays.
    assert description.startswith(readme.split(".. image::")[0])
    assert description.endswith(readme.split(".. image::")[1].split("\n\n", 1)[1])


def test_long_description_renders_without_warnings(setup_kwargs):
    """A package index shows reStructuredText with a warning as plain text."""
    import io

    docutils_core = pytest.importorskip("docutils.core")
    warnings_seen = io.StringIO()
    docutils_core.publish_string(
        setup_kwargs["long_description"],
        writer_name="html",
        settings_overrides={"warning_stream": warnings_seen, "report_level": 2},
    )
    assert warnings_seen.getvalue() == ""


def test_pillow_extra_for_synthetic_digits(setup_kwargs, monkeypatch):
    from skassoc.datasets import make_synthetic_digits

    assert any(
        r.startswith("pillow") for r in setup_kwargs["extras_require"]["datasets"]
    )
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ImportError, match=r'pip install "skassoc\[datasets\]"'):
        make_synthetic_digits(5)


def _manifest_files():
    """The files MANIFEST.in selects from the working tree, as sdist would."""
    files = FileList()
    files.findall(str(ROOT))
    for line in (ROOT / "MANIFEST.in").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            with warnings.catch_warnings():
                # "no files found matching ..." for what this tree lacks.
                warnings.simplefilter("ignore")
                files.process_template_line(line)
    return {Path(name).as_posix() for name in files.files}


def test_source_archive_carries_what_the_tests_read():
    selected = _manifest_files()
    expected = {
        path.relative_to(ROOT).as_posix()
        for folder in TESTED_FOLDERS
        for path in (ROOT / folder).rglob("*")
        if path.is_file()
    }
    expected = {name for name in expected if not BUILD_OUTPUTS.search(name)}
    assert expected, "no files found to check"
    assert sorted(expected - selected) == []
    assert {"LICENSE", "README.rst", "benchmarks/results/mnist_cuda.json"} <= selected
    assert not [name for name in selected if BUILD_OUTPUTS.search(name)]
