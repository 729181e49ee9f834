"""SemiSupervisedAssociationClassifier: the paper's recipe as an estimator."""

import copy
import math
import warnings
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.base import (
    BaseEstimator,
    ClassifierMixin,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, Options, StrOptions
from sklearn.utils.validation import (
    check_consistent_length,
    check_is_fitted,
    column_or_1d,
    validate_data,
)

from ._augmentation import resolve_augmentation
from ._batches import DeviceBatches, HostBatches
from ._image_format import (
    ImageFormat,
    check_image_size,
    format_settings,
    formatted_shape,
)
from ._networks import (
    AssociationModel,
    auto_network_name,
    build_network,
    place_model,
)
from ._persistence import load_model, save_model
from ._sampling import UNLABELED_SAMPLINGS, AssociationBatchSampler
from ._training import (
    TrainingConfig,
    autocast_context,
    cpu_has_native_bf16,
    cuda_rng_lock,
    default_log_interval,
    precision_context,
    seeded_rng,
    train,
)
from ._validation import (
    UNLABELED,
    as_tensor,
    check_label_types,
    check_sample_shape,
    encode_semi_supervised_labels,
    is_integer,
    resolve_device,
    resolve_image_shape,
    split_sample_shape,
    to_model_layout,
    unlabeled_mask,
    user_stacklevel,
    validate_memory_map,
)

__all__ = ["SemiSupervisedAssociationClassifier"]

# The authors' code decays the logit layer's weights by 1e-4 for every network.
LOGIT_L2_SCALE = 1e-4
#: The keyword arguments of torch.compile that ``compile`` may hold.
COMPILE_ARGUMENTS = frozenset({"fullgraph", "dynamic", "backend", "mode", "options"})
#: torch.compile modes that capture CUDA graphs of their own.
GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})
# Steps of max_iter="auto": the paper's 20,000 on a GPU; on a CPU, enough for
# a useful model in minutes.
AUTO_MAX_ITER = {"cuda": 20_000, "cpu": 2_000}
AUTO_PREDICT_BATCH_SIZE = {"cuda": 8192, "cpu": 1024}


