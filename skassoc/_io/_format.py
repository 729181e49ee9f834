"""What a model file is: a file that holds no pickle and runs nothing.

A model file (format 3) is one zip archive, starting at its first byte, with
two members, a third one optionally, and no others:

``metadata.json``
    The format name and version, the skassoc and torch versions that wrote
    it, the estimator's hyperparameters and output configuration
    (``set_output``), the network's description, the classes and the class
    frequencies that predictions assume, the training history and the
    SHA-256 of ``weights.safetensors``.
``weights.safetensors``
    The network's ``state_dict`` on the CPU in the safetensors format,
    stored uncompressed.
``training_state.safetensors`` (optional)
    What continuing the run needs (``training_state_``): Adam's moments,
    the moving average of the weights, the balance loss's estimate and the
    random streams, in the safetensors format, stored uncompressed; its
    scalars (steps, sampler position) and SHA-256 are the ``training_state``
    entry of ``metadata.json``. Only ``save(path, training_state=True)`` and
    checkpoints write it; files without it are as before, and a skassoc
    that predates it refuses a file with it as holding an unknown member.

What a file may do when it is loaded, and what it may not:

- It is read as data: JSON, and tensors through safetensors; nothing in it
  is imported, executed or unpickled.
- It describes a built-in network only. The description is checked against
  limits, and the names, shapes and dtypes in the weights' header against
  the network built on torch's meta device (which allocates nothing),
  *before* any tensor is read; so a small file cannot make the process
  allocate much more than its own size. Weights must be finite float32
  tensors (integer counters of batch norm aside). A training state is
  checked the same way, against the network's parameters, the classes and
  the fixed sizes of torch's generator states, before any of its tensors
  is read.
- Each hyperparameter is taken only from a safe list, each within a bounded
  domain (see ``_limits``), and together they may not ask a refit for more
  than a budget of memory and work (see ``_refit_cost``). ``compile`` and
  ``device``, which reach a compiler and the hardware, are never taken from
  a file: ``compile`` is off and ``device`` is ``load``'s argument; a file
  that sets them gets a warning.

Files of formats 1 and 2 stored the weights with :func:`torch.save`, whose
reader unpickles; ``load_model`` refuses them, and ``convert_model_file``
converts them once, reading the old weights without unpickling (see
``_legacy``).
"""

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "METADATA_MEMBER",
    "WEIGHTS_MEMBER",
    "LEGACY_WEIGHTS_MEMBER",
    "TRAINING_STATE_MEMBER",
    "InvalidModelFile",
]

FORMAT_NAME = "skassoc-model"
#: Bump on any change that an older skassoc could not read correctly.
#: Version 2 added the class frequencies (``class_prior``); version 3 stores
#: the weights as safetensors instead of a torch pickle, and the output
#: configuration of ``set_output``. The optional training state needs no new
#: version: a file without it is unchanged, and an older reader of version
#: 3 refuses one with it (an unknown member) rather than misread it.
FORMAT_VERSION = 3
METADATA_MEMBER = "metadata.json"
# Why safetensors: its reader has no code path at all (a JSON header of
# names, dtypes, shapes and byte offsets, then the raw bytes), it has no
# strides or views (a tensor is exactly its bytes, so a small file cannot
# claim a large tensor), and it checks every offset against the buffer.
# NumPy's npz with allow_pickle=False is pickle-free too, but it is a zip
# of .npy files inside our zip, each with a header that allows any dtype,
# Fortran order and object arrays (refused only by a flag).
WEIGHTS_MEMBER = "weights.safetensors"
#: The optional member of a run's state (format 3 only).
TRAINING_STATE_MEMBER = "training_state.safetensors"
#: Where files of formats 1 and 2 kept their torch.save weights.
LEGACY_WEIGHTS_MEMBER = "weights.pt"


class InvalidModelFile(Exception):
    """Why a file is not a valid model file; load_model adds the file name."""
