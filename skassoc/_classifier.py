"""SemiSupervisedAssociationClassifier: the paper's recipe as an estimator."""

import copy
import functools
import math
import sys
import warnings
from numbers import Integral

import numpy as np
import torch
from sklearn import get_config
from sklearn.base import (
    BaseEstimator,
    ClassifierMixin,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.utils._param_validation import (
    Interval,
    validate_parameter_constraints,
)
from sklearn.utils.validation import (
    check_consistent_length,
    check_is_fitted,
    column_or_1d,
)
from tqdm.auto import tqdm

from ._diagnosis import fit_report, warn_if_suspect
from ._engine._device import (
    autocast_context,
    cuda_rng_lock,
    precision_context,
)
from ._engine._loop import NonFiniteLossError, non_finite_message
from ._engine._optim import load_torch_dynamo
from ._engine._runner import (
    agreed_seed,
    check_backend,
    default_group,
    raised_together,
)
from ._engine._spawn import fit_on_devices, resolve_devices, warn_again
from ._engine._step import embedding_chunk_size
from ._fit import (
    continued_run,
    interruption,
    train_estimators,
    warn_if_labels_unlearned,
)
from ._fitted import get_fitted_state, is_fitted, set_fitted_state
from ._inputs import (
    as_tensor,
    check_label_types,
    classification_weights,
    hold_out_validation,
    inputs_like_training,
    unfitted_copy,
    unlabeled_mask,
    validate_training_inputs,
)
from ._io._model_file import load_model, save_model
from ._nn._model import build_model, check_custom_module, placed, probe_embedder
from ._nn._networks import takes_hidden_layer_sizes
from ._params import PARAMETER_CONSTRAINTS
from ._prior import (
    apply_class_prior,
    estimate_class_prior,
    label_frequencies,
    prior_samples,
    uniform_prior,
)
from ._resume import previous_run, store_run
from ._settings import (
    available_memory_bytes,
    describe_settings,
    fit_device,
    fit_seed,
    resolve_fit_settings,
    resolve_precision,
    resolve_predict_batch_size,
    step_memory_bytes,
)
from ._sparse import check_sparse_model, is_sparse
from ._suggest import suggest_labels
from ._utils import user_stacklevel

__all__ = ["SemiSupervisedAssociationClassifier"]


def _agreed_fit_context(fit_method):
    """scikit-learn's ``_fit_context`` around ``fit``, whose parameter checks
    every process of a torch.distributed group agrees on first: parameters
    such as ``callbacks`` and ``devices`` may differ between the processes,
    and one that failed its checks alone would leave the others waiting in
    their first collective."""
    fit_in_context = _fit_context(prefer_skip_nested_validation=True)(fit_method)

    @functools.wraps(fit_method)
    def fit(estimator, *args, **kwargs):
        group = default_group()
        if group is not None and not get_config()["skip_parameter_validation"]:
            with raised_together(group, "the checks of their parameters"):
                estimator._validate_params()
        return fit_in_context(estimator, *args, **kwargs)

    return fit


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
    every sample also serves as unlabeled (the paper's "all labels" setting;
    ``unlabeled_pool="all"`` asks for it without a warning).

    Read more in the :ref:`User Guide <user_guide>`.

    Parameters
    ----------
    network : {"auto", "mnist", "svhn", "stl10", "small", "mlp", \
            "sparse_mlp", "signal"} or \
            torch.nn.Module, default="auto"
        The embedding network. ``"mnist"``, ``"svhn"`` and ``"stl10"`` are the
        paper's convolutional networks, ``"small"`` a convolutional network
        for small images; each learns the scale of the pixel values in
        ``fit`` (8-bit pixels are used exactly as in the paper). ``"mlp"`` is
        a fully connected network for feature vectors, which standardises its
        input with statistics learned in ``fit`` and bounds the standardised
        values softly. ``"auto"`` picks the small network for images of 8x8
        to 27x27 pixels, SVHN for 32x32, STL-10 for 96x96, MNIST for other
        images of at least 8x8 pixels and the MLP for feature rows. A
        ``torch.nn.Module`` must map a batch of inputs (float32, shaped like
        ``X`` with image inputs as ``(n, c, h, w)``) to ``(n, embedding_dim)``
        embeddings; it is copied, never trained in place. ``"sparse_mlp"``,
        which ``"auto"`` picks for a sparse ``X`` (and which takes dense rows
        too), divides its inputs by the training rows' typical length, which
        keeps zeros zero, and multiplies only the nonzero values into its
        first layer (see the user guide's "Text and other sparse data").
        ``"signal"``, which ``"auto"`` picks for signals (inputs one value
        high, below), is a 1-D convolutional network that standardises each
        channel and pools over time; it reads every axis of a sample but the
        last as channels (see the user guide's "Time series and signals").
    input_shape : tuple of int, default=None
        ``(channels, height, width)`` or ``(height, width)`` of one image when
        ``X`` holds images as flat rows; ``(length,)`` (or ``(channels, 1,
        length)``) of one signal, an image one value high. Leave None for
        feature vectors, or when ``X`` is already ``(n, h, w)`` or ``(n, c,
        h, w)`` (signals: ``(n, channels, 1, length)``).
    image_size : int or tuple of (int, int), default=None
        Resize images to this ``(height, width)`` (bilinear, antialiased) on
        the training device before the network, in ``fit`` and in
        ``predict``; the inputs keep their own size in memory. Lets data of
        another size use a built-in network (28x28 MNIST digits in the
        32x32 SVHN network, say) and chooses the network of ``"auto"``.
        Sides up to 65536; ``fit`` refuses a network for which memory is
        short before building it.
    image_channels : {1, 3}, default=None
        Convert images to grey (1) or colour (3) before the network, like
        ``image_size``: grey is repeated into three channels, colour becomes
        its luma. None keeps the input's channels.
    embedding_dim : int, default=128
        Width of the embedding of the built-in networks (and of
        :meth:`transform`'s output), up to 65536.
    hidden_layer_sizes : tuple of int, default=(256, 256)
        Hidden layers of the ``"mlp"`` network before its embedding layer.
    labeled_per_class : int or "auto", default="auto"
        Samples of every class in each labeled batch. A class with fewer
        labeled samples is drawn with replacement (with a warning).
        ``"auto"``: 10 (the paper), or the size of the smallest labeled class
        when that is smaller.
    unlabeled_batch_size : int or "auto", default="auto"
        Size of the unlabeled batch of every step. ``"auto"``: 100 (the
        paper), or the number of samples in the unlabeled pool when that is
        smaller.
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
        Number of training steps. ``"auto"``: enough steps for 100 passes
        over the unlabeled pool, at least 1,000 and at most the paper's
        20,000; on a CPU also at most what a fixed budget of work allows,
        estimated from the network's size and the batch, so that a CPU fit
        ends in seconds to a minute (``skassoc._defaults`` has the rules). A
        custom module gets 20,000 steps on a GPU and 2,000 on a CPU.
    learning_rate : float, default=1e-3
        Initial learning rate of Adam.
    lr_decay : float, default=0.33
        Factor applied to the learning rate every ``lr_decay_steps`` steps
        (with ``lr_schedule="step"``).
    lr_decay_steps : int or "auto", default="auto"
        Steps between learning-rate decays; ``"auto"`` is a quarter of
        ``max_iter`` (5,000 of 20,000, as in the paper).
    lr_schedule : {"step", "cosine"}, default="step"
        How the learning rate falls. ``"step"``: by ``lr_decay`` every
        ``lr_decay_steps`` steps counted from the first (the paper's
        schedule). ``"cosine"``: from ``learning_rate`` after the warm-up
        along half a cosine towards 0, which it would reach one step after
        the last (``lr_decay`` and ``lr_decay_steps`` unused); it suits short
        runs of large batches.
    lr_warmup_steps : int, default=0
        Steps over which the learning rate first grows linearly from
        ``learning_rate / lr_warmup_steps`` to ``learning_rate``, multiplying
        the schedule's rate. Must be below the number of steps.
    walker_weight : float, default=1.0
        Weight of the walker loss. Each loss weight (and ``l2_scale``,
        ``consistency_weight``, ``balance_weight``) lies in ``[0, 1e6]``, as
        in a model file: the weights act relative to each other, so weigh
        one loss up by weighing the others down.
    visit_weight : float, default=1.0
        Weight of the visit loss. Lower it when the unlabeled data holds
        classes that the labeled data lacks.
    logit_weight : float, default=1.0
        Weight of the classification loss on the labeled batch.
    association_delay : int, default=0
        Steps trained with the classification loss alone before the walker
        and visit losses (and the consistency and balance losses) are
        switched on (domain adaptation uses this).
    association_ramp_steps : int, default=0
        Steps over which the walker, visit, consistency and balance weights
        then grow linearly from zero to their values; 0 switches them on at
        once.
    l2_scale : float or "auto", default="auto"
        L2 penalty ``l2_scale * sum(w**2) / 2`` on the embedding network's
        weights (not biases). ``"auto"`` uses the paper's value for the
        built-in network (1e-3 MNIST, 1e-4 SVHN and MLP, 5e-3 STL-10) and
        1e-4 for a custom module. The logit layer always uses 1e-4.
    augmentation : "auto", None, "paper" or dict, default="auto"
        Random augmentation of the batches of every step, on the training
        device. ``"auto"`` adds feature noise (below) to feature vectors
        that the built-in MLP embeds, the signal augmentation (below) to
        signals that the ``"signal"`` network embeds, and nothing to images.
        ``"paper"``:
        the paper's random affine warp of images (``I + 0.15 N(0, 1)``,
        translation ``2 N(0, 1)`` pixels) and a 7x7 Gaussian blur with
        probability 0.5. A dict overrides some of these settings:

        - ``affine_std``, ``translate_std``: the warp;
        - ``blur_probability``, ``blur_sigma``: the blur;
        - ``invert_probability``: inversion ``|x - 255|`` of raw pixels;
        - ``elastic_alpha``, ``elastic_sigma``: an elastic distortion, not
          in the paper and off by default (``elastic_alpha=0``): random
          displacements of about ``0.16 * elastic_alpha / elastic_sigma``
          pixels per axis, smoothed by a Gaussian of ``elastic_sigma``
          pixels;
        - ``feature_noise`` (feature vectors and the MLP only, with
          ``unlabeled`` the only other key): Gaussian noise of this many
          standard deviations of each feature, in the units the MLP
          standardises by (so constant features, which it leaves unscaled,
          get noise of this size). ``"auto"`` (with ``unlabeled=False``)
          sizes it to the data: 1.25 times the median distance from a
          sample to its nearest other sample, with every feature
          standardised, over the square root of the number of features
          that vary, at most 1.5 (measured on random rows, see the user
          guide);
        - ``shift_std``, ``warp_std``, ``scale_std``, ``noise_std``
          (signals and the ``"signal"`` network only, with ``unlabeled``):
          a shift by this fraction of the length, a smooth time warp whose
          speed varies by this much, each channel scaled about its mean by
          ``exp(scale_std N(0, 1))``, and Gaussian noise of this fraction
          of each channel's spread; ``"auto"`` is 0.03, 0.1, 0.1 and 0.05,
          both batches;
        - ``unlabeled``: True augments both batches (the default for
          images), False the labeled batch only, leaving the unlabeled
          samples as they are (the second copy of ``consistency_weight`` is
          always augmented).
    consistency_weight : float or "auto", default="auto"
        Weight of a consistency loss, not in the paper. Every step then
        also embeds a second copy of the unlabeled batch, augmented
        independently of the batch as the step uses it (unaugmented with
        ``unlabeled=False``; ``augmentation`` must be set); for each
        unlabeled sample, the walker's probabilities of stepping to each
        class of the labeled batch from this copy are trained toward those
        from the batch (cross-entropy, the latter held fixed). It is delayed
        and ramped with the walker and visit losses. Each step embeds
        ``unlabeled_batch_size`` more samples. With a batch-norm network
        (``"stl10"``) both copies are embedded in one pass and share its
        batch statistics. ``"auto"`` is 2 with feature noise (the default
        for feature vectors) while the walker or visit loss is on, and 0
        (off) otherwise.
    balance_weight : float, default=0.0
        Weight of a balance loss, not in the paper and off by default (0).
        Where the walks from the unlabeled samples end (the walker's class
        probabilities, as for ``consistency_weight``) is averaged over the
        batch and, with a moving average, over about the last hundred
        batches (restarted at the class shares by every fit). The loss is
        the KL divergence of each class's share of the labeled training
        samples (or its given ``class_prior``) from that average, and its
        gradient acts through the current batch. When no labeled sample
        resembles a whole group of unlabeled ones (a style of writing a
        digit, say), the walker losses can hand the group to another class;
        that class then gets more than its share, and this loss pulls the
        group back. It assumes the labeled samples' class shares (or the
        given frequencies) are those of the unlabeled data. It
        is delayed and ramped with the walker and visit losses. Since it
        pulls the predicted class shares toward the expected ones,
        ``fit_report_``'s share check says less of a fit trained with it.
        Stacked fits (:class:`~skassoc.model_selection.StackedGridSearchCV`)
        do not take it.
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
        ``"auto"`` is ``"bf16"`` for images and signals (the convolutional
        networks) on a device with native bf16 arithmetic (GPUs from Ampere
        on; CPUs with AVX-512 BF16 or AMX), and otherwise ``"tf32"`` on an
        NVIDIA GPU and ``"fp32"`` elsewhere (CPUs, Apple GPUs).
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
        When > 0, print what the ``"auto"`` parameters became (network,
        steps, batch sizes, feature noise) and show a progress bar with the
        losses.
    warm_start : bool, default=False
        Start from the previous fit instead of a new network. If that fit
        ended before ``max_iter`` steps of its run (a Ctrl-C, a callback
        that stopped it, or ``max_iter`` raised since), its run continues
        to ``max_iter`` steps in all: the optimizer, the learning-rate
        schedule (that of this ``max_iter``), the moving average, the loss
        ramp and the random streams go on where they stopped, so that a fit
        of ``2N`` steps and a fit of ``N`` steps continued to ``2N`` give the
        same model when the schedule does not depend on ``max_iter``
        (bitwise on a CPU). Otherwise a new run of ``max_iter`` steps starts
        from its weights, with a fresh optimizer and schedule, up to the
        full ``learning_rate`` again: on a converged network such a run can
        diverge into predicting one class (``fit`` then warns; see
        :ref:`benchmarks_trust_warm_start`). The classes,
        the input shape and the parameters that shape the network
        (``network``, ``embedding_dim``, ``hidden_layer_sizes``,
        ``image_size``, ``image_channels``) must be those of that fit. An
        estimator loaded from a checkpoint (:class:`~skassoc.callbacks.Checkpoint`)
        continues its run the same way.
    validation_interval : int, default=500
        With ``early_stopping=True`` or ``X_val`` and ``y_val`` given to
        :meth:`fit`, the validation accuracy is measured every
        ``validation_interval`` steps and after the last one (see
        ``history_``). Unused otherwise.
    unlabeled_pool : {"unlabeled", "all"}, default="unlabeled"
        What the unlabeled batch of every step is drawn from.
        ``"unlabeled"``: the samples labeled ``-1``; when ``y`` holds none,
        all samples, with a warning (a meta-estimator that re-encodes
        labels, such as :func:`~sklearn.model_selection.cross_val_predict`,
        turns ``-1`` into a class of its own; see the user guide's
        "Meta-estimators and -1"). ``"all"``: every sample, labeled ones
        included, as the authors' code draws it (and the paper's "all
        labels" setting, without a warning).
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the labeled samples (stratified,
        drawn with ``random_state``; their labels are hidden from training
        and they are not in the unlabeled pool either), score them every
        ``validation_interval`` steps, stop after ``n_iter_no_change``
        validations without an improvement of at least ``tol``, and keep
        the best-scoring weights (the averaged ones with ``ema_decay``).
        With ``X_val`` and ``y_val`` given to :meth:`fit`, they are the
        validation set instead and no labeled sample is held out. Works in
        pipelines and searches, where ``X_val`` does not (see :meth:`fit`).
    validation_fraction : float, default=0.1
        Share of the labeled samples held out with ``early_stopping=True``
        (at least one per class; every class needs 2 labeled samples).
        Unused otherwise.
    n_iter_no_change : int, default=10
        Validations without improvement before ``early_stopping`` stops
        training (``n_iter_no_change * validation_interval`` steps).
    tol : float, default=1e-4
        Smallest gain in validation accuracy that counts as an improvement
        for ``early_stopping``.
    class_weight : dict, "balanced" or None, default=None
        A factor on the classification loss of every labeled sample of a
        class (``{label: weight}``; missing classes weigh 1).
        ``"balanced"``: ``n_labeled / (n_classes * count(label))`` as
        :func:`~sklearn.utils.class_weight.compute_class_weight` computes it
        on the labeled training samples. The labeled batch already holds
        ``labeled_per_class`` samples of every class, so rare classes are
        seen as often as common ones whatever the weights; class weights
        change how much each class's rows count in the classification loss
        (``"balanced"`` thus favours rare classes beyond their balanced
        share). The walker and visit losses are not weighted by them (a
        given ``class_prior`` sets where the visit loss's walks start).
        Factors (times ``sample_weight``) are rescaled to average 1 over the
        labeled samples, so only their ratios matter.
    class_prior : {"auto", "uniform"} or array-like of shape (n_classes,), \
            default="auto"
        The class frequencies that predictions, and with given frequencies
        training too, assume. Every labeled batch holds as many samples of
        each class, so the network's own probabilities assume equal
        frequencies (``"uniform"``, as in the paper), and so does the visit
        loss: it asks every class for an equal share of the unlabeled
        samples. ``"auto"`` trains as the paper, then estimates the
        frequencies of the classes among the unlabeled training samples (at
        most 10,000 of them, drawn with ``random_state``) as the mean of the
        trained network's probabilities there (when no sample is unlabeled,
        it takes the frequencies of the labels), and weighs each class's
        probability by its frequency (Bayes' rule; see the user guide's
        "Imbalanced classes"): on imbalanced data a class rare among the
        unlabeled samples is predicted less often, on balanced data little
        changes. An array gives the frequencies, one per class in the order
        of :attr:`classes_` (the sorted labels; positive; rescaled to sum
        1): predictions weigh by them, the visit loss's walks start at each
        class in proportion to them, and the balance loss aims at them (with
        ``"auto"`` and ``"uniform"`` it aims at the labels' class shares).
        ``class_weight`` tilts the classification loss on top of this. Like
        every parameter, a new value takes effect at the next ``fit``. The
        validation scores measured during training (see
        ``early_stopping``) use the network's own probabilities.
    fit_report : bool, default=True
        Whether ``fit`` ends by checking the trained model on its training
        data (``fit_report_``, and a warning when it finds the fit
        suspect). The check costs one forward pass over at most 50,000
        unlabeled and 2,000 labeled training samples and, when the class
        shares are checked, a spread of the labels over at most 2,000
        labeled and 10,000 unlabeled training inputs on the CPU; ``False``
        skips it, leaving ``fit_report_`` None, and ``suggest_labels`` then
        ranks its regions without the report's class shares. Set it to
        ``False`` for ``GridSearchCV`` (whose candidates are scored and
        dropped); :class:`~skassoc.model_selection.StackedGridSearchCV`
        skips it for its candidates itself.
    callbacks : list of Callback, default=None
        Objects whose hooks ``fit`` calls between training steps (never
        inside the captured CUDA graph): ``on_fit_begin``, ``on_log`` at
        every log point (about 100 a fit) and ``on_fit_end``; see
        :mod:`skassoc.callbacks` (a checkpoint writer and a TensorBoard
        writer ship there). A callback that raises ends training: the model
        of the steps completed is kept, then the error propagates. A model
        file never carries callbacks.
    devices : "all" or list of int or str, default=None
        Train one model on several devices at once, data-parallel: ``fit``
        starts a process per device (GPU indices, ``"cuda:1"``, or
        ``"cpu"`` entries for CPU processes), each embeds its share of every
        step's batch, and the estimator gets the model that one process
        would train on the whole batch (up to float rounding). ``"all"``:
        every GPU. Overrides ``device`` (one device: the fit runs here, on
        it). Callbacks run in the processes (on copies). The processes use
        the caller's warning filters, and process 0's warnings are warned
        again in the caller once the fit is done. Numeric arrays are
        copied once into shared memory (``/dev/shm``, which containers may
        keep small; a memory map is opened by each process instead).
        Batch norms normalise with the whole batch's statistics (torch's
        ``SyncBatchNorm`` on GPUs). Under ``torchrun`` leave it
        None (several devices are refused there): a fit in a process of an
        initialized ``torch.distributed`` group trains with the group.
        ``StackedGridSearchCV`` trains its folds' candidates in one process
        (its refit uses ``devices``).
    resume_from : str, os.PathLike or RunStore, default=None
        Where ``fit`` starts from. A path: the model file (a checkpoint, see
        :class:`~skassoc.callbacks.Checkpoint`) whose run it continues, or
        whose weights it starts a new run from, as ``warm_start`` does with
        this estimator's own fit (which comes first when ``warm_start=True``
        and the estimator is fitted). A
        :class:`~skassoc.model_selection.RunStore`: the run that an earlier
        fit with the same parameters and data stored there, and ``fit``
        stores its own run there (successive halving over ``max_iter``
        continues each candidate this way). Never read from a model file.

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        The labels of the labeled samples, sorted.
    class_prior_ : ndarray of shape (n_classes,)
        The class frequencies that predictions assume (see ``class_prior``);
        equal ones for ``"uniform"``.
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
        Training steps of the fitted model's run (fewer than ``max_iter``
        when ``early_stopping``, a callback or a Ctrl-C stopped it; a
        continued run counts its earlier steps too, see ``warm_start``).
    training_state_ : TrainingState or None
        What continuing the run needs (see ``warm_start``): Adam's moments,
        the step count, the moving average of the weights and the random
        streams, on the CPU. None when the fitted weights are not those of
        the run's last step (``early_stopping`` kept earlier ones).
    fit_report_ : FitReport or None
        What the fit says about itself, from its training data alone: a
        verdict (``"suspect"`` when a class takes a markedly larger share
        of the unlabeled samples than expected, which is how a style of one
        class handed to another shows), its reasons and scores (see
        :data:`~skassoc.REPORT_SCORES`). A suspect fit of at least 100
        steps warns (:class:`~skassoc.FitReportWarning`). None with
        ``fit_report=False``, for a model file saved without it or a fit
        interrupted while computing it.
    validation_scores_ : list of float or None
        Validation accuracy at every validation of the last ``fit``
        (``history_["validation_score"]``); None when it measured none.
    best_validation_score_ : float or None
        The best of ``validation_scores_``: with ``early_stopping``, the
        validation accuracy of the fitted weights (of the network's own
        probabilities, see ``class_prior``); None without validation.
    history_ : dict of lists
        Loss curves: ``"step"``, ``"learning_rate"``, ``"total"``, ``"walker"``,
        ``"visit"`` and ``"logit"`` (and ``"consistency"`` and ``"balance"``
        when their losses are on), each entry the mean over the steps since the
        previous entry. ``"total"`` is the weighted sum of the losses; the L2
        penalty is applied as Adam's weight decay (the same gradient) and is not
        part of it. A fit given ``X_val`` and ``y_val``, or with
        ``early_stopping``, adds ``"validation_step"`` and
        ``"validation_score"``: the validation accuracy of the model as it would
        be fitted at that step (with ``ema_decay``, the averaged weights).
        Without ``early_stopping`` the fitted model is the last step's and the
        scores only show the learning curve; with it, the fitted model is the
        best-scoring one. A fit interrupted with Ctrl-C keeps the scores
        measured until then.
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

    # Each parameter is declared in skassoc._params (with its default, its
    # domain in a model file and what it configures); the constructor below
    # and the Parameters section above must match that table, which
    # tests/test_params.py checks.
    _parameter_constraints = PARAMETER_CONSTRAINTS

    # The HTML repr links to skassoc's API pages, not scikit-learn's.
    _doc_link_module = "skassoc"
    _doc_link_template = (
        "https://skassoc.readthedocs.io/en/latest/generated/"
        "skassoc.{estimator_name}.html"
    )

    def __init__(
        self,
        network="auto",
        *,
        input_shape=None,
        image_size=None,
        image_channels=None,
        embedding_dim=128,
        hidden_layer_sizes=(256, 256),
        labeled_per_class="auto",
        unlabeled_batch_size="auto",
        unlabeled_sampling="replacement",
        max_iter="auto",
        learning_rate=1e-3,
        lr_decay=0.33,
        lr_decay_steps="auto",
        lr_schedule="step",
        lr_warmup_steps=0,
        walker_weight=1.0,
        visit_weight=1.0,
        logit_weight=1.0,
        association_delay=0,
        association_ramp_steps=0,
        l2_scale="auto",
        augmentation="auto",
        consistency_weight="auto",
        balance_weight=0.0,
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
        unlabeled_pool="unlabeled",
        early_stopping=False,
        validation_fraction=0.1,
        n_iter_no_change=10,
        tol=1e-4,
        class_weight=None,
        class_prior="auto",
        fit_report=True,
        callbacks=None,
        devices=None,
        resume_from=None,
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
        self.lr_schedule = lr_schedule
        self.lr_warmup_steps = lr_warmup_steps
        self.walker_weight = walker_weight
        self.visit_weight = visit_weight
        self.logit_weight = logit_weight
        self.association_delay = association_delay
        self.association_ramp_steps = association_ramp_steps
        self.l2_scale = l2_scale
        self.augmentation = augmentation
        self.consistency_weight = consistency_weight
        self.balance_weight = balance_weight
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
        self.unlabeled_pool = unlabeled_pool
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.class_weight = class_weight
        self.class_prior = class_prior
        self.fit_report = fit_report
        self.callbacks = callbacks
        self.devices = devices
        self.resume_from = resume_from

    # ------------------------------------------------------------------ fit

    @_agreed_fit_context
    def fit(self, X, y, *, X_val=None, y_val=None, sample_weight=None):
        """Train the network on labeled and unlabeled samples.

        The fitted attributes change only when training has succeeded: a
        fit that fails, or that is interrupted before its first step
        completes, leaves a fitted estimator as it was. A fit interrupted
        later (Ctrl-C) keeps the model of the steps it completed (``n_iter_``
        says how many) and then raises ``KeyboardInterrupt``, so that a
        search or a script stops too.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n_samples, h, w) \
                or (n_samples, c, h, w)
            Training inputs, raw: pixel values as they are (e.g. 0..255) for
            the image networks, features as they are for the MLP. A
            :class:`numpy.memmap`, or a view of one, is never copied: each
            step's batch is read from it (float ones are also scanned once,
            a few MiB at a time, for NaN and infinity); any other array is
            copied to the training device once. A sparse CSR or CSC matrix
            (or array) stays sparse on the host, and each step's rows are
            gathered from it (network ``"sparse_mlp"``).
        y : array-like of shape (n_samples,)
            Labels; ``-1`` marks an unlabeled sample. A ``y`` without ``-1``
            warns (unless ``unlabeled_pool="all"``): it is what a
            meta-estimator that re-encodes labels passes on.
        X_val : array-like of shape (n_val_samples, ...), default=None
            Inputs whose accuracy is measured every ``validation_interval``
            steps, in the same form as ``X``. Training never sees them.
            With ``early_stopping=True`` they are the validation set (no
            labeled samples are then held out). In a
            :class:`~sklearn.pipeline.Pipeline` they reach this estimator
            untransformed: pass them transformed, or use
            ``early_stopping=True`` without them. A search such as
            :class:`~sklearn.model_selection.GridSearchCV` slices fit
            parameters as long as ``X`` per fold (a warning says so).
        y_val : array-like of shape (n_val_samples,), default=None
            Their labels (no ``-1``); given exactly when ``X_val`` is.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples in the classification loss (non-negative;
            those of unlabeled samples are ignored). They multiply
            ``class_weight``; see there for the scaling. Uniform weights fit
            exactly as no weights.

        Returns
        -------
        self : SemiSupervisedAssociationClassifier
            The fitted estimator.

        Raises
        ------
        KeyboardInterrupt
            On a Ctrl-C, after keeping what was trained (see above).
        """
        group = default_group()
        if group is None and self.devices is not None:
            devices = resolve_devices(self.devices)
            if len(devices) > 1:
                return self._fit_on_devices(devices, X, y, X_val, y_val, sample_weight)
        with raised_together(group, "the checks of their device and input"):
            self._check_device(group)
            inputs = validate_training_inputs(self, X, y, sample_weight)
            validation = self._validation_set(X_val, y_val, inputs)
        seed = self._fit_seed(group)
        with raised_together(group, "their start (resume_from, settings)"):
            if self.early_stopping and validation is None:
                inputs, validation = hold_out_validation(
                    inputs, self.validation_fraction, seed
                )
            start, settings = self._start(inputs, seed)
        if self.verbose:
            # Where the progress bar goes.
            tqdm.write(describe_settings(settings), file=sys.stderr)
        [result] = train_estimators(
            [self],
            inputs,
            settings,
            previous=start.previous,
            validation=validation,
            loss_weights=classification_weights(self.class_weight, inputs),
            group=group,
        )
        if result.failed_at is not None:
            raise NonFiniteLossError(non_finite_message(result.failed_at))
        store_run(self, start)
        if result.error is not None:
            # The model of the steps completed is kept (as after a Ctrl-C).
            raise result.error
        interrupted = interruption(result, settings.training)
        if interrupted is not None:
            # The fitted model is kept, but a search, a cross-validation or a
            # script must stop rather than score it as a finished fit.
            raise KeyboardInterrupt(interrupted)
        warn_if_labels_unlearned(result, len(inputs.classes), settings.training)
        warn_if_suspect(self.fit_report_, self.n_iter_)
        return self

    def _fit_on_devices(self, devices, X, y, X_val, y_val, sample_weight):
        """Fit data-parallel in a process per device; take process 0's state."""
        fit_params = {"X_val": X_val, "y_val": y_val, "sample_weight": sample_weight}
        state, error, warned = fit_on_devices(self, devices, X, y, fit_params)
        if state is not None:
            # The new model, or (when the fit failed early) the one it had.
            set_fitted_state(self, state)
        # After the state, as one process warns: a warning made an error
        # leaves the fitted model in place, and does not hide the fit's error.
        try:
            warn_again(warned)
        except Exception:
            if error is None:
                raise
        if error is not None:
            raise error
        return self

    def _check_device(self, group):
        """Refuse a device this process lacks or its group's backend does
        not serve, and ``devices`` in a process of a group."""
        in_group = group is not None and self.devices is not None
        if in_group and len(resolve_devices(self.devices)) > 1:
            raise ValueError(
                f"devices={self.devices!r} starts a process per device, but "
                "this process is one of an initialized torch.distributed "
                "group (torchrun), whose processes train this fit together "
                "already. Leave devices=None under torchrun."
            )
        check_backend(fit_device(self), group)

    def _fit_seed(self, group):
        """This fit's seed; in a data-parallel fit, process 0's (every process
        must hold out the same validation samples and draw the same batches)."""
        seed = fit_seed(self.random_state)
        return seed if group is None else agreed_seed(seed, group)

    def _start(self, inputs, seed):
        """Where this fit starts (see ``previous_run``), and its settings."""
        start = previous_run(self, inputs)
        settings = resolve_fit_settings(self, inputs, start.previous, seed)
        if start.origin == "store" and (
            continued_run(start.previous, settings.training.max_iter) is None
        ):
            # The store's run has its steps: this fit trains from scratch.
            start = start._replace(previous=None, origin=None)
            settings = resolve_fit_settings(self, inputs, None, seed)
        return start, settings

    def _initial_model(self, inputs, settings, previous):
        """The model training starts from, on the training device."""
        device, spec = settings.device, settings.spec
        if previous is not None:
            return copy.deepcopy(previous.model).to(device)
        _check_network_size(spec, device)
        embedder = None
        if spec.network == "custom":
            # A custom module may already live on a GPU: probe it there.
            embedder = check_custom_module(self.network).to(device)
            sample = self._formatted_sample(inputs, spec, device)
            width, _ = probe_embedder(embedder, sample)
            spec = type(spec)(**{**spec.__dict__, "embedding_dim": width})
        model = build_model(spec, embedder)
        fit_input_statistics(model, inputs.data, spec.network)
        model = placed(model, device, spec)
        # cuDNN may autotune (and synchronize the device) for a new shape:
        # never while another thread captures a CUDA graph.
        with cuda_rng_lock(device):
            sample = self._formatted_sample(inputs, spec, device)
            _, activation_bytes = probe_embedder(model.embedder, sample)
        _check_step_memory(settings, model, activation_bytes)
        return model

    def _fitted_class_prior(self, model, inputs, settings):
        """``class_prior_`` for the trained ``model``, from the checked parameter."""
        class_prior = settings.class_prior
        if not isinstance(class_prior, str):
            return class_prior
        if class_prior == "uniform":
            return uniform_prior(len(inputs.classes))
        indices = prior_samples(inputs.encoded, settings.seed)
        if len(indices) == 0:
            return label_frequencies(inputs.encoded, len(inputs.classes))
        device = settings.device
        precision = resolve_precision(self.precision, device, images=inputs.images)
        batch_size = self._predict_batch_size(device)
        # Gathered a batch at a time: a memory map is never read whole.
        proba = [
            run_model(model, inputs.data[batch], device, precision, "proba", batch_size)
            for batch in np.split(indices, range(batch_size, len(indices), batch_size))
        ]
        return estimate_class_prior(np.concatenate(proba))

    def _fit_report(self, model, inputs, settings):
        """``fit_report_`` for the trained ``model`` (see ``_diagnosis``)."""
        device = settings.device
        precision = resolve_precision(self.precision, device, images=inputs.images)
        batch_size = self._predict_batch_size(device)

        def embed(indices):
            # Gathered a batch at a time: a memory map is never read whole.
            return np.concatenate(
                [
                    run_model(
                        model,
                        inputs.data[batch],
                        device,
                        precision,
                        "embedding",
                        batch_size,
                    )
                    for batch in np.split(
                        indices, range(batch_size, len(indices), batch_size)
                    )
                ]
            )

        def features(indices):
            if inputs.sparse:
                return inputs.data.matrix[indices]
            return inputs.data[indices]

        return fit_report(
            embed,
            model.logits,
            inputs.encoded,
            inputs.classes,
            settings.class_prior,
            settings.seed,
            features,
        )

    @staticmethod
    def _formatted_sample(inputs, spec, device):
        """Two training samples as the embedder sees them."""
        sample = as_tensor(inputs.data[:2]).to(device).float()
        input_format = spec.input_format()
        return sample if input_format is None else input_format.to(device)(sample)

    def _validation_set(self, X_val, y_val, inputs):
        """``X_val`` in the model's layout and ``y_val``, or None without them."""
        if X_val is None and y_val is None:
            return None
        if X_val is None or y_val is None:
            raise ValueError(
                "X_val and y_val go together: pass both to measure the accuracy "
                "on them during training, or neither."
            )
        if is_sparse(X_val) and not (inputs.sparse or self.network == "sparse_mlp"):
            raise ValueError(
                "X_val is sparse but X is dense: pass X_val in the form of X "
                "(X_val.toarray()), or both sparse."
            )
        probe = unfitted_copy(self, n_features_in_=inputs.n_features)
        if inputs.feature_names is not None:
            probe.feature_names_in_ = inputs.feature_names
        try:
            X_val = inputs_like_training(probe, X_val, inputs.image_shape)
        except ValueError as exc:
            # The checks word their errors for X; say which input they mean.
            raise ValueError(
                f"X_val does not fit the training inputs X: {exc}"
            ) from exc
        if len(X_val) == len(inputs.encoded):
            warnings.warn(
                f"X_val has as many samples as X ({len(X_val)}). A search or "
                "cross-validation (GridSearchCV, cross_validate, ...) slices "
                "every fit parameter of that length per fold, X_val and y_val "
                "included, so each fold would validate on a slice. If this "
                "fit runs in one, use early_stopping=True without X_val.",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
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
        unknown = np.setdiff1d(y_val, inputs.classes)
        if len(unknown):
            raise ValueError(
                f"y_val holds labels that no labeled sample of y has: "
                f"{unknown[:5].tolist()}; the model predicts only "
                f"{inputs.classes.tolist()[:10]}. Check that y_val uses the "
                "labels (and their type) of y."
            )
        return X_val, y_val

    def _scorer_during_fit(self, model, validation, inputs, settings):
        """The accuracy on ``X_val`` of the model being trained, or None."""
        if validation is None:
            return None
        X_val, y_val = validation
        classes, device = inputs.classes, settings.device
        precision = settings.training.precision
        batch_size = self._predict_batch_size(device)

        def evaluate():
            proba = run_model(model, X_val, device, precision, "proba", batch_size)
            return np.mean(classes[np.argmax(proba, axis=1)] == y_val)

        return evaluate

    # ------------------------------------------------------------ inference

    def _predict_batch_size(self, device):
        """``predict_batch_size``, checked (it may have been set after fit)."""
        validate_parameter_constraints(
            {"predict_batch_size": self._parameter_constraints["predict_batch_size"]},
            {"predict_batch_size": self.predict_batch_size},
            caller_name=type(self).__name__,
        )
        return resolve_predict_batch_size(self.predict_batch_size, device)

    def _forward(self, X, output):
        """Run ``X`` through the fitted model; ``output`` picks what to keep.

        Returns the fitted state used too, so that a caller reads one model
        even while another thread refits this estimator.
        """
        state = get_fitted_state(self)
        batch_size = self._predict_batch_size(state.device)
        fitted = {"n_features_in_": state.n_features_in}
        if state.feature_names_in is not None:
            fitted["feature_names_in_"] = state.feature_names_in
        if is_sparse(X):
            check_sparse_model(state.network)
        data = inputs_like_training(unfitted_copy(self, **fitted), X, state.input_shape)
        precision = resolve_precision(
            self.precision, state.device, images=data.ndim == 4
        )
        result = run_model(
            state.model, data, state.device, precision, output, batch_size
        )
        if result is None:
            width = (
                state.model.logits.in_features
                if output == "embedding"
                else len(state.classes)
            )
            result = np.empty((0, width), dtype=np.float32)
        return state, result

    def _proba_and_state(self, X):
        state, proba = self._forward(X, "proba")
        if not np.isfinite(proba).all():
            raise ValueError(
                "The model's class probabilities are NaN for some samples: its "
                "weights or the inputs hold NaN or values too large for "
                "float32. Check X (and rescale it), or refit the model."
            )
        return state, apply_class_prior(proba.astype(np.float64), state.class_prior)

    def predict_proba(self, X):
        """Class probabilities: the logit layer's, weighed by ``class_prior_``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), (n_samples, h, w) \
                or (n_samples, c, h, w)
            Inputs, in the same form as in ``fit``.

        Returns
        -------
        proba : ndarray of shape (n_samples, n_classes)
            Probability of every class in :attr:`classes_`, float64.
        """
        return self._proba_and_state(X)[1]

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
        state, proba = self._proba_and_state(X)
        return state.classes[np.argmax(proba, axis=1)]

    def score(self, X, y, sample_weight=None):
        """Accuracy on the labeled samples of ``(X, y)``; ``-1`` samples are ignored.

        A ``y`` from ``fit``'s convention (with ``-1`` for unlabeled samples)
        scores only the samples whose label is known, so that model
        selection on semi-supervised labels measures accuracy, not the share
        of labeled samples. See :mod:`skassoc.model_selection` for splitters
        and scorers that do the same for other metrics.

        Parameters
        ----------
        X : array-like of shape (n_samples, ...)
            Inputs, in the same form as in ``fit``.
        y : array-like of shape (n_samples,)
            True labels; ``-1`` marks samples to leave out.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples.

        Returns
        -------
        score : float
            Accuracy of :meth:`predict` on the labeled samples.

        Raises
        ------
        ValueError
            If every label of ``y`` is ``-1``.
        """
        from sklearn.metrics import accuracy_score
        from sklearn.utils import _safe_indexing

        y = column_or_1d(y, warn=True)
        labeled = np.flatnonzero(~unlabeled_mask(np.asarray(y)))
        if len(labeled) == 0:
            raise ValueError(
                "Every label of y is -1 (unlabeled): there is nothing to score. "
                "Score on samples whose labels are known."
            )
        check_consistent_length(X, y)
        if sample_weight is not None:
            sample_weight = np.asarray(sample_weight)[labeled]
        return accuracy_score(
            y[labeled],
            self.predict(_safe_indexing(X, labeled)),
            sample_weight=sample_weight,
        )

    def suggest_labels(self, X, n_labels=10, *, y=None, random_state=None):
        """Unlabeled samples whose labels should help this model most.

        Regions of the unlabeled samples that no labeled sample lies in are
        where a few-label fit goes wrong, confidently: a style of one class
        handed to another. This clusters the samples' embeddings into as
        many regions as there are labeled samples and new labels, and
        returns the most typical sample of each region without a label,
        the largest first, weighted up where the predicted class exceeds
        its expected share (``fit_report_``, where it knows the expected
        shares) and where the walks from the labeled samples rarely go.
        When ``fit_report_`` is ``"suspect"``, the labels go to the class it
        names: its predictions are clustered into as many regions as it has
        labels and new ones, and the picks are the typical samples of the
        regions that none of its labels lies in (a style of another class
        handed to it), topped up from the whole pool when the class has
        fewer predictions than labels asked for. When more labels are asked
        for than there are regions without one, the rest come from the
        other regions, each distinct sample before any copy of one. Label
        them and fit again.

        Parameters
        ----------
        X : array-like of shape (n_samples, ...)
            Samples, in the same form as in ``fit``; usually the training
            samples.
        n_labels : int, default=10
            How many samples to suggest (fewer when ``X`` holds fewer
            unlabeled ones).
        y : array-like of shape (n_samples,), default=None
            Labels as in ``fit`` (``-1`` unlabeled), each a class of the
            fit (``classes_``). The labeled samples mark the regions
            already covered, and only unlabeled samples are suggested.
            Without ``y`` every sample of ``X`` is a candidate and no
            region counts as covered.
        random_state : int, RandomState instance or None, default=None
            Seeds the clustering.

        Returns
        -------
        indices : ndarray of int
            Positions in ``X`` of the suggested samples (``X.iloc[indices]``
            for a DataFrame), in the order to label them. The regions
            depend on ``n_labels``: a call for fewer labels may begin with
            other samples than this call's first ones.

        Raises
        ------
        ValueError
            If ``X`` is empty, if ``y`` does not give one label per sample
            of ``X``, has no ``-1``, or holds a label that is no class of
            the fit.

        See Also
        --------
        skassoc.active.association_sampling : The same as a query strategy
            of modAL's ``ActiveLearner``.
        """
        validate_parameter_constraints(
            {"n_labels": [Interval(Integral, 1, None, closed="left")]},
            {"n_labels": n_labels},
            caller_name="suggest_labels",
        )
        check_is_fitted(self)
        return suggest_labels(self, X, n_labels, y, random_state)

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
        return self._forward(X, "embedding")[1]

    @property
    def embedding_dim_(self):
        """Width of the embedding (the number of output features of ``transform``)."""
        return get_fitted_state(self).model.logits.in_features

    @property
    def validation_scores_(self):
        """Accuracy at every validation of the last fit, or None without any."""
        scores = get_fitted_state(self).history.get("validation_score")
        return None if scores is None else list(scores)

    @property
    def best_validation_score_(self):
        """Best of :attr:`validation_scores_` (None without validation)."""
        scores = self.validation_scores_
        return max(scores) if scores else None

    @property
    def _n_features_out(self):
        """Number of output features of ``transform`` (for feature names)."""
        return self.embedding_dim_

    def __sklearn_is_fitted__(self):
        return is_fitted(self)

    # ---------------------------------------------------------- persistence

    def save(self, path, *, training_state=False):
        """Save the fitted estimator to one file, without pickle.

        The file is a zip archive of the parameters and fitted attributes as
        JSON and the network weights; see :func:`load` for what reading it
        may and may not do. Callbacks are never saved.

        Parameters
        ----------
        path : str, bytes or os.PathLike
            Where to write the model (extension ``.skassoc`` suggested). The
            file is written beside it under a temporary name and renamed
            over it at the end; a symbolic link at ``path`` is replaced by
            the file, not followed. Anything else than a regular file or a
            link at ``path`` (a directory, a FIFO, a device) is refused.
        training_state : bool, default=False
            Also store what continuing the run needs (``training_state_``:
            Adam's moments, the schedule's step, the moving average of the
            weights, the balance loss's estimate, the random streams), as
            :class:`~skassoc.callbacks.Checkpoint` does: a warm start of the
            loaded estimator then continues the run up to ``max_iter``. The
            file is about three times the weights' size (five with
            ``ema_decay``).

        Raises
        ------
        ValueError
            If the estimator uses a custom ``torch.nn.Module`` network, a
            parameter or label cannot be stored as JSON or is beyond the
            limits of model files (the user guide's table), ``path`` is
            not a regular file, or ``training_state=True`` and the estimator
            has none (``training_state_`` is None: early stopping kept the
            weights of an earlier step, or it was loaded from a file without
            one). Nothing is written then.
        """
        save_model(self, path, training_state=training_state)

    @classmethod
    def load(cls, path, *, device="auto"):
        """Load an estimator saved by :meth:`save`; runs no code from the file.

        The file configures only what it may: the network's architecture
        (checked against the weights present before anything is built),
        the weights (finite float32 tensors), the classes, the output
        configuration of ``set_output`` and the training hyperparameters,
        each within limits, and, in a checkpoint, the run's state (see
        ``save``). ``compile``, ``device``, ``devices``, ``callbacks`` and
        ``resume_from`` are never read from it (``compile`` is off,
        ``device`` is this method's argument, the others None). Anything
        outside these bounds is refused with a ``ValueError`` before it is
        allocated.

        Parameters
        ----------
        path : str, bytes or os.PathLike
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
            tampered with, from an incompatible version, or outside the
            limits above). Files of formats 1 and 2, whose weights are a
            torch pickle, are refused: convert them once with
            :func:`~skassoc.convert_model_file`.
        """
        return load_model(cls, path, device=device)

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
        # Pickled before class_prior existed: it predicted with equal
        # frequencies.
        self.__dict__.setdefault("class_prior", "uniform")
        if "model_" in state and "class_prior_" not in state:
            self.class_prior_ = uniform_prior(len(self.classes_))
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
        # CSR and CSC rows train the "sparse_mlp" network (other formats are
        # refused with advice).
        tags.input_tags.sparse = True
        # The network computes in float32 whatever the input dtype.
        tags.transformer_tags.preserves_dtype = ["float32"]
        return tags


def _check_network_size(spec, device):
    """Refuse a network that cannot fit on ``device``, before allocating it.

    A built-in network is built on the meta device, which allocates nothing,
    and runs two samples there: its parameters (with their gradients and
    Adam's two moments), the two samples' activations and the samples as
    the network sees them (after ``image_size``) must fit in the free
    memory. Only the last is known ahead of a custom module.
    """
    available = available_memory_bytes(device)
    if available is None:
        return
    shape = spec.network_shape or (spec.n_features,)
    needed = 2 * math.prod(shape) * 4
    advice = ["image_size"] if spec.image_size is not None else []
    parts = f"two samples of shape {tuple(shape)} as it sees them"
    if spec.network != "custom":
        # Running on the meta device imports torch._dynamo.
        load_torch_dynamo()
        with torch.device("meta"):
            model = build_model(spec)
            sample = torch.empty((2, *shape))
            _, activation_bytes = probe_embedder(model.embedder, sample)
        n_parameters = sum(p.numel() for p in model.parameters())
        needed += 16 * n_parameters + 2 * activation_bytes
        parts = (
            f"{n_parameters:,} parameters with their gradients and Adam's "
            f"moments, and {parts} with their activations"
        )
        advice.append("embedding_dim")
        if takes_hidden_layer_sizes(spec.network):
            advice.append("hidden_layer_sizes")
    if needed > available and advice:
        raise ValueError(
            f"The {spec.network} network needs at least {_memory(needed)} on "
            f"{device} ({parts}), but about {_memory(available)} is free. "
            f"Lower {' or '.join(advice)}."
        )


def _memory(n_bytes):
    """``n_bytes`` for a message: in GiB, or in MiB below a tenth of one."""
    if n_bytes >= 2**30 / 10:
        return f"{n_bytes / 2**30:,.1f} GiB"
    return f"{n_bytes / 2**20:,.1f} MiB"


def fit_input_statistics(model, data, network):
    """Let a built-in embedder learn its input scale from the training inputs.

    The MLP learns its standardisation, the image networks the range of the
    pixel values; a custom module learns nothing here.
    """
    if network == "custom":
        return
    input_format = None
    if not isinstance(model.input_format, torch.nn.Identity):
        input_format = model.input_format
    model.embedder.fit_normalization(data, input_format)


def run_model(model, data, device, precision, output, batch_size):
    """Run validated ``data`` through ``model`` in batches (None when empty).

    ``output`` is ``"embedding"`` or ``"proba"``.
    """
    memory_format = torch.channels_last if data.ndim == 4 else torch.contiguous_format
    chunks = []
    # The lock: cuDNN's autotuning of new batch shapes synchronizes the
    # device, which must not happen while a fit in another thread captures
    # its CUDA graph (see _device.cuda_rng_lock).
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
                    result = embeddings.float()
                else:
                    logits = model.logits(embeddings).float().cpu().double()
                    result = torch.softmax(logits, 1)
            chunks.append(result.cpu().numpy())
    return np.concatenate(chunks) if chunks else None


def _check_step_memory(settings, model, activation_bytes):
    """Refuse batch sizes whose training step cannot fit in memory."""
    available = available_memory_bytes(settings.device)
    if available is None:
        return
    n_classes = model.logits.out_features
    needed = step_memory_bytes(
        n_labeled=n_classes * settings.labeled_per_class,
        n_unlabeled=settings.unlabeled_batch_size,
        views=2 if settings.training.second_view else 1,
        embedding_dim=model.logits.in_features,
        activation_bytes=activation_bytes,
        n_parameters=sum(p.numel() for p in model.parameters()),
        chunk_size=embedding_chunk_size(model, settings.training),
    )
    if needed > available:
        raise ValueError(
            f"One training step needs about {needed / 2**30:.1f} GiB on "
            f"{settings.device} but about {available / 2**30:.1f} GiB is free: "
            f"{n_classes} classes x labeled_per_class="
            f"{settings.labeled_per_class} labeled and unlabeled_batch_size="
            f"{settings.unlabeled_batch_size} unlabeled samples, embedded in "
            f"{model.logits.in_features} dimensions (the walker's matrices "
            "grow with the square of the labeled batch). Lower "
            "labeled_per_class, unlabeled_batch_size or embedding_dim."
        )
