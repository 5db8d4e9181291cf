from setuptools import find_packages, setup

setup(
    name="hvd_gradpart",
    version="0.1.0",
    description="Adaptive gradient-partition compression for Horovod + TensorFlow on slow edge links",
    packages=find_packages(include=["hvd_gradpart", "hvd_gradpart.*"]),
    python_requires=">=3.9,<3.12",
    install_requires=["tensorflow-cpu==2.15.1", "horovod==0.28.1", "numpy<2", "scipy"],
    extras_require={
        "test": ["pytest", "mlxtend", "scikit-learn", "matplotlib", "mpi4py"],
    },
)
