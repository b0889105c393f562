"""The persistent compilation cache (dp2fedsam_jax/compilation_cache.py): where it
is, how it is turned off, and two processes sharing one: entries appear whole (written to a temporary
file and renamed), nobody reads a torn one, and a later process loads them instead of compiling."""

import os
import subprocess
import sys
import textwrap

from dp2fedsam_jax import compilation_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_where_the_cache_is_and_how_it_is_turned_off(monkeypatch, tmp_path):
  for name in (compilation_cache.ENV, 'JAX_COMPILATION_CACHE_DIR'):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
  assert compilation_cache.resolve() == str(tmp_path / 'xdg' / 'dp2fedsam_jax' / 'jax_cache')
  monkeypatch.delenv('XDG_CACHE_HOME')
  assert compilation_cache.resolve() == os.path.expanduser('~/.cache/dp2fedsam_jax/jax_cache')
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', str(tmp_path / 'jax'))  # a sweep's shared one
  assert compilation_cache.resolve() == str(tmp_path / 'jax')
  monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / 'env'))
  assert compilation_cache.resolve() == str(tmp_path / 'env')
  assert compilation_cache.resolve(str(tmp_path / 'flag')) == str(tmp_path / 'flag')
  assert compilation_cache.resolve('off') is None
  monkeypatch.setenv(compilation_cache.ENV, 'off')
  assert compilation_cache.resolve() is None


_COMPILE = textwrap.dedent('''
    import sys, warnings
    from dp2fedsam_jax import compilation_cache
    compilation_cache.enable(sys.argv[1])
    import jax, jax.numpy as jnp
    from jax._src import monitoring
    hits = []
    monitoring.register_event_listener(
        lambda event, **kw: hits.append(event) if event.endswith('cache_hits') else None)
    warnings.simplefilter('error')  # "Error reading persistent compilation cache entry" fails
    for width in range(8, 40, 4):
      f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(0) + jnp.cumsum(x, 0)[-1])
      f(jnp.ones((width, width))).block_until_ready()
    print(len(hits))
''')


def test_two_processes_share_one_cache_and_a_third_compiles_nothing(tmp_path):
  script = tmp_path / 'compile.py'
  script.write_text(_COMPILE)
  cache = tmp_path / 'cache'
  env = {**os.environ, 'PYTHONPATH': ROOT}

  def start():
    return subprocess.Popen([sys.executable, str(script), str(cache)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  both = [start(), start()]  # at once, on the same (empty) directory
  for process in both:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err[-3000:]
  entries = os.listdir(cache)
  assert len([n for n in entries if n.endswith('-cache')]) >= 8
  assert not [n for n in entries if n.endswith('.tmp')]  # every entry was renamed into place
  third = start()
  out, err = third.communicate(timeout=300)
  assert third.returncode == 0, err[-3000:]
  assert int(out.strip()) >= 8  # every program of the loop came from the cache


_TRAIN = textwrap.dedent('''
    import logging, sys
    sys.path.insert(0, 'tests')
    from conftest import tiny_config
    from dp2fedsam_jax import compilation_cache, train
    compilation_cache.enable(sys.argv[1])
    misses = []

    class Misses(logging.Handler):
      def emit(self, record):
        if 'PERSISTENT COMPILATION CACHE MISS' in record.getMessage():
          misses.append(record.args[0])
    logger = logging.getLogger('jax._src.compiler')
    logger.setLevel(logging.DEBUG)
    logger.addHandler(Misses())
    final = train.train_and_evaluate(tiny_config(num_rounds=int(sys.argv[3])), sys.argv[2])
    print(final['round'], ' '.join(misses))
''')


def test_a_resumed_run_loads_its_round_step_and_evaluation_from_the_cache(tmp_path):
  """A run resumed from a checkpoint compiles the same programs as a fresh one (its restored state
  placed as the fresh state is), so the cache the first run filled serves them."""
  script = tmp_path / 'train.py'
  script.write_text(_TRAIN)

  def run(rounds: int) -> tuple[int, list[str]]:
    out = subprocess.run([sys.executable, str(script), str(tmp_path / 'cache'), str(tmp_path / 'run'),
                          str(rounds)], cwd=ROOT, env={**os.environ, 'PYTHONPATH': ROOT},
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    done, *misses = out.stdout.split()
    return int(done), misses

  done, fresh_misses = run(1)
  assert done == 1 and any('round_step' in m for m in fresh_misses)  # the first run compiles it
  done, resumed_misses = run(2)  # resumes from round 1's checkpoint
  assert done == 2
  assert not [m for m in resumed_misses if 'round_step' in m or 'evaluate' in m], resumed_misses
