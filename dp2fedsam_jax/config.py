"""The experiment config: defaults and validation.

Every field is checked before any data is loaded or anything is compiled, and a bad value fails with
a message that names the field (as it is spelt on the command line) and says what would fix it.
`base_config()` holds every field; `choices()` reads each choice field's values from the module that
implements it, inside the function, so importing config.py loads no JAX.
"""

from __future__ import annotations

import math
import os

import ml_collections
from ml_collections import config_dict

from dp2fedsam_jax import protocol
from dp2fedsam_jax import registries
from dp2fedsam_jax.errors import ConfigError  # pylint: disable=unused-import  (raised here; public)


def base_config() -> ml_collections.ConfigDict:
  """All fields with neutral defaults; `experiments/configs/*.py` override what they need.

  It also holds the knob of every registered method's pieces (registries.KNOBS) at its piece's
  default: a user's file that registers a method before it calls base_config() gets its knob.
  """
  c = ml_collections.ConfigDict()
  c.method = 'dp2fedsam'
  c.dataset = 'fashion_mnist'
  c.data_dir = config_dict.placeholder(str)  # None: the dataset's default location.
  c.model = 'emnist_cnn'
  c.conv_impl = 'auto'
  c.num_clients = 100
  c.partition = 'pathological'
  c.classes_per_client = 2
  c.dirichlet_alpha = 0.5
  c.sampling_rate = 0.1
  c.num_rounds = 10
  c.eval_every = 1
  # Evaluate only from this round on (and always at the last): the rounds before train and
  # checkpoint untested, so a metric that reads the last evaluations pays for no earlier ones.
  c.eval_from = 0
  # Rounds between checkpoints, besides those of every evaluation and of the round a stop reaches.
  c.checkpoint_every = 1
  # Clients the evaluation tests: None = all; k = a fixed sample of k drawn once from seed
  # (evaluation.eval_client_ids), for populations too large to test whole at every evaluation.
  c.eval_clients = config_dict.placeholder(int)
  # The share of each client's training rows set aside as its validation split (0: none; the
  # evaluation then also reports validation_* metrics; data.federated.split_validation).
  c.validation_fraction = 0.0
  c.server_lr = 1.0
  # The step on the released average (server_optimizer.py; post-processing): 'sgd' | 'momentum' |
  # 'adam' | 'yogi' | 'adagrad', with Reddi et al.'s defaults.
  c.server_optimizer = 'sgd'
  c.server_momentum = 0.9
  c.server_beta1 = 0.9
  c.server_beta2 = 0.99
  c.server_eps = 1e-3
  # 'auto' (sequential on CPU, vmap on GPU/TPU; executors.resolve_name) | 'vmap' | 'sequential' |
  # 'sharded' (cohort split over jax.devices(); on a CPU one device per core unless
  # JAX_NUM_CPU_DEVICES says otherwise).
  c.executor = 'auto'
  c.chunk_size = config_dict.placeholder(int)  # clients vmapped at once; None: the whole cohort.
  # client slots per chunk; None: mean + 1 std (Poisson), m (fixed).
  c.cohort_capacity = config_dict.placeholder(int)
  c.seed = 0
  # The keys' root when set (cohorts, noise, init, local shuffles); the data split stays on `seed`.
  # A tuner sets it per trial from its secret, so trials share neither cohorts nor noise.
  c.training_seed = config_dict.placeholder(int)
  # True: the run writes only what is a function of the released models and public constants
  # (round, epsilon, clip_norm): train_metrics.jsonl, metrics.jsonl, TensorBoard and the console
  # leave out every metric that voids epsilon for whoever reads it (docs/privacy.md section 4).
  c.private_metrics_only = False
  # Method pieces (used only by the methods that have them; see algorithms/specs.py).
  c.keep_fraction = 0.4  # p: fraction of coordinates kept by top-k / rand-k
  c.blur_lambda = 1.0   # BLUR penalty weight (dp_fedavg_blur[s])
  c.pmtl_lambda = 0.1   # proximal weight of private multi-task learning (pmtl_ft)
  c.dsu = ml_collections.ConfigDict()
  c.dsu.keep_fraction = 0.05  # fraction of weights kept in each masked layer (dp-pfeddsu.txt: S)
  c.dsu.masked_layers = 4   # the last k kernel layers of the extractor are masked
  c.dsu.lam = 0.2           # adaptive-norm penalty weight (lambda)
  # A msgpack file of {'extractor', 'head'} params (models.save_params): the extractor is restored,
  # the head kept only if its shape fits, else freshly initialised. None: random init.
  c.init_checkpoint = config_dict.placeholder(str)

  c.local = _local_defaults()
  c.dp = _dp_defaults()
  c.eval = _eval_defaults()
  _add_knobs(c)
  return c


