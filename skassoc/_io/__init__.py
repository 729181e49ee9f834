"""Files that skassoc writes and reads: model files and their safe reading.

One job a module, from the bottom up:

- ``_atomic``: write a file whole or not at all, beside its target.
- ``_format``: what a model file is (its members and versions).
- ``_limits``: what a model file may describe and ask of a refit.
- ``_weights``: the weights member, matched to the network before a read.
- ``_training_state``: the optional training-state member (a checkpoint's
  optimizer, schedule and random streams), matched before a read.
- ``_refit_cost``: the memory and work that a file's parameters would ask.
- ``_archive``: the zip container, written and read back within bounds.
- ``_metadata``: the fields of ``metadata.json``, encoded and checked.
- ``_model_file``: ``save_model`` and ``load_model``.
- ``_legacy``: files of formats 1 and 2, read without unpickling and
  converted.
- ``_checkpoint``: the ``Checkpoint`` callback, which saves a model file
  with its training state during a fit.
"""
