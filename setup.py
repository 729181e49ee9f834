from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
version = {}
for line in (HERE / "skassoc" / "_version.py").read_text().splitlines():
    if line.startswith("__version__"):
        exec(line, version)

setup(
    name="skassoc",
    version=version["__version__"],
    description=(
        "Semi-supervised learning by association (Haeusser et al., CVPR 2017) "
        "as a scikit-learn estimator on PyTorch"
    ),
    long_description=(HERE / "README.rst").read_text(),
    long_description_content_type="text/x-rst",
    license="BSD-3-Clause",
    packages=find_packages(include=["skassoc", "skassoc.*"]),
    python_requires=">=3.10",
    install_requires=[
        "numpy>=1.23",
        "scikit-learn>=1.6",
        # load_svhn reads MATLAB files (scikit-learn depends on it as well).
        "scipy>=1.9",
        "torch>=2.2",
        "joblib>=1.2",
        "tqdm>=4.60",
    ],
    extras_require={
        "tests": [
            "pytest>=7",
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
        ],
        "examples": ["matplotlib>=3.7", "pillow>=9"],
        # skassoc.export.export_onnx; torch >= 2.5 exports through onnxscript.
        "onnx": ["onnx", "onnxscript"],
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
        "License :: OSI Approved :: BSD License",
    ],
)
