"""hvd_gradpart.branch: a cond that stays a functional If op and runs the taken branch alone."""
import tensorflow as tf

from hvd_gradpart import branch


def test_both_branches_give_tf_cond_s_values_and_only_the_taken_one_runs():
    ran = tf.Variable([0.0, 0.0])

    @tf.function
    def step(pred, x):
        def taken(i, value):
            def fn():
                ran.scatter_nd_add([[i]], [1.0])
                return value
            return fn
        return branch.cond(pred, taken(0, x * 2.0), taken(1, x - 1.0))

    assert step(tf.constant(True), tf.constant(3.0)).numpy() == 6.0
    assert step(tf.constant(False), tf.constant(3.0)).numpy() == 2.0
    assert ran.numpy().tolist() == [1.0, 1.0]


def test_the_if_op_is_left_unlowered_in_a_graph():
    @tf.function
    def step(pred, x):
        return branch.cond(pred, lambda: (x + 1.0, x), lambda: (x, x + 1.0))

    graph = step.get_concrete_function(tf.constant(True), tf.constant(1.0)).graph
    ifs = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    assert len(ifs) == 1 and ifs[0].get_attr("_lower_using_switch_merge") is False


def test_eagerly_it_is_tf_cond():
    assert branch.cond(tf.constant(False), lambda: 1, lambda: 2) == 2