def _add_knobs(c: ml_collections.ConfigDict) -> None:
  """Each registered knob (registries.KNOBS) at its dotted path, with its piece's default."""
  for path, declared in registries.KNOBS.items():
    *parents, leaf = path.split('.')
    node = c
    for part in parents:
      if part not in node:
        node[part] = ml_collections.ConfigDict()
      node = node[part]
    if leaf not in node:
      node[leaf] = declared.default


def _local_defaults() -> ml_collections.ConfigDict:
  """config.local: each client's local training."""
  block = ml_collections.ConfigDict()
  block.personal_epochs = 2
  block.shared_epochs = 2
  block.batch_size = 10
  block.lr_personal = 0.005
  block.lr_shared = 0.05  # 0.1 with momentum 0.7 diverges from a random init (configs/default.py)
  block.momentum = 0.5
  block.lr_decay = 0.99
  block.sam_rho = 0.1
  block.finetune_epochs = 1  # -FT / -fb evaluation: local epochs on a copy before testing
  # Examples a client trains on per round; None = all (the largest client sets the buffer). A client
  # with more trains on a fresh random subset of this many each round (TFF's shuffle + take).
  block.max_examples = config_dict.placeholder(int)
  # How that subset is drawn: 'argsort' (sorts a uniform per example, O(largest client)) | 'floyd'
  # (Floyd's algorithm + a shuffle, O(max_examples)); the same distribution, other random numbers.
  block.subset_draw = 'argsort'
  return block


def _dp_defaults() -> ml_collections.ConfigDict:
  """config.dp: clipping, noise, sampling and accounting."""
  block = ml_collections.ConfigDict()
  block.clip_norm = 0.1
  block.noise_multiplier = config_dict.placeholder(float)
  block.target_epsilon = config_dict.placeholder(float)
  block.delta = config_dict.placeholder(float)  # None: 1 / num_clients.
  block.sampling = 'poisson'
  # How a Poisson cohort is drawn: 'per_client' (a uniform per client, O(N)) | 'gaps' (geometric gaps
  # between sampled ids, O(cohort)); the same distribution and epsilon, other random numbers.
  block.poisson_draw = 'per_client'
  block.noise_placement = 'central'
  block.accountant = 'pld'
  # Noise across rounds (privacy/correlated.py, docs/privacy.md section 7): 'independent' | 'banded'
  # (BandMF, num_bands bands, Poisson within one of num_bands client groups per round) | 'tree'
  # (DP-FTRL tree aggregation, each client once per epoch).
  block.noise_mechanism = 'independent'
  block.num_bands = 4  # b of 'banded' (sampling_rate * num_bands <= 1; 1 is independent noise)
  # The clip norm across rounds (privacy/clip_rules.py, docs/privacy.md section 8): 'fixed' (clip_norm
  # every round) | 'adaptive' (Andrew et al. 2021: C moves towards the target_quantile of the update
  # norms, from a noised count of unclipped clients; independent noise, central placement).
  block.clipping = 'fixed'
  block.target_quantile = 0.5  # gamma: the fraction of clients left unclipped
  block.clip_lr = 0.2          # eta: C <- C exp(-eta (noised unclipped fraction - gamma))
  block.initial_clip_norm = config_dict.placeholder(float)  # C_0; None: clip_norm
  # s_b, the noise std on the count of unclipped clients; None: the expected cohort / 20.
  block.count_noise_multiplier = config_dict.placeholder(float)
  return block


def _eval_defaults() -> ml_collections.ConfigDict:
  """config.eval: the test-time protocol."""
  block = ml_collections.ConfigDict()
  # The test-time protocol (protocol.py, its fields and defaults; docs/evaluation.md): before
  # testing, each client adapts its model; the defaults are each method's own evaluation.
  for field, default in protocol.DEFAULTS.items():  # a None default (adapt_lr): a float to set
    block[field] = config_dict.placeholder(float) if default is None else default
  return block


