"""Pacing: the optimizer gets a delivered sum at the rate it accumulated.

Under error feedback a coordinate below the threshold travels once every
``k`` steps, as the sum of ``k`` gradients. Plain SGD applies that sum as if
it had come step by step; an adaptive optimizer (Adam, RMSprop, Adagrad)
does not: it divides by a running root mean square of what it is given, so
a ``k``-fold value once every ``k`` steps moves the weight about ``sqrt(k)``
times less than ``k`` values of one, and the rarely sent coordinates barely
train. ``Pacer`` keeps, per coordinate, the delivered sum not yet handed on
(``held``), a rate and the steps since the last delivery (``age``). A
delivery adds to ``held`` and sets the rate to ``held / (age + 1)``: the sum
is handed on over as many steps as it took to build. Each step hands on the
rate, never more than is held, so what the optimizer gets adds up to what
was delivered (nothing is lost, only spread), and coordinates sent every
step pass straight through. Every input is the gathered sum, the same on
all ranks, so the pacing state is the same on all ranks too.
"""
import tensorflow as tf


class Pacer(tf.Module):
    """Pacing state of one gradient (checkpointed with its slot)."""

    def __init__(self, n, dtype):
        super().__init__(name="pacer")
        self.held = tf.Variable(tf.zeros([n], dtype), trainable=False, name="held")
        self.rate = tf.Variable(tf.zeros([n], dtype), trainable=False, name="rate")
        self.age = tf.Variable(tf.zeros([n], tf.int32), trainable=False, name="age")

    def restart(self):
        """Empties the pacing state (what it held is dropped), as at creation."""
        for var in (self.held, self.rate, self.age):
            var.assign(tf.zeros_like(var))

    def release(self, delivered):
        """This step's share of everything delivered so far; ``delivered`` is
        the step's flat gathered sum (zero where nothing came)."""
        out, held, rate, age = pace(delivered, self.held.value(), self.rate.value(), self.age.value())
        self.held.assign(held, read_value=False)
        self.rate.assign(rate, read_value=False)
        self.age.assign(age, read_value=False)
        return out


@tf.function(jit_compile=True)
def pace(delivered, held, rate, age):
    """One step of pacing, one compiled pass: ``(out, held, rate, age)`` next."""
    came = tf.not_equal(delivered, 0)
    held = held + delivered
    rate = tf.where(came, held / tf.cast(age + 1, held.dtype), rate)
    age = tf.where(came, 0, age + 1)
    out = tf.where(tf.abs(held) <= tf.abs(rate), held, rate)
    return out, held - out, rate, age
