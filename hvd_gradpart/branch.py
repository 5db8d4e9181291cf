"""A ``tf.cond`` whose branch not taken costs nothing.

Inside a ``tf.function`` TensorFlow lowers ``tf.cond`` to ``Switch``/``Merge`` nodes: the branch
not taken computes nothing, but every one of its nodes still passes through the executor, fed a
dead tensor. The sparse exchange's branches (sweep, selection, encoding, the walk over every
rank's payload and its decoding) hold hundreds of nodes per gradient, which a step that hands
Horovod the dense gradient paid for in full. Kept as the functional ``If`` op that XLA contexts
get, the op calls the taken branch's function alone.
"""
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

_IF_OPS = ("If", "StatelessIf")


def cond(pred, true_fn, false_fn):
    """``tf.cond(pred, true_fn, false_fn)``, left unlowered inside a graph (see the module doc)."""
    out = tf.cond(pred, true_fn, false_fn)
    if not tf.executing_eagerly():
        for tensor in tf.nest.flatten(out):
            op = tensor.op.inputs[0].op if tensor.op.type == "Identity" and tensor.op.inputs else tensor.op
            if op.type in _IF_OPS:
                op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))  # noqa: SLF001
                break
    return out
