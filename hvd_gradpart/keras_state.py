"""Compressor state inside Keras's own checkpoints.

Horovod's Keras ``DistributedOptimizer`` keeps the compression object in a
closure, so Keras checkpoints (``ModelCheckpoint`` with TF-format weights,
``BackupAndRestore``, ``model.save_weights``) never see the residuals.
``track`` attaches the compressor to the optimizer as a tracked attribute:
the optimizer is part of the model's checkpoint, so the residuals,
predictions and step counters are saved and restored with it (also when the
restore comes before the first step: the slots are restored as they are
created). The optimizer, not the model, holds it, so ``model.variables``
and ``optimizer.variables`` (what Horovod broadcasts from rank 0) stay
free of rank-local residuals.

Every rank's residual is its own, so every rank must write and read its own
checkpoint (e.g. ``ckpt/rank{hvd.rank()}/...``): saving on rank 0 only
loses the other ranks' residual mass.
"""
from hvd_gradpart.metrics import resolve

ATTRIBUTE = "gradient_compression"


def track(optimizer, compression):
    """Makes Keras checkpoints of ``optimizer`` (and of its model) carry ``compression``.

    Args:
        optimizer: the Keras optimizer returned by
            ``horovod.tensorflow.keras.DistributedOptimizer``.
        compression: what was passed to it as ``compression``: an instance,
            a class (its default instance is tracked) or one of Horovod's
            dense compressors (nothing to track).

    Returns:
        ``optimizer``.

    Raises:
        ValueError: ``optimizer`` already tracks a different compressor.
    """
    instance = resolve(compression)
    if instance is None:
        return optimizer
    held = getattr(optimizer, ATTRIBUTE, None)
    if held is not None and held is not instance:
        raise ValueError(f"this optimizer already tracks another compressor ({held.name}); "
                         "one optimizer carries the state of one compressor")
    setattr(optimizer, ATTRIBUTE, instance)
    # Keras 2's legacy optimizers (OptimizerV2) do not track attributes by themselves.
    optimizer._track_trackable(instance, name=ATTRIBUTE, overwrite=True)
    return optimizer
