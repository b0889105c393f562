"""The machine this process runs on, as a run records it and a benchmark prints it.

A run's bits depend on it: XLA:CPU compiles for the host's instruction set, and the number of cores
a run may use changes how a matmul splits its sums (the same 16 rounds end at a different train loss
on 1 core than on 2; benchmarks/README.md). So each start of a run writes one line of `describe()`
to its workdir (run_files.record_host), and every benchmark's JSON carries it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform

import jax


def cpu_model() -> str | None:
  """/proc/cpuinfo's 'model name' (Linux x86), else what `platform` knows."""
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or None


def usable_cores() -> int:
  """The cores this process may run on (its affinity mask where the OS has one)."""
  if hasattr(os, 'sched_getaffinity'):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def describe() -> dict:
  """The accelerator, the JAX build, the CPU and how busy the machine was when asked."""
  device = jax.devices()[0]
  description = {
      'platform': device.platform, 'device_kind': device.device_kind,
      'device_count': jax.device_count(), 'process_count': jax.process_count(),
      'jax_version': jax.__version__, 'jaxlib_version': _version('jaxlib'),
      'host_cpus': os.cpu_count(), 'usable_cores': usable_cores(), 'machine': platform.machine(),
      'cpu_model': cpu_model(), 'xla_flags': os.environ.get('XLA_FLAGS') or None}
  if hasattr(os, 'getloadavg'):
    description['load_1min'] = round(os.getloadavg()[0], 2)
  return description