def choices() -> dict[str, tuple[str, ...]]:
  """The allowed values of every choice field, as the modules that implement them define them.

  Imported here, not at module level: importing config.py stays cheap (no JAX) for the config files
  and the sweep launcher (tests/test_layers.py checks it).
  """
  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax import executors
  from dp2fedsam_jax import server_optimizer
  from dp2fedsam_jax.algorithms import specs
  from dp2fedsam_jax.data.federated import SUBSET_DRAWS
  from dp2fedsam_jax.data.partition import PARTITIONS  # (data.partition is a function)
  from dp2fedsam_jax.models import layers, registry
  from dp2fedsam_jax.privacy import accounting, clip_rules, noise, noise_mechanisms, sampling
  return {
      'method': tuple(specs.METHODS.names()),
      'model': tuple(registry.model_names()),
      'conv_impl': layers.CONV_IMPLS,
      'partition': tuple(PARTITIONS.names()),
      'executor': executors.NAMES,
      'server_optimizer': server_optimizer.SERVER_OPTIMIZERS,
      'dp.sampling': sampling.SAMPLINGS,
      'dp.poisson_draw': sampling.POISSON_DRAWS,
      'local.subset_draw': SUBSET_DRAWS,
      'dp.noise_placement': noise.NOISE_PLACEMENTS,
      'dp.accountant': accounting.ACCOUNTANTS,
      'dp.noise_mechanism': tuple(noise_mechanisms.NOISE_MECHANISMS),
      'dp.clipping': tuple(clip_rules.CLIP_RULES),
      'eval.adapt_part': protocol.ADAPT_PARTS,
      'eval.head_init': protocol.HEAD_INITS,
  }


def field_help() -> dict[str, str]:
  """config_help.FIELD_HELP with the registered names of method, model, dataset and partition
  appended (those a user's file registered included), and each registered knob's help line."""
  from dp2fedsam_jax import config_help  # pylint: disable=import-outside-toplevel
  lines = dict(config_help.FIELD_HELP)
  allowed = choices()
  for field in ('method', 'model', 'dataset', 'partition'):
    names = allowed[field] if field != 'dataset' else _dataset_names()
    lines[field] = f'{lines[field]}: {" | ".join(names)}'
  for path, declared in registries.KNOBS.items():
    bounds = declared.knob.range_text()
    lines[path] = '; '.join(part for part in (declared.knob.help or declared.owner,
                                              bounds and f'in {bounds}') if part)
  return lines


def evaluates_at(done: int, num_rounds: int, eval_every: int, eval_from: int = 0) -> bool:
  """Whether a run evaluates after round `done` (1-based): every eval_every rounds from eval_from
  on (the config's fields), and always at the last."""
  return done == num_rounds or (done % eval_every == 0 and done >= eval_from)


def _dataset_names() -> list[str]:
  from dp2fedsam_jax.data import sources  # pylint: disable=import-outside-toplevel
  return sources.dataset_names()


def _fail(field: str, value, why: str) -> None:
  raise ConfigError(f'config.{field}={value!r}: {why}')


def _choice(config, field: str, choices) -> None:
  value = _get(config, field)
  if value not in choices:
    _fail(field, value, f'unknown; {registries.did_you_mean(value, choices)}choose one of {list(choices)}.')


def _get(config, field: str):
  node = config
  for part in field.split('.'):
    node = node[part]
  return node


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive(config, field: str, *, integer: bool = False, allow_zero: bool = False) -> None:
  value = _get(config, field)
  bad_type = not _is_number(value)
  if integer and not bad_type:
    bad_type = not float(value).is_integer()
  if bad_type or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
    kind = 'an integer' if integer else 'a number'
    bound = '>= 0' if allow_zero else '> 0'
    _fail(field, value, f'must be {kind} {bound}.')


def _check_model_fits_dataset(model: str, dataset: str, token_datasets) -> None:
  """Token models for token datasets, image models for image datasets: one line naming the models
  that fit, before any data is loaded."""
  from dp2fedsam_jax.models import registry  # pylint: disable=import-outside-toplevel
  if model not in registry.model_names():
    return  # named by the choice check below
  tokens = dataset in token_datasets
  if registry.is_token_model(model) == tokens:
    return
  fitting = [m for m in registry.model_names() if registry.is_token_model(m) == tokens]
  kind = 'a token dataset (sequences of ids)' if tokens else 'an image dataset'
  _fail('model', model, f'config.dataset={dataset!r} is {kind}; choose a model that fits it: '
        f'{", ".join(fitting)}.')


def validate_config(config: ml_collections.ConfigDict, methods=None) -> None:
  """Raises ConfigError naming the first invalid field.

  `methods`: the method names to accept (default: every registered method).
  """
  _check_names(config, methods)
  _check_run_numbers(config)
  _check_init_checkpoint(config)
  _check_clients_and_pieces(config)
  _check_knobs(config)
  _check_privacy(config)