class SemiSupervisedAssociationClassifier(
    ClassifierMixin, TransformerMixin, ClassNamePrefixFeaturesOutMixin, BaseEstimator
):
    """Semi-supervised classifier trained by learning by association.

    Labeled and unlabeled samples are embedded by one network. A walker steps
    from the labeled embeddings to the unlabeled ones and back; the *walker
    loss* rewards round trips that end in the class where they started, the
    *visit loss* rewards visiting every unlabeled sample, and a linear layer
    on the embedding is trained to classify the labeled samples.

    Samples whose label is ``-1`` are unlabeled. Without unlabeled samples,
    every sample also serves as unlabeled (the paper's "all labels" setting).

    Read more in the :ref:`User Guide <user_guide>`.

    Parameters
    ----------
    network : {"auto", "mnist", "svhn", "stl10", "mlp"} or torch.nn.Module, \
            default="auto"
        The embedding network. ``"mnist"``, ``"svhn"`` and ``"stl10"`` are the
        paper's convolutional networks (raw pixels 0..255 as input), ``"mlp"``
        a fully connected network for feature vectors, which standardises its
        input with statistics learned in ``fit``. ``"auto"`` picks the SVHN
        network for 32x32 images, STL-10 for 96x96, MNIST for other images of
        at least 8x8 pixels and the MLP for feature rows. A ``torch.nn.Module``
        must map a batch of inputs (float32, shaped like ``X`` with image
        inputs as ``(n, c, h, w)``) to ``(n, embedding_dim)`` embeddings; it is
        copied, never trained in place.
    input_shape : tuple of int, default=None
        ``(channels, height, width)`` or ``(height, width)`` of one image when
        ``X`` holds images as flat rows. Leave None for feature vectors, or
        when ``X`` is already ``(n, h, w)`` or ``(n, c, h, w)``.
    image_size : int or tuple of (int, int), default=None
        Resize images to this ``(height, width)`` (bilinear, antialiased) on
        the training device before the network, in ``fit`` and in
        ``predict``; the inputs keep their own size in memory. Lets data of
        another size use a built-in network (28x28 MNIST digits in the
        32x32 SVHN network, say) and chooses the network of ``"auto"``.
    image_channels : {1, 3}, default=None
        Convert images to grey (1) or colour (3) before the network, like
        ``image_size``: grey is repeated into three channels, colour becomes
        its luma. None keeps the input's channels.
    embedding_dim : int, default=128
        Width of the embedding of the built-in networks (and of
        :meth:`transform`'s output).
    hidden_layer_sizes : tuple of int, default=(256, 256)
        Hidden layers of the ``"mlp"`` network before its embedding layer.
    labeled_per_class : int, default=10
        Samples of every class in each labeled batch. A class with fewer
        labeled samples is drawn with replacement (with a warning).
    unlabeled_batch_size : int, default=100
        Size of the unlabeled batch of every step.
    unlabeled_sampling : {"replacement", "epochs"}, default="replacement"
        How the unlabeled batch is drawn from the unlabeled samples.
        ``"replacement"``: uniformly with replacement, each step on its own
        (on the GPU without the host). ``"epochs"``: shuffled epochs, as the
        paper's code draws it (whose pool also holds the labeled images):
        every unlabeled sample is drawn once per epoch of
        ``n_unlabeled / unlabeled_batch_size`` steps, and a batch may
        straddle two epochs; the host deals each step's indices (one small
        copy a step, one shuffle an epoch). Every fit, a warm-started one
        too, starts a new epoch. The recipes were measured with
        ``"replacement"``.
    max_iter : int or "auto", default="auto"
        Number of training steps. ``"auto"``: 20,000 on a GPU (the paper),
        2,000 on a CPU.
    learning_rate : float, default=1e-3
        Initial learning rate of Adam.
    lr_decay : float, default=0.33
        Factor applied to the learning rate every ``lr_decay_steps`` steps.
    lr_decay_steps : int or "auto", default="auto"
        Steps between learning-rate decays; ``"auto"`` is a quarter of
        ``max_iter`` (5,000 of 20,000, as in the paper).
    walker_weight : float, default=1.0
        Weight of the walker loss.
    visit_weight : float, default=1.0
        Weight of the visit loss. Lower it when the unlabeled data holds
        classes that the labeled data lacks.
    logit_weight : float, default=1.0
        Weight of the classification loss on the labeled batch.
    association_delay : int, default=0
        Steps trained with the classification loss alone before the walker
        and visit losses (and the consistency loss) are switched on (domain
        adaptation uses this).
    association_ramp_steps : int, default=0
        Steps over which the walker, visit and consistency weights then grow
        linearly from zero to their values; 0 switches them on at once.
    l2_scale : float or "auto", default="auto"
        L2 penalty ``l2_scale * sum(w**2) / 2`` on the embedding network's
        weights (not biases). ``"auto"`` uses the paper's value for the
        built-in network (1e-3 MNIST, 1e-4 SVHN and MLP, 5e-3 STL-10) and
        1e-4 for a custom module. The logit layer always uses 1e-4.
    augmentation : None, "paper" or dict, default=None
        Random augmentation of both batches of every step, on the training
        device (image inputs only). ``"paper"``: the paper's random affine
        warp (``I + 0.15 N(0, 1)``, translation ``2 N(0, 1)`` pixels) and a
        7x7 Gaussian blur with probability 0.5. A dict overrides some of
        these settings:

        - ``affine_std``, ``translate_std``: the warp;
        - ``blur_probability``, ``blur_sigma``: the blur;
        - ``invert_probability``: inversion ``|x - 255|`` of raw pixels;
        - ``elastic_alpha``, ``elastic_sigma``: an elastic distortion, not
          in the paper and off by default (``elastic_alpha=0``): random
          displacements of about ``0.16 * elastic_alpha / elastic_sigma``
          pixels per axis, smoothed by a Gaussian of ``elastic_sigma``
          pixels;
        - ``unlabeled``: True (default) augments both batches, False the
          labeled batch only, leaving the unlabeled images as they are
          (the second copy of ``consistency_weight`` is always augmented).
    consistency_weight : float, default=0.0
        Weight of a consistency loss, not in the paper and off by default
        (0). Every step then also embeds a second copy of the unlabeled
        batch, augmented independently of the batch as the step uses it
        (unaugmented with ``unlabeled=False``; ``augmentation`` must be
        set); for each unlabeled image, the walker's probabilities of
        stepping to each class of the labeled batch from this copy are
        trained toward those from the batch (cross-entropy, the latter held
        fixed). It is delayed and ramped with the walker and visit losses.
        Each step embeds ``unlabeled_batch_size`` more images. With a
        batch-norm network (``"stl10"``) both copies are embedded in one
        pass and share its batch statistics.
    ema_decay : float, default=None
        When set, the fitted model takes an exponential moving average of
        the weights over training (decay per step, e.g. 0.999) instead of the
        last step's weights.
    precision : {"auto", "fp32", "tf32", "bf16"}, default="auto"
        Arithmetic of the network on the GPU. ``"tf32"`` uses TF32 tensor
        cores for the network's float32 matrix products and convolutions,
        ``"bf16"`` runs the network under bfloat16 autocast. Whatever the
        precision, the walker's similarities and round-trip probabilities
        are products computed in float64 and rounded to float32, and the
        losses are float32.
        ``"auto"`` is ``"tf32"`` on a GPU; on a CPU, ``"bf16"`` for image
        networks when the processor has native bf16 arithmetic (AVX-512 BF16
        or AMX) and ``"fp32"`` otherwise.
    cuda_graph : bool or "auto", default="auto"
        Capture the whole training step as one CUDA graph ("auto": on GPUs).
        Results are the same; steps are several times faster.
    compile : bool or dict, default=False
        Compile the embedding network's training pass with
        :func:`torch.compile`: ``True`` with its defaults, a dict with its
        keyword arguments (``fullgraph``, ``dynamic``, ``backend``, ``mode``,
        ``options``), e.g. ``{"mode": "max-autotune-no-cudagraphs"}``. The
        compiled pass fuses the network's small operations into fewer GPU
        kernels (see :doc:`/benchmarks` for measured steps), at the cost of a
        compilation at the first fit of a process (seconds to tens of
        seconds; later fits of the same network reuse it). The modes
        ``"reduce-overhead"`` and ``"max-autotune"`` capture CUDA graphs of
        their own and cannot run inside skassoc's: they are refused when
        ``cuda_graph`` is on. Prediction is not compiled, nor are steps whose
        batch (labeled and unlabeled samples together) is above 4,096
        samples and therefore embedded in chunks (a warning says so). On a
        CPU, fits in several threads of one process may each compile again.
    device : str or torch.device, default="auto"
        ``"auto"`` (a GPU when there is one), ``"cpu"``, ``"cuda"`` or
        ``"cuda:N"``.
    predict_batch_size : int or "auto", default="auto"
        Samples per forward pass in ``predict``, ``predict_proba`` and
        ``transform`` ("auto": 8192 on a GPU, 1024 on a CPU).
    random_state : int, RandomState instance or None, default=None
        Seeds the network's initial weights and every batch draw. With an
        int, two fits on a CPU give identical models.
    verbose : int, default=0
        Show a progress bar with the losses when > 0.
    warm_start : bool, default=False
        Start training from the weights of the previous fit (with a fresh
        optimizer and learning-rate schedule) instead of a new network. The
        classes, the input shape and the parameters that shape the network
        (``network``, ``embedding_dim``, ``hidden_layer_sizes``,
        ``image_size``, ``image_channels``) must be those of that fit.
    validation_interval : int, default=500
        With ``X_val`` and ``y_val`` given to :meth:`fit`, their accuracy is
        measured every ``validation_interval`` steps and after the last one
        (see ``history_``). Unused otherwise.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The labels of the labeled samples, sorted.
    model_ : AssociationModel
        The trained network (embedding network and logit layer).
    n_features_in_ : int
        Number of values in one sample seen during ``fit``.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Names of the features seen during ``fit`` (only for DataFrames with
        string column names).
    input_shape_ : tuple of int or None
        ``(channels, height, width)`` of one image, or None for feature rows.
    network_ : str
        Name of the built-in network used, or ``"custom"``.
    embedding_dim_ : int
        Width of the embedding (the number of output features of
        :meth:`transform`).
    n_iter_ : int
        Training steps completed in the last ``fit``.
    history_ : dict of lists
        Loss curves: ``"step"``, ``"learning_rate"``, ``"total"``,
        ``"walker"``, ``"visit"`` and ``"logit"`` (and ``"consistency"`` with
        ``consistency_weight > 0``), each entry the mean over the steps since
        the previous entry. ``"total"`` is the weighted sum of the losses;
        the L2 penalty is applied as Adam's weight decay (the same gradient)
        and is not part of it. A fit given ``X_val`` and
        ``y_val`` adds ``"validation_step"`` and ``"validation_score"``: the
        accuracy on them of the model as it would be fitted at that step
        (with ``ema_decay``, the averaged weights). The fitted model is always
        the last step's; the scores only show the learning curve. A fit
        interrupted with Ctrl-C keeps the scores measured until then.
    device_ : torch.device
        Where the model lives.

    See Also
    --------
    sklearn.semi_supervised.SelfTrainingClassifier : Wraps a supervised
        classifier and labels unlabeled samples with its own predictions.
    sklearn.semi_supervised.LabelSpreading : Spreads labels over a
        similarity graph of the samples.

    References
    ----------
    .. [1] P. Haeusser, A. Mordvintsev, D. Cremers, "Learning by Association
       - A versatile semi-supervised training method for neural networks",
       CVPR 2017.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.datasets import load_digits
    >>> from skassoc import SemiSupervisedAssociationClassifier
    >>> X, y = load_digits(return_X_y=True)
    >>> rng = np.random.RandomState(0)
    >>> y_semi = np.where(rng.rand(len(y)) < 0.1, y, -1)
    >>> clf = SemiSupervisedAssociationClassifier(
    ...     max_iter=200, device="cpu", random_state=0)
    >>> clf.fit(X, y_semi).predict(X[:3]).shape
    (3,)
    >>> clf.transform(X[:3]).shape
    (3, 128)
    """

    _parameter_constraints = {
        "network": [
            StrOptions({"auto", "mnist", "svhn", "stl10", "mlp"}),
            torch.nn.Module,
        ],
        "input_shape": [tuple, list, None],
        "image_size": [Interval(Integral, 1, None, closed="left"), tuple, list, None],
        "image_channels": [Options(Integral, {1, 3}), None],
        "embedding_dim": [Interval(Integral, 1, None, closed="left")],
        "hidden_layer_sizes": [tuple, list],
        "labeled_per_class": [Interval(Integral, 1, None, closed="left")],
        "unlabeled_batch_size": [Interval(Integral, 1, None, closed="left")],
        "unlabeled_sampling": [StrOptions(set(UNLABELED_SAMPLINGS))],
        "max_iter": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"})],
        "learning_rate": [Interval(Real, 0, None, closed="neither")],
        "lr_decay": [Interval(Real, 0, 1, closed="right")],
        "lr_decay_steps": [
            Interval(Integral, 1, None, closed="left"),
            StrOptions({"auto"}),
        ],
        "walker_weight": [Interval(Real, 0, None, closed="left")],
        "visit_weight": [Interval(Real, 0, None, closed="left")],
        "logit_weight": [Interval(Real, 0, None, closed="left")],
        "association_delay": [Interval(Integral, 0, None, closed="left")],
        "association_ramp_steps": [Interval(Integral, 0, None, closed="left")],
        "l2_scale": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
        "augmentation": [None, StrOptions({"paper"}), dict],
        "consistency_weight": [Interval(Real, 0, None, closed="left")],
        "ema_decay": [None, Interval(Real, 0, 1, closed="left")],
        "precision": [StrOptions({"auto", "fp32", "tf32", "bf16"})],
        "cuda_graph": ["boolean", StrOptions({"auto"})],
        "compile": ["boolean", dict],
        "device": [str, torch.device],
        "predict_batch_size": [
            Interval(Integral, 1, None, closed="left"),
            StrOptions({"auto"}),
        ],
        "random_state": ["random_state"],
        "verbose": ["verbose"],
        "warm_start": ["boolean"],
        "validation_interval": [Interval(Integral, 1, None, closed="left")],
    }

    def __init__(
        self,
        network="auto",
        *,
        input_shape=None,
        image_size=None,
        image_channels=None,
        embedding_dim=128,
        hidden_layer_sizes=(256, 256),
        labeled_per_class=10,
        unlabeled_batch_size=100,
        unlabeled_sampling="replacement",
        max_iter="auto",
        learning_rate=1e-3,
        lr_decay=0.33,
        lr_decay_steps="auto",
        walker_weight=1.0,
        visit_weight=1.0,
        logit_weight=1.0,
        association_delay=0,
        association_ramp_steps=0,
        l2_scale="auto",
        augmentation=None,
        consistency_weight=0.0,
        ema_decay=None,
        precision="auto",
        cuda_graph="auto",
        compile=False,
        device="auto",
        predict_batch_size="auto",
        random_state=None,
        verbose=0,
        warm_start=False,
        validation_interval=500,
    ):
        self.network = network
        self.input_shape = input_shape
        self.image_size = image_size
        self.image_channels = image_channels
        self.embedding_dim = embedding_dim
        self.hidden_layer_sizes = hidden_layer_sizes
        self.labeled_per_class = labeled_per_class
        self.unlabeled_batch_size = unlabeled_batch_size
        self.unlabeled_sampling = unlabeled_sampling
        self.max_iter = max_iter
        self.learning_rate = learning_rate
        self.lr_decay = lr_decay
        self.lr_decay_steps = lr_decay_steps
        self.walker_weight = walker_weight
        self.visit_weight = visit_weight
        self.logit_weight = logit_weight
        self.association_delay = association_delay
        self.association_ramp_steps = association_ramp_steps
        self.l2_scale = l2_scale
        self.augmentation = augmentation
        self.consistency_weight = consistency_weight
        self.ema_decay = ema_decay
        self.precision = precision
        self.cuda_graph = cuda_graph
        self.compile = compile
        self.device = device
        self.predict_batch_size = predict_batch_size
        self.random_state = random_state
        self.verbose = verbose
        self.warm_start = warm_start
        self.validation_interval = validation_interval

    # ------------------------------------------------------------------ fit

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y, *, X_val=None, y_val=None):
        """Train the network on labeled and unlabeled samples.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n_samples, h, w) \
                or (n_samples, c, h, w)
            Training inputs, raw: pixel values as they are (e.g. 0..255) for
            the image networks, features as they are for the MLP. A
            :class:`numpy.memmap`, or a view of one, is never copied: each
            step's batch is read from it (float ones are also scanned once,
            a few MiB at a time, for NaN and infinity); any other array is
            copied to the training device once.
        y : array-like of shape (n_samples,)
            Labels; ``-1`` marks an unlabeled sample.
        X_val : array-like of shape (n_val_samples, ...), default=None
            Inputs whose accuracy is measured every ``validation_interval``
            steps, in the same form as ``X``. Training never sees them.
        y_val : array-like of shape (n_val_samples,), default=None
            Their labels (no ``-1``); given exactly when ``X_val`` is.

        Returns
        -------
        self : SemiSupervisedAssociationClassifier
            The fitted estimator.
        """
        # A failed fit leaves the estimator as it was: validation below sets
        # attributes early, so snapshot and restore them on any error.
        previous_state = dict(self.__dict__)
        try:
            return self._fit(X, y, X_val, y_val)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(previous_state)
            raise

    def _fit(self, X, y, X_val, y_val):
        device = resolve_device(self.device)
        warm = self.warm_start and hasattr(self, "model_")
        # validate_data resets n_features_in_: keep the previous fit's inputs.
        previous_inputs = (self.n_features_in_, self.input_shape_) if warm else None
        self._check_hidden_layer_sizes()
        on_host = _is_memory_map(X)
        if on_host:
            # Validated and used where it is: never copied or read whole.
            y = validate_memory_map(self, X, y)
            sample_shape = tuple(X.shape[1:]) if X.ndim > 2 else None
        else:
            rows, sample_shape = split_sample_shape(X)
            rows, y = validate_data(self, rows, y, dtype="numeric", y_numeric=False)
        n_features = self.n_features_in_
        image_shape = resolve_image_shape(sample_shape, self.input_shape, n_features)
        if self.input_shape is None:
            _warn_if_channels_last(sample_shape)
        image_size = check_image_size(self.image_size)
        if image_shape is None and (
            image_size is not None or self.image_channels is not None
        ):
            raise ValueError(
                "image_size and image_channels need image inputs; pass X as "
                "(n, h, w) or (n, c, h, w) images, or set input_shape for flat "
                "rows."
            )
        if image_shape is not None and self.image_channels is not None:
            if image_shape[0] not in (1, 3):
                raise ValueError(
                    f"image_channels={self.image_channels} converts between grey "
                    f"(1 channel) and colour (3); the images have {image_shape[0]} "
                    "channels. Leave image_channels=None for them."
                )
        if warm and (n_features, image_shape) != previous_inputs:
            raise ValueError(
                "warm_start=True needs inputs shaped like those of the previous "
                f"fit ({previous_inputs[0]} features, image shape "
                f"{previous_inputs[1]}); got {n_features} features, image "
                f"shape {image_shape}. Set warm_start=False to train a new model."
            )
        if warm:
            self._check_warm_start_architecture(image_shape)
        classes, encoded = encode_semi_supervised_labels(y)
        validation = self._validation_set(X_val, y_val, image_shape, classes)
        if warm and not np.array_equal(classes, self.classes_):
            raise ValueError(
                "warm_start=True needs the classes of the previous fit "
                f"({self.classes_.tolist()}); got {classes.tolist()}. Set "
                "warm_start=False to train a new model."
            )

        augmentation = resolve_augmentation(self.augmentation)
        if augmentation is not None and image_shape is None:
            raise ValueError(
                "augmentation needs image inputs; pass X as (n, h, w) or "
                "(n, c, h, w) images, or set input_shape for flat rows."
            )
        if (
            augmentation is not None
            and augmentation["blur_probability"] > 0
            and min(image_shape[1:]) < 4
        ):
            raise ValueError(
                "The augmentation's 7x7 blur reflects 3 pixels at the borders, "
                f"so it needs images of at least 4x4 pixels; these are "
                f"{image_shape[1]}x{image_shape[2]}. Set "
                "augmentation['blur_probability'] = 0 for them."
            )
        if self.consistency_weight > 0 and augmentation is None:
            raise ValueError(
                f"consistency_weight={self.consistency_weight} compares every "
                "unlabeled image with a random augmentation of it, but "
                "augmentation is None. Set augmentation (e.g. 'paper', or "
                "{'unlabeled': False} to warp the labeled batch and the second "
                "copy only), or set consistency_weight=0."
            )
        compile_options = self._compile_options(device)
        seed = check_random_state(self.random_state).randint(np.iinfo(np.int32).max)
        if on_host:
            # Adding the channel axis of (n, h, w) images is a view, never a copy.
            data = X if image_shape is None else X.reshape(len(X), *image_shape)
        else:
            data = to_model_layout(rows, image_shape)
        max_iter = self._resolve_auto("max_iter", AUTO_MAX_ITER, device)
        precision = self._resolve_precision(device, images=data.ndim == 4)
        # Seed torch's generators for this fit only, so results depend on
        # random_state alone and the caller's random streams are untouched.
        with seeded_rng(seed, device):
            if warm:
                model = copy.deepcopy(self.model_).to(device)
                network_name = self.network_
            else:
                model, network_name = self._build_model(
                    data, image_shape, len(classes), device
                )
            embedding_dim = model.logits.in_features
            batches = self._make_batches(data, encoded, device, on_host)
            config = self._training_config(
                max_iter,
                precision,
                model,
                augmentation,
                images=data.ndim == 4,
                compile_options=compile_options,
            )
            evaluate = None
            if validation is not None:
                X_val, y_val = validation

                def evaluate():
                    proba = self._run_model(model, X_val, device, precision, "proba")
                    return np.mean(classes[np.argmax(proba, axis=1)] == y_val)

            with precision_context(device, precision):
                result = train(model, batches, config, device, evaluate)

        self.model_ = model
        self.classes_ = classes
        self.input_shape_ = image_shape
        self.network_ = network_name
        self.embedding_dim_ = embedding_dim
        self.n_iter_ = result.n_iter
        self.history_ = result.history
        self.device_ = device
        if result.interrupted:
            warnings.warn(
                f"Training was interrupted after {result.n_iter} of {max_iter} "
                "steps; the model keeps the weights of the last completed step.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
        return self

    def _validation_set(self, X_val, y_val, image_shape, classes):
        """``X_val`` in the model's layout and ``y_val``, or None without them."""
        if X_val is None and y_val is None:
            return None
        if X_val is None or y_val is None:
            raise ValueError(
                "X_val and y_val go together: pass both to measure the accuracy "
                "on them during training, or neither."
            )
        try:
            X_val = self._inputs_like_training(X_val, image_shape)
        except ValueError as exc:
            # The checks word their errors for X; say which input they mean.
            raise ValueError(
                f"X_val does not fit the training inputs X: {exc}"
            ) from exc
        y_val = column_or_1d(y_val, warn=True)
        # (validate_data has refused an empty X_val already.)
        check_consistent_length(X_val, y_val)
        unlabeled = unlabeled_mask(y_val)
        if unlabeled.any():
            raise ValueError(
                f"y_val marks {int(unlabeled.sum())} of its samples as unlabeled "
                "(-1); validation needs the true label of every sample. Leave "
                "the unlabeled ones out of X_val and y_val."
            )
        check_label_types(y_val)
        unknown = np.setdiff1d(y_val, classes)
        if len(unknown):
            raise ValueError(
                f"y_val holds labels that no labeled sample of y has: "
                f"{unknown[:5].tolist()}; the model predicts only "
                f"{classes.tolist()[:10]}. Check that y_val uses the labels "
                "(and their type) of y."
            )
        return X_val, y_val

    def _training_config(
        self, max_iter, precision, model, augmentation, images, compile_options
    ):
        """The run's hyperparameters, with every "auto" resolved."""
        lr_decay_steps = self.lr_decay_steps
        if lr_decay_steps == "auto":
            lr_decay_steps = max(1, round(max_iter / 4))
        if self.l2_scale == "auto":
            l2_scale = getattr(model.embedder, "default_l2_scale", 1e-4)
        else:
            l2_scale = self.l2_scale
        return TrainingConfig(
            max_iter=max_iter,
            learning_rate=float(self.learning_rate),
            lr_decay=float(self.lr_decay),
            lr_decay_steps=lr_decay_steps,
            walker_weight=float(self.walker_weight),
            visit_weight=float(self.visit_weight),
            logit_weight=float(self.logit_weight),
            association_delay=self.association_delay,
            association_ramp_steps=self.association_ramp_steps,
            l2_scale=float(l2_scale),
            logit_l2_scale=LOGIT_L2_SCALE,
            precision=precision,
            cuda_graph=self.cuda_graph in ("auto", True),
            channels_last=images,
            log_interval=default_log_interval(max_iter),
            verbose=self.verbose,
            augmentation=augmentation,
            consistency_weight=float(self.consistency_weight),
            ema_decay=self.ema_decay,
            validation_interval=self.validation_interval,
            compile=compile_options,
        )

    def _compile_options(self, device):
        """Keyword arguments of ``torch.compile``, or None without compiling."""
        # By value, not identity: NumPy booleans pass parameter validation.
        if isinstance(self.compile, dict):
            options = dict(self.compile)
        elif self.compile:
            options = {}
        else:
            return None
        unknown = set(options) - COMPILE_ARGUMENTS
        if unknown:
            raise ValueError(
                f"compile has unknown keys {sorted(unknown)}; it takes keyword "
                f"arguments of torch.compile: {sorted(COMPILE_ARGUMENTS)}."
            )
        if "mode" in options and "options" in options:
            raise ValueError(
                "compile takes 'mode' or 'options', not both (torch.compile "
                "refuses them together); put the mode's settings in 'options'."
            )
        uses_graph = device.type == "cuda" and self.cuda_graph in ("auto", True)
        inner_graphs = (options.get("options") or {}).get("triton.cudagraphs")
        if uses_graph and (options.get("mode") in GRAPH_MODES or inner_graphs):
            what = (
                f"mode {options['mode']!r}"
                if "mode" in options
                else "option 'triton.cudagraphs'"
            )
            raise ValueError(
                f"compile {what} captures CUDA graphs of its own, which cannot "
                "run inside skassoc's CUDA graph of the whole step. Use mode "
                "'max-autotune-no-cudagraphs' (or the default mode), or set "
                "cuda_graph=False."
            )
        return options

    def _resolve_auto(self, name, defaults, device):
        value = getattr(self, name)
        return defaults[device.type] if value == "auto" else value

    def _resolve_precision(self, device, images):
        if self.precision != "auto":
            return self.precision
        if device.type == "cuda":
            return "tf32"
        # bf16 convolutions roughly double a CPU's speed where it has native
        # bf16 arithmetic; elsewhere they are emulated and slower.
        return "bf16" if images and cpu_has_native_bf16() else "fp32"

    def _input_format(self, image_shape):
        """The conversion in front of the network, and the shape it outputs."""
        if image_shape is None:
            return None, None
        size = check_image_size(self.image_size)
        if size is None and self.image_channels is None:
            return None, image_shape
        return (
            ImageFormat(size, self.image_channels),
            formatted_shape(image_shape, size, self.image_channels),
        )

    def _check_hidden_layer_sizes(self):
        sizes = self.hidden_layer_sizes
        if not all(is_integer(width) and width >= 1 for width in sizes):
            raise ValueError(
                "hidden_layer_sizes must hold positive ints (the width of each "
                f"hidden layer of the MLP); got {sizes!r}."
            )

    def _check_warm_start_architecture(self, image_shape):
        """Refuse parameters that would need another network than ``model_``."""
        input_format, network_shape = self._input_format(image_shape)
        names = ("image_size", "image_channels")
        fitted = dict(
            zip(names, format_settings(self.model_.input_format), strict=True)
        )
        wanted = dict(zip(names, format_settings(input_format), strict=True))
        if isinstance(self.network, torch.nn.Module):
            # A new module cannot be compared with the fitted copy of the old.
            wanted["network"] = "custom" if self.network_ == "custom" else "a module"
        else:
            wanted["network"] = self.network
            if self.network == "auto":
                wanted["network"] = auto_network_name(network_shape)
        fitted["network"] = self.network_
        if wanted["network"] == self.network_ != "custom":
            wanted["embedding_dim"] = self.embedding_dim
            fitted["embedding_dim"] = self.embedding_dim_
        if wanted["network"] == self.network_ == "mlp":
            wanted["hidden_layer_sizes"] = tuple(self.hidden_layer_sizes)
            fitted["hidden_layer_sizes"] = self.model_.embedder.hidden_layer_sizes
        changed = [name for name in wanted if wanted[name] != fitted[name]]
        if changed:
            details = ", ".join(
                f"{name}: {fitted[name]!r} -> {wanted[name]!r}" for name in changed
            )
            raise ValueError(
                "warm_start=True continues training the fitted network, but these "
                f"parameters now ask for another one ({details}). Set them back, "
                "or set warm_start=False to train a new model."
            )

    def _build_model(self, data, image_shape, n_classes, device):
        """The embedding network plus logit layer, initialised from torch's seed."""
        input_format, network_shape = self._input_format(image_shape)
        if isinstance(self.network, torch.nn.Module):
            embedder = copy.deepcopy(self.network)
            name = "custom"
        else:
            name = self.network
            if name == "auto":
                name = auto_network_name(network_shape)
            embedder = build_network(
                name,
                network_shape,
                math.prod(data.shape[1:]),
                self.embedding_dim,
                self.hidden_layer_sizes,
            )
            if name == "mlp":
                embedder.fit_normalization(data, input_format)
        # A custom module may already live on a GPU: probe it on the device.
        embedder = embedder.to(device)
        sample = as_tensor(data[:2]).to(device).float()
        if input_format is not None:
            sample = input_format(sample)
        # cuDNN may autotune (and synchronize the device) for a new shape:
        # never while another thread captures a CUDA graph.
        with cuda_rng_lock(device):
            embedding_dim = self._probe_embedding_dim(embedder, sample)
        model = AssociationModel(embedder, embedding_dim, n_classes, input_format)
        return place_model(model, device, images=data.ndim == 4), name

    @staticmethod
    def _probe_embedding_dim(embedder, sample):
        """Run two samples through the embedder and check its output shape."""
        with torch.no_grad():
            was_training = embedder.training
            embedder.eval()
            out = embedder(sample)
            embedder.train(was_training)
        if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != 2:
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out)
            raise ValueError(
                "The network must map a batch of n inputs to an (n, embedding_dim) "
                f"tensor; for a batch of 2 it returned {shape}. Add a flatten or "
                "linear layer at its end."
            )
        return int(out.shape[1])

    def _make_batches(self, data, encoded, device, on_host):
        """What draws and gathers each step's batch (see ``_batches``).

        Inputs given as a memory map stay where they are and every batch is
        gathered from them on the host; all other inputs are copied to the
        training device once.
        """
        labeled = encoded != UNLABELED
        class_indices = [
            torch.as_tensor(np.flatnonzero(encoded == k))
            for k in range(encoded.max() + 1)
        ]
        # The paper's "all labels" setting: with nothing unlabeled, every
        # sample also serves as unlabeled.
        pool = (
            np.flatnonzero(~labeled) if not labeled.all() else np.arange(len(encoded))
        )
        if on_host:
            return HostBatches(
                data,
                class_indices,
                torch.as_tensor(pool),
                self.labeled_per_class,
                self.unlabeled_batch_size,
                device,
                self.unlabeled_sampling,
            )
        sampler = AssociationBatchSampler(
            class_indices,
            torch.as_tensor(pool),
            self.labeled_per_class,
            self.unlabeled_batch_size,
            device,
            self.unlabeled_sampling,
        )
        return DeviceBatches(as_tensor(data).to(device), sampler)

    # ------------------------------------------------------------ inference

    def _validated_inputs(self, X):
        check_is_fitted(self)
        return self._inputs_like_training(X, self.input_shape_)

    def _inputs_like_training(self, X, image_shape):
        """``X`` checked against the training inputs, in the model's layout."""
        rows, sample_shape = split_sample_shape(X)
        rows = validate_data(self, rows, dtype="numeric", reset=False)
        check_sample_shape(sample_shape, image_shape, self.n_features_in_)
        return to_model_layout(rows, image_shape)

    def _forward(self, X, output):
        """Run ``X`` through the fitted model; ``output`` picks what to keep."""
        data = self._validated_inputs(X)
        device = self.device_
        precision = self._resolve_precision(device, images=data.ndim == 4)
        result = self._run_model(self.model_, data, device, precision, output)
        if result is None:
            width = self.embedding_dim_ if output == "embedding" else len(self.classes_)
            return np.empty((0, width), dtype=np.float32)
        return result

    def _run_model(self, model, data, device, precision, output):
        """Run validated ``data`` through ``model`` in batches (None when empty).

        ``output`` is ``"embedding"`` or ``"proba"``.
        """
        batch_size = self._resolve_auto(
            "predict_batch_size", AUTO_PREDICT_BATCH_SIZE, device
        )
        memory_format = (
            torch.channels_last if data.ndim == 4 else torch.contiguous_format
        )
        chunks = []
        # The lock: cuDNN's autotuning of new batch shapes synchronizes the
        # device, which must not happen while a fit in another thread
        # captures its CUDA graph (see _training.cuda_rng_lock).
        with (
            torch.inference_mode(),
            precision_context(device, precision),
            cuda_rng_lock(device),
        ):
            for start in range(0, data.shape[0], batch_size):
                batch = as_tensor(data[start : start + batch_size])
                batch = batch.to(device, non_blocking=True).float()
                with autocast_context(device, precision):
                    embeddings = model.embed(batch, memory_format)
                    if output == "embedding":
                        result = embeddings
                    else:
                        result = torch.softmax(model.logits(embeddings).float(), 1)
                chunks.append(result.float().cpu().numpy())
        return np.concatenate(chunks) if chunks else None

    def predict_proba(self, X):
        """Class probabilities of the logit layer.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n_samples, h, w) \
                or (n_samples, c, h, w)
            Inputs, in the same form as in ``fit``.

        Returns
        -------
        proba : ndarray of shape (n_samples, n_classes)
            Probability of every class in :attr:`classes_`.
        """
        return self._forward(X, "proba")

    def predict(self, X):
        """Predict the class of every sample.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n_samples, h, w) \
                or (n_samples, c, h, w)
            Inputs, in the same form as in ``fit``.

        Returns
        -------
        y_pred : ndarray of shape (n_samples,)
            Labels from :attr:`classes_`.
        """
        check_is_fitted(self)
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]

    def transform(self, X):
        """Embed samples with the trained network.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n_samples, h, w) \
                or (n_samples, c, h, w)
            Inputs, in the same form as in ``fit``.

        Returns
        -------
        embeddings : ndarray of shape (n_samples, `embedding_dim_`)
            The learned embeddings.
        """
        return self._forward(X, "embedding")

    @property
    def _n_features_out(self):
        """Number of output features of ``transform`` (for feature names)."""
        return self.embedding_dim_

    # ---------------------------------------------------------- persistence

    def save(self, path):
        """Save the fitted estimator to one file, without pickle.

        The file is a zip archive of the parameters and fitted attributes as
        JSON and the network weights, which :meth:`load` reads back with
        torch's ``weights_only`` loader: loading it executes no code, unlike
        a pickle or joblib file.

        Parameters
        ----------
        path : str or os.PathLike
            Where to write the model (extension ``.skassoc`` suggested).

        Raises
        ------
        ValueError
            If the estimator uses a custom ``torch.nn.Module`` network, or a
            parameter or label cannot be stored as JSON.
        """
        save_model(self, path)

    @classmethod
    def load(cls, path, *, device="auto"):
        """Load an estimator saved by :meth:`save`; runs no code from the file.

        Parameters
        ----------
        path : str or os.PathLike
            The model file.
        device : str or torch.device, default="auto"
            Where to place the model ("auto": a GPU when there is one). A
            model saved on a GPU loads on a CPU-only machine.

        Returns
        -------
        estimator : SemiSupervisedAssociationClassifier
            The fitted estimator.

        Raises
        ------
        ValueError
            If the file is not a valid skassoc model file (truncated,
            tampered with, or from an incompatible version).
        """
        return load_model(path, device=device)

    def __getstate__(self):
        # Pickle the model on the CPU, so that a model trained on a GPU loads
        # on a machine without one.
        # A copy: object.__getstate__ returns the instance's own __dict__.
        state = dict(super().__getstate__())
        if "model_" in state and self.device_.type != "cpu":
            state["model_"] = copy.deepcopy(self.model_).to("cpu")
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        if "model_" in state:
            device = self.device_
            if device.type == "cuda" and not torch.cuda.is_available():
                device = torch.device("cpu")
            elif device.type == "cuda" and (device.index or 0) >= (
                torch.cuda.device_count()
            ):
                # Fitted on a GPU this machine does not have (e.g. cuda:1).
                device = torch.device("cuda")
            self.model_ = self.model_.to(device)
            self.device_ = device

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.three_d_array = True
        # The network computes in float32 whatever the input dtype.
        tags.transformer_tags.preserves_dtype = ["float32"]
        return tags


def _warn_if_channels_last(sample_shape):
    """Warn when images look like (h, w, c) but will be read as (c, h, w)."""
    if sample_shape is None or len(sample_shape) != 3:
        return
    channels, height, width = sample_shape
    if channels > 4 and width in (1, 3, 4):
        warnings.warn(
            f"X holds images of shape {tuple(sample_shape)}, read as (channels, "
            f"height, width) = ({channels}, {height}, {width}). If they are "
            "channels-last (height, width, channels) images, pass "
            "np.moveaxis(X, -1, 1) instead.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def _is_memory_map(X):
    """Whether ``X`` is (a view of) a :class:`numpy.memmap`."""
    while X is not None:
        if isinstance(X, np.memmap):
            return True
        X = getattr(X, "base", None)
    return False
