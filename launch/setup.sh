#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian/Ubuntu machine: the offline Fashion-MNIST
# files (Debian package dataset-fashion-mnist) and this package with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq dataset-fashion-mnist
fi
python3 -m pip install -q -e '.[test]'
