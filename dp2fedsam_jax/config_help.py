"""One line of help per config field, and `--print_config`: the resolved config with that help.

`tests/test_cli.py` checks that every field of `config.base_config()` has a line here, so a new
field cannot appear without one. The fields that name a registered entry (method, model, dataset,
partition) say so here; config.field_help() adds the names registered at the time, and the help of
the knobs registered methods declare. `RENAMED_FIELDS` maps old field names to new ones: an old name
fails in one line naming the new one, and a committed config.json holding old names is read under
the new ones.
"""

from __future__ import annotations

FIELD_HELP = {
    'method': 'the algorithm, a registered method (--list)',
    'dataset': "a registered dataset (--list), or 'tfds:<name>' (TFDS ones need the [tfds] extra)",
    'data_dir': "where the dataset's files are; None: its default location",
    'model': 'a registered model (--list); token models for token datasets',
    'conv_impl': "convolution lowering: auto (models.AUTO_CONV_IMPL: im2col on CPU, xla elsewhere) | "
                 "xla | im2col",
    'num_clients': 'N, clients in the federation',
    'partition': 'how the examples are split over clients, a registered partition (--list; '
                 'pathological reads classes_per_client, dirichlet dirichlet_alpha)',
    'classes_per_client': 'S of the pathological partition',
    'dirichlet_alpha': 'alpha of the dirichlet partition (smaller: more heterogeneous)',
    'sampling_rate': 'q, the probability (Poisson) or fraction (fixed) of clients sampled per round',
    'num_rounds': 'communication rounds T (may change when resuming)',
    'eval_every': 'evaluate, log and checkpoint every this many rounds (may change when resuming)',
    'eval_from': 'evaluate only at rounds >= this (every eval_every, and always the last); the '
                 'rounds before still checkpoint every eval_every (may change when resuming)',
    'checkpoint_every': 'also checkpoint every this many rounds (a stop checkpoints the round it '
                        'reached; a kill loses the rounds since; may change when resuming)',
    'eval_clients': 'clients tested at each evaluation: None = all; k = a fixed sample of k drawn '
                    'once from seed',
    'validation_fraction': "share of each client's training rows set aside as its validation "
                           'split, seeded (0: none); the run then writes validation_* metrics',
    'server_lr': 'server step size (sgd: phi <- phi + server_lr * mean of the uploads)',
    'server_optimizer': 'the step on the noised mean, its negation the pseudo-gradient (post-processing): '
                        'sgd | momentum (heavy ball: steady step server_lr/(1-server_momentum)) | adam | '
                        'yogi | adagrad (Reddi et al. 2021; adaptive ones want server_lr ~0.01-0.1)',
    'server_momentum': 'beta of server_optimizer=momentum, in [0, 1)',
    'server_beta1': 'first-moment decay of server_optimizer=adam | yogi, in [0, 1)',
    'server_beta2': 'second-moment decay of server_optimizer=adam | yogi, in [0, 1)',
    'server_eps': 'adaptivity tau of adam | yogi | adagrad (> 0): the floor of the step denominator',
    'executor': 'how the cohort is mapped: auto (sequential on CPU, vmap on GPU/TPU; config.json '
                'records the choice) | vmap | sequential | sharded (over all devices)',
    'chunk_size': 'clients trained at once (bounds memory); None: the whole cohort',
    'cohort_capacity': 'client slots per chunk; None: mean + 1 std of the cohort (Poisson), m (fixed)',
    'seed': 'the data split, and the root of every random key unless training_seed is set',
    'training_seed': 'None, or the root of the keys (init, sampling, noise) apart from the data '
                     'split: a tuner sets it per trial from its secret (64 bits)',
    'private_metrics_only': 'True: write only round, epsilon and clip_norm (functions of the '
                            'release); every other metric is computed from raw client data and '
                            'voids epsilon for whoever reads it (docs/privacy.md section 4)',
    'keep_fraction': 'p, fraction of coordinates kept by top-k / rand-k methods',
    'blur_lambda': 'BLUR penalty weight (dp_fedavg_blur, dp_fedavg_blurs)',
    'pmtl_lambda': 'proximal weight of pmtl_ft',
    'dsu': 'DP-pFedDSU settings (dp_pfeddsu*)',
    'dsu.keep_fraction': 'fraction of weights kept in each masked layer (S)',
    'dsu.masked_layers': 'the last k kernel layers of the extractor are masked',
    'dsu.lam': 'adaptive-norm penalty weight (lambda)',
    'init_checkpoint': "msgpack of {'extractor','head'} params to start from; None: random init",
    'local': 'local training on each sampled client',
    'local.personal_epochs': 'tau_h, epochs on the personal head (extractor fixed)',
    'local.shared_epochs': 'tau_phi, epochs on the shared part (head fixed)',
    'local.batch_size': 'local minibatch size',
    'local.lr_personal': 'eta_h, learning rate of the head phase',
    'local.lr_shared': 'eta_phi, learning rate of the shared phase',
    'local.momentum': 'SGD momentum of the local steps, in [0, 1)',
    'local.lr_decay': 'local learning rates at round t are lr * lr_decay**t',
    'local.sam_rho': 'SAM / ASAM perturbation radius rho (0: plain SGD steps)',
    'local.max_examples': 'examples a client trains on per round (None: all); a larger client uses '
                          'a fresh random subset of this many each round',
    'local.subset_draw': 'how that subset is drawn: argsort (a uniform per example, sorted, O(largest '
                         "client)) | floyd (Floyd's algorithm + a shuffle, O(max_examples)); same "
                         'distribution',
    'local.finetune_epochs': 'epochs of fine-tuning before testing (-FT / -fb evaluation)',
    'dp': 'differential privacy',
    'dp.clip_norm': 'C, clip of the global L2 norm of each client update',
    'dp.noise_multiplier': 'sigma (noise std sigma*C on the sum); None: calibrated for target_epsilon',
    'dp.target_epsilon': 'epsilon after num_rounds that sigma is calibrated for (an explicit sigma wins)',
    'dp.delta': 'delta of (epsilon, delta); None: 1/num_clients',
    'dp.sampling': 'poisson (add/remove-one, PLD) | fixed (without replacement, replace-one, RDP)',
    'dp.poisson_draw': 'how independent noise draws a Poisson cohort: per_client (a uniform per client, '
                       'O(N)) | gaps (geometric gaps between sampled ids, O(cohort)); same distribution',
    'dp.noise_placement': 'central (a trusted server adds it) | distributed (each client adds its share)',
    'dp.accountant': 'pld | rdp (fixed sampling needs rdp)',
    'dp.noise_mechanism': 'independent (fresh noise each round) | banded (BandMF: noise correlated over '
                          'num_bands rounds, Poisson within one of num_bands client groups) | tree '
                          '(DP-FTRL, each client once per epoch); docs/privacy.md section 7',
    'dp.num_bands': 'b of the banded mechanism (sampling_rate * num_bands <= 1; T fixes the strategy)',
    'dp.clipping': 'fixed (clip_norm every round) | adaptive (Andrew et al. 2021: C tracks the '
                   'target_quantile of the update norms; docs/privacy.md section 8)',
    'dp.target_quantile': 'adaptive clipping: gamma in (0, 1), the fraction of clients left unclipped',
    'dp.clip_lr': 'adaptive clipping: eta >= 0, C <- C * exp(-eta * (noised unclipped fraction - gamma))',
    'dp.initial_clip_norm': 'adaptive clipping: C_0 > 0; None: clip_norm',
    'dp.count_noise_multiplier': 'adaptive clipping: s_b, noise std on the count of unclipped clients '
                                 '(None: expected cohort / 20); eps counts (sigma^-2 + (2 s_b)^-2)^-1/2',
    'eval': 'the test-time protocol: every method adapts the same budget before testing '
            '(docs/evaluation.md)',
    'eval.adapt_epochs': "epochs each client adapts its model before testing (0 with head_init "
                         "own: each method's own evaluation)",
    'eval.adapt_lr': 'learning rate of that adaptation, constant, the same for every method '
                     '(needed when adapt_epochs > 0)',
    'eval.adapt_part': "auto (personal/-fb heads re-fit the head, -FT methods the whole model, "
                       "global models nothing) | head | full",
    'eval.head_init': "the head adaptation starts from: own (the method's own) | random (the run's "
                      'initial head) | shared (the global head, methods that have one)',
    'audit': 'the empirical privacy audit (experiments.audit)',
    'audit.num_trials': 'independent runs of the audited rounds (trial 0 is the one-run audit)',
    'audit.num_canaries': 'canary clients per run, each included with probability 1/2',
    'audit.canary_norm': "a canary's raw update norm in units of C (clipped back to C)",
    'audit.alpha': '1 - confidence of every bound and interval',
    'audit.select_fraction': 'fraction of the scores used only to choose a threshold',
    'audit.batch_trials': 'trials vmapped at once (memory)',
    'audit.seed': "the audit's own keys (the experiment's come from seed)",
    'audit.estimate_every': "one run's estimates also after every this many rounds (0: at the end)",
}