def _check_knobs(config) -> None:
  """The knobs registered methods' pieces declare (registries.Knob): each one the config holds,
  and every one of the chosen method's, within its range; a method with its own server step leaves
  config.server_optimizer at sgd."""
  from dp2fedsam_jax.algorithms import specs  # pylint: disable=import-outside-toplevel
  method = specs.METHODS.get(config.method)
  needed = {knob.path for knob, _, _ in method.knobs()} if method is not None else set()
  for path, declared in registries.KNOBS.items():
    try:
      value = _get(config, path)
    except KeyError:
      if path in needed:
        _fail(path, None, f'missing: {declared.owner} reads it; build the config with '
              'config.base_config() after the method is registered (its default is '
              f'{declared.default!r}).')
      continue
    problem = declared.knob.problem(value, declared.default)
    if problem:
      _fail(path, value, f'{problem} ({declared.owner}); e.g. --config.{path}={declared.default!r}.')
  if method is not None and method.server_step is not None and config.server_optimizer != 'sgd':
    _fail('server_optimizer', config.server_optimizer, f'method {config.method} brings its own server '
          f'step ({method.server_step.name}); leave config.server_optimizer=sgd for it.')


def _check_names(config, methods) -> None:
  """The method, the dataset and every field with a list of choices."""
  from dp2fedsam_jax import config_help  # pylint: disable=import-outside-toplevel
  for old in config_help.RENAMED_FIELDS:  # e.g. a config file that still sets local.lr_body
    parent, _, leaf = old.rpartition('.')
    node = config[parent] if parent else config
    if leaf in node:
      raise ConfigError(config_help.renamed_field_message(old))
  allowed = choices()
  methods = allowed['method'] if methods is None else methods
  # Imported here: importing config.py must stay cheap and free of cycles.
  from dp2fedsam_jax.algorithms import specs  # pylint: disable=import-outside-toplevel
  from dp2fedsam_jax.data import sources  # pylint: disable=import-outside-toplevel
  if config.method not in methods:
    raise ConfigError(specs.METHODS.unknown_message(config.method, sorted(methods)))
  dataset = config.dataset
  if not (dataset in sources.dataset_names()
          or (isinstance(dataset, str) and dataset.startswith('tfds:') and len(dataset) > 5)):
    raise ConfigError(sources.DATASETS.unknown_message(dataset, sources.dataset_names()))
  _check_model_fits_dataset(config.model, dataset, sources.TOKEN_DATASETS)
  data_dir = config.get('data_dir')
  if data_dir is not None and not isinstance(data_dir, str):
    _fail('data_dir', data_dir, "a directory path, or unset for the dataset's default location.")
  for field in ('model', 'partition', 'conv_impl', 'executor', 'server_optimizer', 'dp.sampling',
                'dp.noise_placement', 'dp.accountant', 'dp.noise_mechanism', 'dp.poisson_draw',
                'dp.clipping', 'local.subset_draw'):
    _choice(config, field, allowed[field])


def _check_run_numbers(config) -> None:
  """The run's sizes, rounds, server optimizer and seed."""
  _positive(config, 'num_clients', integer=True)
  _positive(config, 'classes_per_client', integer=True)
  _positive(config, 'dirichlet_alpha')
  _positive(config, 'num_rounds', integer=True, allow_zero=True)
  _positive(config, 'eval_every', integer=True)
  _positive(config, 'eval_from', integer=True, allow_zero=True)
  _positive(config, 'checkpoint_every', integer=True)
  _positive(config, 'server_lr')
  for field in ('server_momentum', 'server_beta1', 'server_beta2'):
    value = _get(config, field)
    if not _is_number(value) or not 0.0 <= value < 1.0:
      _fail(field, value, 'a decay rate of the server optimizer must lie in [0, 1).')
  _positive(config, 'server_eps')
  for field in ('seed', 'training_seed'):
    value = _get(config, field)
    if value is not None or field == 'seed':
      _positive(config, field, integer=True, allow_zero=True)
      if value >= 2**64:
        _fail(field, value, 'must be below 2**64 (a 64-bit key seed).')
  for field in ('chunk_size', 'cohort_capacity', 'eval_clients', 'local.max_examples'):
    if _get(config, field) is not None:
      _positive(config, field, integer=True)


