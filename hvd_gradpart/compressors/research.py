"""GradPart's research settings: the knobs and ablation switches behind its defaults.

A user sets none of them: the defaults are the tested ones (``docs/algorithm.md`` gives each
formula). A study sets them here, ``GradPartCompressor(research=GradPartResearch(fit=False))``,
or flat through the registry, ``get_compressor("gradpart", fit=False)`` (the method grammar's
``gradpart,fit=false``). Every field is hashed into the payload headers with the user's
settings, so ranks that disagree on one stop with a clear error.
"""
import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class GradPartResearch:
    """GradPart's research knobs and ablation switches; invalid values raise ``ValueError``."""

    # Knobs: how the rule is estimated and guarded.
    sample_size: int = 4096        # elements sampled (strided) for each step's fit: bounds its O(sample) cost
    prediction_decay: float = 0.9  # EMA weight of the previous steps' fit: one noisy step moves the
                                   # thresholds by at most a tenth of its change
    margin: float = 0.0            # nats added to every position cost (> 0: a sparser exchange)
    density_floor: float = 1e-4    # least fraction a tensor sends per step (exact top-k tops it up)
    warmup_steps: int = 0          # steps over which the floor falls log-linearly from the density
                                   # ceiling to density_floor, a dense start (0: none)
    fixed_density: float = 1e-3    # the tail fraction of the fitted distribution sent when entropy is off
    max_rank: int = 4              # the most directions a spectral key area sends per step
    # Ablation switches: False takes a stage out, to measure what it buys (spectral: True puts one in).
    fit: bool = True               # False: the Gaussian family, not the likelihood's choice
    partition: bool = True         # False: one area for the whole tensor, no key area
    entropy: bool = True           # False: send the fixed tail fraction fixed_density, not the entropy rule
    predict: bool = True           # False: each step's own fit, no EMA over steps
    spectral: bool = False         # True: matrix-shaped gradients also get a key area in their own basis
                                   # (hvd_gradpart.spectral); off by default: it sped an MLP up at 20 Mbit/s
                                   # only, and cost accuracy after 10 epochs (docs/notes/gradpart.md)
    outliers: bool = True          # False: a step that sends a spectral key area sends nothing else of
                                   # that tensor (the key area alone: adaptive-rank PowerSGD)

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type is bool:
                if not isinstance(value, bool):
                    raise _invalid(field, "True or False", value)
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or not _CHECKS[field.name][0](value):
                raise _invalid(field, _CHECKS[field.name][1], value)

    @property
    def decay(self):
        """The EMA weight the prediction uses: ``prediction_decay``, or 0 with ``predict`` off."""
        return self.prediction_decay if self.predict else 0.0


_CHECKS = {  # field -> (whether a number is valid, the range an error names)
    "sample_size": (lambda v: isinstance(v, int) and v >= 16, "an int >= 16"),
    "prediction_decay": (lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
    "margin": (lambda v: math.isfinite(v) and v >= 0.0, "finite and >= 0"),
    "density_floor": (lambda v: 0.0 <= v <= 1.0, "in [0, 1]"),
    "warmup_steps": (lambda v: isinstance(v, int) and v >= 0, "an int >= 0"),
    "fixed_density": (lambda v: 0.0 < v < 1.0, "in (0, 1)"),
    "max_rank": (lambda v: isinstance(v, int) and v >= 1, "an int >= 1"),
}


def _invalid(field, valid, value):
    """The ``ValueError`` of a research field set outside its range."""
    return ValueError(f"GradPartResearch: {field.name} must be {valid}, got {value!r}; "
                      f"leave it out for the tested default {field.default!r}")
