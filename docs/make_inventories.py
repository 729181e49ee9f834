"""Write the intersphinx inventories of ``docs/_inventories/``.

The docs link to Python, NumPy, scikit-learn, PyTorch, matplotlib, pandas,
joblib and Dask objects through intersphinx, which reads each project's
``objects.inv``. Those files are not downloaded (the build runs offline):
this script writes small ones, in Sphinx's inventory format, for exactly the
objects the docs refer to, each with its real online URL.

A build that fails with ``py:class reference target not found: X`` (nitpicky
mode, see conf.py) refers to a foreign object missing here: add it to
``OBJECTS`` below and run, from the repository root::

    python docs/make_inventories.py

Each file is checked by reading it back with Sphinx's own inventory reader.
"""

import zlib
from pathlib import Path

OUT = Path(__file__).resolve().parent / "_inventories"

# project: (title, version, [(name, domain:role, uri relative to the base URL
# of conf.py's intersphinx_mapping)]). A "$" in a uri stands for the name (as
# in Sphinx's own inventories); a None uri is filled in from the project's
# usual layout of generated pages (see _default_uri).
OBJECTS = {
    "python": (
        "Python",
        "3",
        [
            ("pickle", "py:module", "library/pickle.html#module-pickle"),
            ("json", "py:module", "library/json.html#module-json"),
            ("os.PathLike", "py:class", "library/os.html#os.PathLike"),
            ("str.format", "py:method", "library/stdtypes.html#$"),
            ("dict", "py:class", "library/stdtypes.html#dict"),
            ("list", "py:class", "library/stdtypes.html#list"),
            ("tuple", "py:class", "library/stdtypes.html#tuple"),
            ("str", "py:class", "library/stdtypes.html#str"),
            ("int", "py:class", "library/functions.html#int"),
            ("float", "py:class", "library/functions.html#float"),
            ("bool", "py:class", "library/functions.html#bool"),
            ("object", "py:class", "library/functions.html#object"),
        ]
        + [
            (name, "py:exception", f"library/exceptions.html#{name}")
            for name in (
                "Exception",
                "ValueError",
                "TypeError",
                "RuntimeError",
                "OSError",
                "FileNotFoundError",
                "ImportError",
                "KeyError",
                "IndexError",
                "NotImplementedError",
                "MemoryError",
                "AttributeError",
            )
        ]
        + [
            (name, "py:exception", f"library/exceptions.html#{name}")
            for name in ("UserWarning", "RuntimeWarning", "DeprecationWarning")
        ],
    ),
    "numpy": (
        "NumPy",
        "stable",
        [
            ("numpy.memmap", "py:class", None),
            ("numpy.ndarray", "py:class", None),
            ("numpy.random.RandomState", "py:class", None),
            ("numpy.random.Generator", "py:class", None),
            ("numpy.concatenate", "py:function", None),
            ("numpy.load", "py:function", None),
        ],
    ),
    "sklearn": (
        "scikit-learn",
        "stable",
        [
            ("sklearn.semi_supervised", "py:module", "api/$.html"),
            ("sklearn.model_selection", "py:module", "api/$.html"),
            ("sklearn.utils.Bunch", "py:class", None),
            ("sklearn.semi_supervised.LabelSpreading", "py:class", None),
            ("sklearn.semi_supervised.SelfTrainingClassifier", "py:class", None),
            ("sklearn.pipeline.Pipeline", "py:class", None),
            ("sklearn.model_selection.GridSearchCV", "py:class", None),
            ("sklearn.model_selection.HalvingGridSearchCV", "py:class", None),
            ("sklearn.model_selection.RandomizedSearchCV", "py:class", None),
            ("sklearn.model_selection.StratifiedKFold", "py:class", None),
            ("sklearn.model_selection.KFold", "py:class", None),
            ("sklearn.model_selection.RepeatedKFold", "py:class", None),
            ("sklearn.utils.class_weight.compute_class_weight", "py:function", None),
            ("sklearn.metrics.make_scorer", "py:function", None),
            ("sklearn.preprocessing.LabelEncoder", "py:class", None),
            ("sklearn.preprocessing.OneHotEncoder", "py:class", None),
            ("sklearn.feature_extraction.text.TfidfVectorizer", "py:class", None),
            ("sklearn.feature_extraction.text.CountVectorizer", "py:class", None),
            ("sklearn.neural_network.MLPClassifier", "py:class", None),
            ("sklearn.model_selection.RepeatedStratifiedKFold", "py:class", None),
            ("sklearn.model_selection.cross_val_score", "py:function", None),
            ("sklearn.model_selection.cross_val_predict", "py:function", None),
            ("sklearn.model_selection.cross_validate", "py:function", None),
            ("sklearn.linear_model.LogisticRegression", "py:class", None),
            ("sklearn.frozen.FrozenEstimator", "py:class", None),
            ("sklearn.calibration.CalibratedClassifierCV", "py:class", None),
            ("sklearn.ensemble.StackingClassifier", "py:class", None),
            ("sklearn.ensemble.VotingClassifier", "py:class", None),
            ("sklearn.exceptions.NotFittedError", "py:class", None),
            ("sklearn.exceptions.NotFittedError", "py:exception", None),
            ("sklearn.datasets.load_digits", "py:function", None),
            ("sklearn.base.BaseEstimator", "py:class", None),
            # Referred to by the methods the estimator inherits.
            ("sklearn.set_config", "py:function", None),
            ("sklearn.utils.metadata_routing.MetadataRequest", "py:class", None),
            ("sklearn.base.ClassifierMixin", "py:class", None),
            ("sklearn.base.TransformerMixin", "py:class", None),
        ],
    ),
    "torch": (
        "PyTorch",
        "stable",
        [
            ("torch.compile", "py:function", None),
            ("torch.save", "py:function", None),
            ("torch.load", "py:function", None),
            ("torch.manual_seed", "py:function", None),
            ("torch.set_num_threads", "py:function", None),
            ("torch.nn.Module", "py:class", None),
            ("torch.Tensor", "py:class", "tensors.html#$"),
            ("torch.device", "py:class", "tensor_attributes.html#$"),
            ("torch.dtype", "py:class", "tensor_attributes.html#$"),
            ("torch.Generator", "py:class", None),
            ("torch.utils.data.DataLoader", "py:class", "data.html#$"),
            (
                "torch.utils.tensorboard.SummaryWriter",
                "py:class",
                "tensorboard.html#$",
            ),
        ],
    ),
    "matplotlib": (
        "Matplotlib",
        "stable",
        [
            ("matplotlib.figure.Figure", "py:class", None),
            ("matplotlib.axes.Axes", "py:class", None),
        ],
    ),
    "pandas": (
        "pandas",
        "stable",
        [
            ("pandas.DataFrame", "py:class", None),
            ("pandas.Series", "py:class", None),
        ],
    ),
    "joblib": (
        "joblib",
        "stable",
        [
            ("joblib", "py:module", "index.html"),
            ("joblib.parallel_backend", "py:function", None),
            ("joblib.Parallel", "py:class", None),
        ],
    ),
    "distributed": (
        "Dask.distributed",
        "stable",
        [
            ("distributed.Client", "py:class", "api.html#$"),
        ],
    ),
}


