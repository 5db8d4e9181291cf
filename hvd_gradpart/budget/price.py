"""Price: the nats every area's position cost adds, set from what a sent value buys now.

Progress of a step is read as the share of the accumulated gradient's energy that travels,
per tensor, weighted by its size: ``P = sum_t (n_t / N) * E_sent_t / E_acc_t``. A step
takes ``S`` seconds; one more value costs ``c`` link seconds. Progress per second ``P / S``
grows with one more value ``i`` of tensor ``t`` while its own share ``a_i**2 / (N m_t)``
(``m_t = E_acc_t / n_t``, the tensor's mean square) beats ``c P / S``, i.e. while its
*worth* ``a_i**2 / m_t`` beats ``kappa = N c P / S``. The marginal value sent is the
smallest of each tensor's selection; its worth, averaged in log over the tensors by size,
is compared with ``kappa``: a price too high leaves worthy values in the residual (the
price falls), one too low sends values whose time buys less than the step's average (it
rises). A residual that piles up (late training, a plateau) lowers ``P`` and so ``kappa``:
the price falls and more travels; a gradient whose energy sits in few values keeps it
high. The move is ``gain`` nats per e-fold of the gap, at most ``max_move`` a step. Where
the density ceiling holds for the bulk of the gradient (the rule offered more than
``capped_at`` times what was sent, a geometric mean over tensors by size) and
values are still worth their time, the price holds: the ceiling's share then travels every
step (its largest candidates), not a full step and a light one by turns, as error feedback
makes of a rule held at its bound. It rises only while the offer exceeds ``offer_limit``
times what was sent (each candidate costs the step a compaction).
"""
import math


def moved(price, log_worth, kappa, config, capped=1.0):
    """The next price, from the marginal value's log worth and the time it costs (``kappa``),
    and the values the rule offered over those sent (``capped`` > 1: the ceiling held; a
    geometric mean over the gradients by size)."""
    gap = log_worth - math.log(kappa) if kappa > 0.0 else float("inf")
    step = -config.gain * gap
    if capped > config.capped_at and step < 0.0:
        step = config.gain * max(math.log(capped / config.offer_limit), 0.0)
    step = max(-config.max_move, min(config.max_move, step))
    return max(-config.price_limit, min(config.price_limit, price + step))


def kappa(elements, value_s, captured, step_s):
    """The worth a marginal value must have to pay for its link time: ``N c P / S``."""
    return elements * value_s * captured / step_s if step_s > 0.0 else 0.0