def _check_init_checkpoint(config) -> None:
  """config.init_checkpoint: a file, and never for a method reported at epsilon 0."""
  path = config.get('init_checkpoint')
  from dp2fedsam_jax.algorithms import specs  # pylint: disable=import-outside-toplevel
  method = specs.METHODS.get(config.method)
  if path is not None and method is not None and not method.federated:
    # Its row is reported at epsilon 0: a start from a file (a federated model, trained on the
    # other clients) would make that false.
    _fail('init_checkpoint', path, f'method {config.method} trains every client alone from a random '
          'init and is reported at epsilon 0, which a start from a file (e.g. a federated model) '
          'would void; leave config.init_checkpoint unset (None) for it.')
  if path is not None and not (isinstance(path, str) and os.path.isfile(path)):
    _fail('init_checkpoint', path, 'no such file; write one with '
          'dp2fedsam_jax.models.save_params(path, params), or leave it unset for a random init.')


def _check_clients_and_pieces(config) -> None:
  """The validation share, q, the method pieces' numbers and config.local."""
  value = config.get('validation_fraction', 0.0)
  if not _is_number(value) or not 0.0 <= value < 1.0:
    _fail('validation_fraction', value, "the share of each client's training rows kept for "
          'validation must lie in [0, 1) (0: no validation split).')

  q = config.sampling_rate
  if not _is_number(q) or not 0.0 < q <= 1.0:
    _fail('sampling_rate', q, 'the client sampling rate q must lie in (0, 1].')

  for field in ('keep_fraction', 'dsu.keep_fraction'):
    value = _get(config, field)
    if not _is_number(value) or not 0.0 < value <= 1.0:
      _fail(field, value, 'the fraction of coordinates kept must lie in (0, 1].')
  for field in ('blur_lambda', 'pmtl_lambda', 'dsu.lam'):
    _positive(config, field, allow_zero=True)
  _positive(config, 'dsu.masked_layers', integer=True, allow_zero=True)

  for field in ('local.personal_epochs', 'local.shared_epochs', 'local.finetune_epochs'):
    _positive(config, field, integer=True, allow_zero=True)
  _positive(config, 'local.batch_size', integer=True)
  for field in ('local.lr_personal', 'local.lr_shared', 'local.lr_decay'):
    _positive(config, field, allow_zero=field != 'local.lr_decay')
  _positive(config, 'local.sam_rho', allow_zero=True)
  m = config.local.momentum
  if not _is_number(m) or not 0.0 <= m < 1.0:
    _fail('local.momentum', m, 'momentum must lie in [0, 1).')


def _check_privacy(config) -> None:
  """private_metrics_only and config.dp, then what the noise mechanism, the clip rule and the
  test-time protocol need of the other fields."""
  from dp2fedsam_jax.algorithms import specs  # pylint: disable=import-outside-toplevel
  only = config.get('private_metrics_only', False)
  if not isinstance(only, bool):
    _fail('private_metrics_only', only, 'True or False.')
  if only and config.method in specs.METHODS and not specs.METHODS[config.method].private:
    _fail('private_metrics_only', only, f'method {config.method} is not private (epsilon = inf), so '
          'no metric of it keeps an epsilon; leave it False or choose a private method.')

  _positive(config, 'dp.clip_norm')
  sigma, eps = config.dp.noise_multiplier, config.dp.target_epsilon
  if sigma is not None:
    if not _is_number(sigma) or not math.isfinite(sigma) or sigma < 0:
      _fail('dp.noise_multiplier', sigma, 'the noise multiplier sigma must be a number >= 0.')
  if eps is not None:
    _positive(config, 'dp.target_epsilon')
  delta = config.dp.delta
  if delta is not None and not (_is_number(delta) and 0.0 < delta < 1.0):
    _fail('dp.delta', delta, 'delta must lie in (0, 1); leave it unset for 1/num_clients.')
  if config.dp.sampling == 'fixed' and config.dp.accountant != 'rdp':
    _fail('dp.accountant', config.dp.accountant,
          "fixed-size sampling (dp.sampling='fixed') is accounted with RDP: set --config.dp.accountant=rdp.")
  _positive(config, 'dp.num_bands', integer=True)
  # What dp.noise_mechanism needs of the other fields: written once, in the mechanism's class.
  from dp2fedsam_jax.privacy import noise_mechanisms  # pylint: disable=import-outside-toplevel
  noise_mechanisms.check_config(config)
  # Adaptive clipping's fields, and what it needs of the others (privacy/clip_rules.py).
  from dp2fedsam_jax.privacy import clip_rules  # pylint: disable=import-outside-toplevel
  clip_rules.check_config(config)
  # The test-time protocol's fields, and what it needs of the method (adaptation.py).
  from dp2fedsam_jax import adaptation  # pylint: disable=import-outside-toplevel
  adaptation.check_config(config, specs.METHODS.get(config.method))
