"""Price: the nats every area's position cost adds, set so the values sent cost their share of a step.

Time to accuracy is steps times a step's time. A step takes ``S = T0 + c V``: a part that
does not depend on the values sent (the model's compute, the collectives' rounds, a call
per tensor) and ``c`` seconds per value sent (its link time and the CPU work that grows with
it: compaction, coding, every rank's decode), both measured in the running job
(``bandwidth.step_value_s``). The steps to an accuracy fall with the density ``d`` about as
``d ** -e``; ``e``, the steps' elasticity, is what the Top-k grid of the time-to-accuracy
matrix shows (0.07 to 0.18 over its ten cells, docs/algorithm.md). ``d ** -e (T0 + c V)`` is
least where ``c V = e S``: the values cost the share ``e`` of the step. So the price moves
by ``gain`` nats per e-fold of ``c V / (e S)`` (up while the values cost more than their share,
down while less), at most ``max_move`` a step. A slower link or a dearer decode raises ``c``
and lowers the density; a heavier model (larger ``T0``) raises it; nothing is set by hand.
Where the density ceiling holds for the bulk of the gradient (the rule offered more than
``capped_at`` times what was sent, a geometric mean over tensors by size) and values still
cost less than their share, the price holds: the ceiling's share then travels every step (its
largest candidates), not a full step and a light one by turns, as error feedback makes of a
rule held at its bound. It rises only while the offer exceeds ``offer_limit`` times what was
sent (each candidate costs the step a compaction). Where the density floor holds for the bulk
(the rule offered less than ``1 / capped_at`` of what was sent: a start, before the residual
has built up, a position cost of 13 nats leaves a threshold tens of deviations out) and values
cost less than their share, the price falls ``starved_move`` a step, so the start is not starved.
"""
import math


def moved(price, share, config, capped=1.0):
    """The next price, from the step's ``share`` spent on its values (``c V / S``) and the values
    the rule offered over those sent (``capped`` > 1: the ceiling held, < 1: the floor; a
    geometric mean over the gradients by size)."""
    gap = math.log(share / config.elasticity) if share > 0.0 else -float("inf")
    step = max(-config.max_move, min(config.max_move, config.gain * gap))
    if capped > config.capped_at and step < 0.0:
        step = min(config.gain * max(math.log(capped / config.offer_limit), 0.0), config.max_move)
    elif capped < 1.0 / config.capped_at and step < 0.0:
        step = -config.starved_move
    return max(-config.price_limit, min(config.price_limit, price + step))


def value_share(value_s, values, step_s):
    """The share of a step's time that its ``values`` cost at ``value_s`` seconds each."""
    return value_s * values / step_s if step_s > 0.0 else 0.0
