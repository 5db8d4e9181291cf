#!/usr/bin/env bash
# Installs everything hvd_gradpart needs on a fresh Debian machine (run as root).
# Idempotent: each step checks before it acts, so a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
DEBS=(libopenmpi-dev openmpi-bin g++ openssh-server openssh-client iproute2)

missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; assert (3, 9) <= sys.version_info[:2] <= (3, 11), sys.version' \
  || { echo "setup: TensorFlow 2.15 needs Python 3.9-3.11; set PYTHON=python3.11" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

"${PIP[@]}" install -c constraints.txt wheel setuptools 'cmake<4' tensorflow-cpu 'numpy<2'
if ! "$VENV/bin/python" -c 'import horovod.tensorflow' 2>/dev/null; then
  echo "setup: building Horovod with TensorFlow, MPI and Gloo (a few minutes the first time)"
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 PATH="$PWD/$VENV/bin:$PATH" \
    "${PIP[@]}" install -c constraints.txt --no-build-isolation horovod
fi
"${PIP[@]}" install -c constraints.txt -e '.[test]'
# The evaluation (harness/, benchmarks/) is not installed with the library: one line in a .pth
# file puts this repository on the venv's sys.path, so `import harness` and `python -m benchmarks.X`
# work from any folder, in scripts run as `python scripts/train.py` and in ranks started over ssh.
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD" >"$site/hvd_gradpart-evaluation.pth"

build=$("$VENV/bin/horovodrun" --check-build)
for want in "TensorFlow" "MPI" "Gloo"; do
  echo "$build" | grep -q "\[X\] $want" || { echo "$build"; echo "setup: Horovod lacks $want" >&2; exit 1; }
done
echo "setup: done ($("$VENV/bin/python" -c 'import tensorflow as tf, horovod; print("TF", tf.__version__, "Horovod", horovod.__version__)'))"