def _leaves(config, prefix: str = ''):
  for key in sorted(config.keys()):
    value = config[key]
    if hasattr(value, 'keys') and callable(value.keys):
      yield from _leaves(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}', value


def describe_config(config, title: str = '', help_lines: dict[str, str] | None = None) -> str:
  """Every field as `path = value  # help`, sorted, one per line (help: `help_lines`, default
  FIELD_HELP; config.field_help() adds the registered names)."""
  help_lines = FIELD_HELP if help_lines is None else help_lines
  rows = [(f'{path} = {value!r}', help_lines.get(path, '')) for path, value in _leaves(config)]
  width = max(len(left) for left, _ in rows)
  lines = [f'# {title}'] if title else []
  lines += [f'{left:{width}s}  # {text}' if text else left for left, text in rows]
  lines.append('# Set a field with --config.<path>=<value> (None for an optional one).')
  return '\n'.join(lines)


# Fields renamed since runs were committed: old name -> new name. An old name is refused with one
# line naming the new one (config.validate_config, cli.py's --config flags); a config.json that holds
# it (experiments/results) is read under the new name (run_files.py), so the run stays the same run.
RENAMED_FIELDS = {
    'local.head_epochs': 'local.personal_epochs',
    'local.lr_head': 'local.lr_personal',
    'local.body_epochs': 'local.shared_epochs',
    'local.lr_body': 'local.lr_shared',
    'sparsity': 'keep_fraction',
    'dsu.sparsity': 'dsu.keep_fraction',
}


def renamed_field_message(old: str) -> str:
  new = RENAMED_FIELDS[old]
  return (f'config.{old} was renamed config.{new} (the shared / personal parts and the fraction '
          f'kept have one name each): set --config.{new}.')


def with_current_names(flat: dict) -> dict:
  """A flattened config ({'local.lr_body': ...}) with renamed fields under their current names."""
  return {RENAMED_FIELDS.get(k, k): v for k, v in flat.items()}
