"""Error feedback's sums handed to a momentum optimizer so that it applies each one once.

Error feedback delivers a coordinate's gradient in bursts: nothing for some steps, then all
that accumulated. SGD with momentum ``beta`` repeats each burst for about ``1 / (1 - beta)``
steps, while the gradient that would brake the move waits in the residual until it is large
enough to be sent: the weights overshoot, and test accuracy falls by up to 10 points between
two evaluations of the first epochs (docs/notes/gradpart.md). Handing the optimizer

    d_t = (s_t - beta s_{t-1}) / (1 - beta)

in place of the decoded sum ``s_t`` makes its velocity ``m_t = beta m_{t-1} + d_t`` exactly
``s_t / (1 - beta)`` at every step (by induction from a zero velocity): each sum moves the
weights once, by ``lr s_t / (1 - beta)``, as plain SGD at the momentum's long-run rate would,
and the next step's gradient brakes at once. What is handed over adds up to the sums (the
velocity still holds the last one). A sum that is not finite (a mixed-precision step every
optimizer skips) passes unchanged and ``s_{t-1}`` stays as it was.

``beta`` is the optimizer's own: set by the compressor's ``optimizer_momentum``, or, when that
is None, read at trace time from the Keras optimizer whose ``hvd.DistributedOptimizer`` calls
``compress`` (an SGD optimizer's ``momentum``; 0 for any other optimizer, as Adam). Under
``hvd.DistributedGradientTape`` no optimizer is on the call stack; the optimizer is then the one
the user's step names: the innermost frame of the user's code (outside TensorFlow, Keras, Horovod
and this library) whose names or ``self.optimizer`` hold a Keras optimizer, as a step that ends
in ``opt.apply_gradients`` does (0 when none is named, and when those named disagree: ``follow``
or ``optimizer_momentum`` then says which). Under an optimizer without momentum ``beta`` must be
0: the hand-over would otherwise multiply each sum by ``1 / (1 - beta)``.
"""
import warnings

import tensorflow as tf

from hvd_gradpart import branch, fused
from hvd_gradpart.memory import callers, frames
from hvd_gradpart.metrics import resolve


def validate(momentum, owner):
    """``momentum`` (None or a float in [0, 1)) as given; raises ValueError naming ``owner`` otherwise."""
    if momentum is None:
        return None
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0.0 <= momentum < 1.0:
        raise ValueError(f"{owner}: optimizer_momentum must be None (read from the Keras optimizer) or the "
                         f"SGD optimizer's momentum in [0, 1) (0 for Adam or no momentum), got {momentum!r}")
    return float(momentum)


def of_optimizer(optimizer):
    """The momentum of a Keras SGD optimizer (a loss-scale optimizer's inner one); 0.0 for any
    other optimizer (Adam's and RMSprop's moments act after their own scaling, not on the sum)."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    if not isinstance(optimizer, (tf.keras.optimizers.SGD, tf.keras.optimizers.legacy.SGD)):
        return 0.0
    momentum = getattr(optimizer, "momentum", None)
    if momentum is None:  # tf.keras.optimizers.legacy.SGD keeps it among its hyperparameters
        momentum = optimizer._get_hyper("momentum") if optimizer._momentum else 0.0  # noqa: SLF001
    if isinstance(momentum, tf.Variable):
        with tf.init_scope():
            momentum = momentum.numpy()
    return float(momentum)


def follow(compression, optimizer):
    """Gives a compressor whose ``optimizer_momentum`` is None (to be read from a Keras
    optimizer on the call stack) ``optimizer``'s momentum, for a step where the optimizer is not
    on that stack (``hvd.DistributedGradientTape``); call it before the first step. Returns
    ``compression``."""
    instance = resolve(compression)
    if getattr(instance, "optimizer_momentum", 0.0) is None:
        instance.optimizer_momentum = of_optimizer(optimizer)
    return compression


LIBRARIES = ("tensorflow", "keras", "horovod", "hvd_gradpart")


def _optimizers():
    return tf.keras.optimizers.Optimizer, tf.keras.optimizers.legacy.Optimizer


def calling_optimizer():
    """``of_optimizer`` of the innermost Keras optimizer on the call stack, or else of the ones the
    user's step names (``named_by_the_step``); 0.0 when there is none."""
    kinds = _optimizers()
    found = next((owner for owner in callers() if isinstance(owner, kinds)), None)
    return of_optimizer(found) if found is not None else named_by_the_step()


def named_by_the_step():
    """The momentum of the Keras optimizers that the innermost frame of the user's code naming any
    reads (its local, free and global names, and ``self.optimizer``), when they agree; 0.0 when no
    frame names one, or with a warning when they disagree. Runs at trace time only."""
    kinds = _optimizers()
    for frame in frames():
        if frame.f_globals.get("__name__", "").split(".")[0] in LIBRARIES:
            continue
        code = frame.f_code
        seen = [frame.f_locals.get(name, frame.f_globals.get(name))
                for name in {*code.co_names, *code.co_varnames, *code.co_freevars}]
        if "optimizer" in code.co_names:
            seen.append(getattr(frame.f_locals.get("self"), "optimizer", None))
        betas = {of_optimizer(value) for value in seen if isinstance(value, kinds)}
        if len(betas) > 1:
            warnings.warn(f"hvd_gradpart: the step names optimizers of momenta {sorted(betas)}; no "
                          "sums are handed over: pass optimizer_momentum to the compressor, or call "
                          "hvd_gradpart.momentum.follow(compression, optimizer)", stacklevel=2)
            return 0.0
        if betas:
            return betas.pop()
    return 0.0


@tf.function(jit_compile=True, autograph=False)
def _handed(total, delivered, beta):
    return (total - beta * delivered) / (1 - beta), tf.reduce_all(tf.math.is_finite(total))


def hand_over(total, delivered, beta):
    """``d_t`` of the flat decoded sum ``total`` (module doc); stores ``total`` in ``delivered``
    (the variable holding ``s_{t-1}``) when it is finite."""
    handed, finite = fused.by_size(_handed, total.shape.num_elements())(
        total, delivered.value(), tf.constant(beta, total.dtype))

    def store():
        with tf.control_dependencies([delivered.assign(total, read_value=False)]):
            return tf.constant(True)

    with tf.control_dependencies([handed]):
        stored = branch.cond(finite, store, lambda: tf.constant(False))
    with tf.control_dependencies([stored]):
        return tf.identity(handed)
