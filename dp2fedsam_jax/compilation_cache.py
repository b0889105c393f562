"""JAX's persistent compilation cache, on by default for the binaries: a restarted run loads its
compiled round step and evaluation from disk instead of compiling them again.

Where (`resolve`): `--compilation_cache=DIR` of experiments/train.py, else the environment variable
DP2FEDSAM_COMPILATION_CACHE, else JAX's own JAX_COMPILATION_CACHE_DIR (launch/sweep.py sets it for its
runs), else `$XDG_CACHE_HOME/dp2fedsam_jax/jax_cache` (`~/.cache/...`). The value `off` turns it off.

Two processes may share one cache: JAX names an entry by a hash of the program, its compile options
and the backend, and never overwrites an entry; here each entry is also written to a temporary file
and renamed into place (`_AtomicFileCache`), so a process killed while writing one leaves no torn
entry for the next start to stumble on (JAX's own write is a plain write_bytes).
"""

from __future__ import annotations

import os

import jax
from absl import logging

ENV = 'DP2FEDSAM_COMPILATION_CACHE'
OFF = ('off', 'none', '0', 'false', '')


def default_dir() -> str:
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'dp2fedsam_jax', 'jax_cache')


def resolve(setting: str | None = None) -> str | None:
  """The cache directory for a flag value (None: not given), or None when the cache is off."""
  for value in (setting, os.environ.get(ENV), os.environ.get('JAX_COMPILATION_CACHE_DIR')):
    if value is not None:
      return None if value.strip().lower() in OFF else os.path.abspath(os.path.expanduser(value))
  return default_dir()


def _atomic_file_cache_factory():
  """A get_file_cache for jax._src.compilation_cache whose entries appear whole or not at all; None
  where this JAX's internals differ from the ones it was written against (JAX's own cache is used)."""
  try:
    from jax._src import compilation_cache as cc  # pylint: disable=import-outside-toplevel
    from jax._src import lru_cache  # pylint: disable=import-outside-toplevel
    suffix = lru_cache._CACHE_SUFFIX  # pylint: disable=protected-access
    base = lru_cache.LRUCache
    if not callable(getattr(cc, 'get_file_cache', None)):
      return None
  except (ImportError, AttributeError):
    return None

  class _AtomicFileCache(base):
    """JAX's file cache, with each new entry written to a temporary file and renamed into place."""

    def put(self, key: str, value: bytes) -> None:
      if self.eviction_enabled or not key:
        return super().put(key, value)
      path = self.path / f'{key}{suffix}'
      if path.exists():
        return
      tmp = self.path / f'.{key}{suffix}.{os.getpid()}.tmp'
      tmp.write_bytes(value)
      os.replace(str(tmp), str(path))

  def get_file_cache(path: str):
    max_size = jax.config.jax_compilation_cache_max_size
    if max_size != -1 or jax.config.jax_compilation_cache_check_contents:
      return original(path)
    return _AtomicFileCache(path, max_size=-1), path

  original = cc.get_file_cache
  return cc, get_file_cache


def enable(setting: str | None = None) -> str | None:
  """Turns the persistent cache on at resolve(setting) for this process; returns the directory (None:
  off). Call it before the first compilation."""
  directory = resolve(setting)
  if directory is None:
    return None
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError as e:
    logging.warning('No persistent compilation cache: cannot create %s (%s); set %s=off or '
                    '--compilation_cache=DIR.', directory, e.strerror, ENV)
    return None
  found = _atomic_file_cache_factory()
  if found is not None:
    cc, get_file_cache = found
    if not getattr(cc.get_file_cache, 'atomic_writes', False):  # once per process
      get_file_cache.atomic_writes = True
      cc.get_file_cache = get_file_cache
    cc.reset_cache()  # a cache initialised before (e.g. at another directory) is replaced
  jax.config.update('jax_compilation_cache_dir', directory)
  # Every program (the small ones of start-up too): reading an entry costs milliseconds.
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  return directory
