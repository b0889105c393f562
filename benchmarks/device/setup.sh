# Sourced first in every command on a lent GPU machine, from the repository root:
#
#   source benchmarks/device/setup.sh || exit 1
#
# installs the carried wheels (.whl/, benchmarks/device/payload.sh) into /tmp/site and puts it first on
# PYTHONPATH; unpacks the carried Fashion-MNIST (.device_data/fashion-mnist/*.xz) into
# /usr/share/datasets/fashion-mnist, where the project looks by default, unless it is there; prints
# the GPU and what JAX sees. The machine has no network: what is not carried is not there.
if compgen -G '.whl/*.whl' > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || return 1
  export PYTHONPATH="/tmp/site:$PWD"
fi
if compgen -G '.device_data/fashion-mnist/*.xz' > /dev/null; then
  FASHION_MNIST_DIR=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
  mkdir -p "$FASHION_MNIST_DIR" || return 1
  for packed in .device_data/fashion-mnist/*.xz; do
    name=$(basename "$packed" .xz)  # the loader takes an IDX file without its .gz too
    [ -e "$FASHION_MNIST_DIR/$name" ] || [ -e "$FASHION_MNIST_DIR/$name.gz" ] ||
        xz -dc "$packed" > "$FASHION_MNIST_DIR/$name" || return 1
  done
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
python3 -c 'import jax; print("jax", jax.__version__, jax.devices())' || return 1
