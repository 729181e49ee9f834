import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
version = {}
for line in (HERE / "skassoc" / "_version.py").read_text().splitlines():
    if line.startswith("__version__"):
        exec(line, version)

# An image directive and its indented options, up to the next blank line.
_IMAGE = re.compile(r"^\.\. image::.*\n(?:[ \t]+\S.*\n)*\n?", re.MULTILINE)


def long_description():
    """README.rst without its image.

    The image's path is relative to the repository, which a package index page
    cannot show; the project has no public address to point it to instead.
    """
    text = (HERE / "README.rst").read_text(encoding="utf-8")
    return _IMAGE.sub("", text)


setup(
    name="skassoc",
    version=version["__version__"],
    description=(
        "Semi-supervised learning by association (Haeusser et al., CVPR 2017) "
        "as a scikit-learn estimator on PyTorch"
    ),
    long_description=long_description(),
    long_description_content_type="text/x-rst",
    # An SPDX expression (PEP 639) instead of a license classifier, which
    # setuptools deprecates; pyproject.toml asks for a setuptools that knows it.
    license_expression="BSD-3-Clause",
    license_files=["LICENSE"],
    packages=find_packages(include=["skassoc", "skassoc.*"]),
    python_requires=">=3.10",
    install_requires=[
        "numpy>=1.23",
        "scikit-learn>=1.6",
        # Sparse inputs, fit_report_'s binomial and normal tails, and
        # load_svhn's MATLAB files (scikit-learn depends on it as well).
        "scipy>=1.9",
        # 2.6 fixed a code-execution bypass of torch.load(weights_only=True)
        # (CVE-2025-32434); model files no longer use torch.load, but a user's
        # own torch.load calls should not run on a torch with a known hole.
        "torch>=2.6",
        # Model files store weights as safetensors: a reader with no code path
        # at all (torch.load goes through an unpickler).
        "safetensors>=0.4.3",
        "joblib>=1.2",
        "tqdm>=4.60",
    ],
    extras_require={
        "tests": [
            "pytest>=7",
            # The suite's fits run on one torch thread each; pytest-xdist
            # runs them on every core (-n auto), a module per worker
            # (--dist loadscope: a module's spawned processes start once).
            "pytest-xdist>=3",
            "pandas>=1.5",
            "scipy>=1.9",
            "hypothesis>=6.0",
            "matplotlib>=3.7",
            "pillow>=9",
            "ruff>=0.4",
            "dask[distributed]>=2023.1",
            # tests/test_onnx.py (tested with onnx 1.23, onnxruntime 1.32,
            # onnxscript 0.7 on torch 2.13).
            "onnx",
            "onnxruntime",
            "onnxscript",
            # tests/test_tensorboard.py reads the event files back.
            "tensorboard>=2.17.1",
        ],
        "examples": ["matplotlib>=3.7", "pillow>=9"],
        # skassoc.datasets.make_synthetic_digits draws the digits of fonts.
        "datasets": ["pillow>=9"],
        # skassoc.export.export_onnx; torch >= 2.5 exports through onnxscript.
        "onnx": ["onnx", "onnxscript"],
        # skassoc.callbacks.TensorBoard writes through torch.utils.tensorboard
        # (which asks for 1.15); TensorBoard before 2.17.1 cannot read event
        # files under NumPy 2 (it uses the removed np.string_).
        "tensorboard": ["tensorboard>=2.17.1"],
        # The docs build offline (MathJax and the intersphinx inventories
        # ship in docs/); it runs the gallery and tests/test_docs.py runs
        # the pages' code, hence matplotlib, Pillow and pandas.
        "docs": [
            "sphinx>=7",
            "numpydoc>=1.6",
            "sphinx-gallery>=0.15",
            "matplotlib>=3.7",
            "pillow>=9",
            "pandas>=1.5",
            "pytest>=7",
        ],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
