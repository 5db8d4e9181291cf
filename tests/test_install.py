"""Installing hvd_gradpart into an existing Horovod environment adds no TensorFlow or Horovod.

pip runs with ``--dry-run --no-index``: nothing is downloaded or installed,
and a dependency the environment cannot satisfy fails the resolution
instead of being fetched. Its JSON report (``--report -``) lists what an
install would add.
"""
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # launches horovodrun: the whole suite (`make test-all`), not the fast tier

ROOT = Path(__file__).resolve().parents[1]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
# A GPU user's environment: TensorFlow under the distribution name `tensorflow`, not `tensorflow-cpu`.
GPU_ENVIRONMENT = {"tensorflow": "2.15.1", "horovod": "0.28.1", "numpy": "1.26.4", "scipy": "1.17.1"}


def dry_run(*args, python=None):
    """Names of the distributions ``pip install --dry-run`` would install, from its report.

    Args:
        *args: what to install, and pip options.
        python: the environment's interpreter (default: this one).
    """
    cmd = [*PIP, *(["--python", str(python)] if python else []), "install", "--dry-run", "--no-index", "--quiet", "--report", "-", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return sorted(item["metadata"]["name"] for item in json.loads(done.stdout)["install"])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """This package built as a wheel (offline, with the environment's setuptools), from a copy
    so the build leaves nothing in the tree; the copy holds the evaluation's packages beside the
    library, as the repository does."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"
    for package in ("hvd_gradpart", "harness", "benchmarks"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.py", source)
    subprocess.run([*PIP, "wheel", "--no-deps", "--no-index", "--no-build-isolation", "--quiet",
                    "-w", str(out), str(source)], check=True, timeout=120)
    return next(out.glob("hvd_gradpart-*.whl"))


def fake_environment(folder, distributions):
    """An empty virtual environment whose site-packages claims ``distributions`` installed
    (metadata only: pip's resolver reads nothing else)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    python = folder / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    for name, version in distributions.items():
        info = Path(site) / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return python


def test_built_environment_gets_only_the_package():
    assert dry_run("--no-build-isolation", ".") == ["hvd-gradpart"]


def test_gpu_tensorflow_environment_gets_no_second_tensorflow(wheel, tmp_path):
    python = fake_environment(tmp_path / "env", GPU_ENVIRONMENT)
    assert dry_run(str(wheel), python=python) == ["hvd-gradpart"]


def test_wheel_holds_the_library_alone(wheel):
    """The evaluation (harness/, benchmarks/) runs from the repository, never from a user's site-packages."""
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/", 1)[0] for name in archive.namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"hvd_gradpart"}