def _default_uri(project, name, role):
    """The page of ``name`` in the usual layout of ``project``'s API docs."""
    pages = {
        "numpy": "reference/generated/$.html#$",
        "sklearn": "modules/generated/$.html#$",
        "torch": "generated/$.html#$",
        "matplotlib": "api/_as_gen/$.html#$",
        "pandas": "reference/api/$.html#$",
        "joblib": "generated/$.html#$",
    }
    if project not in pages:
        raise ValueError(f"{project}: give the uri of {name} ({role})")
    return pages[project]


def inventory_bytes(project_title, version, entries):
    """An ``objects.inv`` (Sphinx inventory version 2) for ``entries``."""
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project_title}\n"
        f"# Version: {version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    ).encode()
    lines = []
    for name, role, uri in sorted(entries):
        # Priority 1 (object), display name "-" (the name itself). Sphinx
        # expands only a trailing "$" (an anchor that ends in the name).
        page, _, anchor = uri.replace("$", name).partition("#")
        if anchor:
            page += "#" + ("$" if anchor == name else anchor)
        lines.append(f"{name} {role} 1 {page} -\n")
    return header + zlib.compress("".join(lines).encode(), 9)


def main():
    from sphinx.util.inventory import InventoryFile

    OUT.mkdir(exist_ok=True)
    for project, (title, version, objects) in OBJECTS.items():
        entries = [
            (name, role, uri or _default_uri(project, name, role))
            for name, role, uri in objects
        ]
        data = inventory_bytes(title, version, entries)
        path = OUT / f"{project}.inv"
        path.write_bytes(data)
        # Read it back as intersphinx will.
        inventory = InventoryFile.loads(data, uri="https://example.invalid/")
        count = sum(len(items) for items in inventory.data.values())
        assert count == len(set(entries)), (project, count, len(entries))
        print(f"{path.relative_to(OUT.parent.parent)}: {count} objects")


if __name__ == "__main__":
    main()
