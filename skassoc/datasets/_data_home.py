"""Where a loader looks for its files: argument, environment variable, default."""

import os

from sklearn.datasets import get_data_home

__all__ = ["resolve_data_home"]


def resolve_data_home(data_home, env_var, subfolder):
    """The folder to read from, as an absolute path.

    ``data_home`` when given, else the environment variable ``env_var`` when
    set, else ``subfolder`` of scikit-learn's data home.
    """
    if data_home is not None:
        return os.path.abspath(os.path.expanduser(os.fspath(data_home)))
    from_env = os.environ.get(env_var)
    if from_env:
        return os.path.abspath(os.path.expanduser(from_env))
    return os.path.join(get_data_home(), subfolder)
