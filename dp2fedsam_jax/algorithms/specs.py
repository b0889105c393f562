"""Every method as a composition of the engine's shared pieces, side by side in one table.

A method is data, not a loop: one row of small objects (algorithms/pieces.py), each holding the
behaviour it selects. One round of any method is

    client:  [head phase: SGD on the personal part, shared part fixed]
             shared phase: `shared_optimizer` on the shared part (+ `regularizer`, through `weight_mask`)
             Delta = new shared - received shared
             Delta <- Delta * upload_mask.client_mask(...)          (before clipping)
             clip Delta to global L2 norm C; [distributed] + noise (only on the mask if noise_on_mask)
             postprocess.client(noised upload)                       (e.g. its top-k)
    server:  sum; [central] + noise; postprocess.server(noised sum);
             server_step: phi += lr * sum / m (or config.server_optimizer's step, or the method's own)
    test:    evaluation: global model | own personal part | fine-tuned copy | fine-tuned head

`personal` says what stays on each client (`shared_keys` are aggregated) and how a client's model is
assembled. `dp2fedsam_jax.federated_round.make_round_step` turns any spec into one jitted round; no engine
module asks which piece a spec holds. A new method is one more `register(MethodSpec(...))` row (or
`dp2fedsam_jax.register_method` from a user's file); a new choice of a piece is one more subclass of
its slot's base class (pieces.py), holding its own hyperparameters as fields (paper defaults) that
`MethodSpec.bind(config)` overrides from the run's config. METHODS is the name -> MethodSpec registry.
"""

from __future__ import annotations

import dataclasses

from dp2fedsam_jax.algorithms import pieces
from dp2fedsam_jax.errors import ConfigError
from dp2fedsam_jax import local
from dp2fedsam_jax.registries import KNOBS, DeclaredField, Knob, RegistrationError, Registry
from dp2fedsam_jax.server_optimizer import ServerStep

# One instance of each piece (algorithms/pieces.py): the rows below are made of these.
NO_REGULARIZER, BLUR, ADAPTIVE_NORM, PROXIMAL = (
    pieces.NoRegularizer(), pieces.BLUR(), pieces.AdaptiveNorm(), pieces.Proximal())
NO_WEIGHT_MASK, DSU_WEIGHTS = pieces.NoWeightMask(), pieces.DSUWeightMask()
GLOBAL_MODEL, OWN_HEAD, HEAD_OFFSET = pieces.NoPersonal(), pieces.OwnHead(), pieces.HeadOffset()
NO_UPLOAD_MASK, RANDK, TOPK, DSU_MASK = (
    pieces.NoUploadMask(), pieces.RandKMask(), pieces.TopKMask(), pieces.DSUUploadMask())
# TOPK_CLIENT: each client top-k's its own noised upload (needs distributed noise);
# TOPK_SERVER: the server top-k's the noised sum (post-processing).
NO_POSTPROCESS, TOPK_CLIENT, TOPK_SERVER = (
    pieces.NoPostprocess(), pieces.TopKOfClientUpload(), pieces.TopKOfNoisedSum())
TEST_GLOBAL, TEST_PERSONAL, FINETUNE, FINETUNE_HEAD = (
    pieces.TestGlobal(), pieces.TestPersonal(), pieces.FineTune(), pieces.FineTuneHead())

# Each slot of a MethodSpec and the base class its piece must be an instance of.
_PIECE_TYPES = {
    'personal': (pieces.PersonalPart,),
    'regularizer': (pieces.Regularizer,),
    'weight_mask': (pieces.WeightMask,),
    'upload_mask': (pieces.UploadMask,),
    'postprocess': (pieces.Postprocess,),
    'evaluation': (pieces.Evaluation,),
    'server_step': (ServerStep, type(None)),  # None: the run's config.server_optimizer
}


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  """A method: one piece per slot (algorithms/pieces.py), and the flags that say how it is private."""
  name: str
  personal: object = GLOBAL_MODEL  # what stays on each client; its shared_keys are aggregated
  personal_phase: bool = False     # train the personal part (SGD, shared part fixed) before the shared phase
  shared_optimizer: local.SGD = local.SGD()  # the shared phase's step: local.SGD() | SAM() | ASAM()
  regularizer: object = NO_REGULARIZER  # added to the shared phase's loss, on theta - theta_received
  weight_mask: object = NO_WEIGHT_MASK  # DSU: forward pass through theta * M on the last layers
  upload_mask: object = NO_UPLOAD_MASK  # multiplies Delta before clipping
  noise_on_mask: bool = False  # add noise only where the upload mask is 1 (safe only for public masks)
  postprocess: object = NO_POSTPROCESS  # applied to the noised update
  private: bool = True         # clip the shared update and add Gaussian noise (client-level DP)
  evaluation: object = TEST_GLOBAL  # the model each client tests
  paper: str = ''
  # False: no rounds, nothing released; each client trains alone (local_only.py).
  federated: bool = True
  # The step from the released sum to the new shared params (server_optimizer.ServerStep); None:
  # the run's config.server_optimizer.
  server_step: ServerStep | None = None

  def __post_init__(self):
    for field, types in _PIECE_TYPES.items():
      if not isinstance(getattr(self, field), types):
        raise ValueError(f'method {self.name!r}: {field}={getattr(self, field)!r} is not an instance '
                         f'of {" or ".join(t.__name__ for t in types)} (algorithms/pieces.py)')
    if not isinstance(self.shared_optimizer, local.SGD):
      raise ValueError(f'method {self.name!r}: shared_optimizer={self.shared_optimizer!r} is not one of '
                       'local.SGD(), local.SAM(), local.ASAM()')
    if self.personal_phase and self.personal == GLOBAL_MODEL:
      raise ValueError(f'method {self.name!r}: a head phase needs a personal part')
    if self.noise_on_mask and self.upload_mask == NO_UPLOAD_MASK:
      raise ValueError(f'method {self.name!r}: noise_on_mask needs an upload mask')
    # By type: a bound row's DSU mask carries the run's keep_fraction, so it no longer equals DSU_WEIGHTS.
    dsu_forward = isinstance(self.weight_mask, pieces.DSUWeightMask)
    if dsu_forward != isinstance(self.upload_mask, pieces.DSUUploadMask):
      raise ValueError(f'method {self.name!r}: the DSU upload mask is the mask of the DSU forward pass')
    if not self.federated and (self.private or self.personal != GLOBAL_MODEL
                               or self.server_step is not None):
      raise ValueError(f'method {self.name!r}: a method without rounds releases nothing')
    if self.postprocess.reads_noise and not self.private:
      raise ValueError(f'method {self.name!r}: top-k of the noised update needs noise')

  @property
  def pieces(self) -> dict[str, object]:
    """{slot: piece} of this row (None slots left out)."""
    return {f: getattr(self, f) for f in _PIECE_TYPES if getattr(self, f) is not None}

  def knobs(self) -> list[tuple[Knob, object, str]]:
    """(knob, default, owner) of every registries.Knob its pieces declare (the piece's field default;
    owner: 'Piece.field of method name')."""
    out = []
    for piece in self.pieces.values():
      for knob in getattr(piece, 'config_fields', ()):
        if isinstance(knob, Knob):
          out.append((knob, getattr(piece, knob.attribute),
                      f'{type(piece).__name__}.{knob.attribute} of method {self.name}'))
    return out

  def bind(self, config) -> 'MethodSpec':
    """This row with each piece's own hyperparameters (its dataclass fields, paper defaults) overridden
    from the run's config, once (pieces.configured: e.g. TopKMask.keep_fraction <- config.keep_fraction)."""
    return dataclasses.replace(
        self, **{field: pieces.configured(piece, config) for field, piece in self.pieces.items()})

  def check_noise_placement(self, noise_placement: str) -> None:
    """Client-side top-k sparsifies the client's own *noised* upload: it needs distributed noise
    (with central noise the client would sparsify its clean update, a leak)."""
    if self.postprocess.on_client_noise and noise_placement != 'distributed':
      raise ConfigError(
          f'config.dp.noise_placement={noise_placement!r}: {self.name} sparsifies each client\'s '
          "own noised upload (dp-fedsam-topk.txt Option II), so noise must be added by the clients: "
          f"set --config.dp.noise_placement=distributed, or use {self.name}_server (the server "
          'sparsifies the noised sum).')

  def check_noise_mechanism(self, noise_mechanism: str) -> None:
    """Correlated noise (privacy/correlated.py) needs a release that is the central noised sum of
    clipped uploads on every coordinate, every round; refused (one line) where it is not."""
    if noise_mechanism == 'independent':
      return
    field = f'config.dp.noise_mechanism={noise_mechanism!r}'
    if not self.private:
      raise ConfigError(f'{field}: {self.name} is not private (it adds no noise); leave '
                        '--config.dp.noise_mechanism=independent or choose a private method.')
    if self.noise_on_mask:
      raise ConfigError(f"{field}: {self.name} adds noise only on each round's own mask, so no "
                        'coordinate carries the correlated rows of C^-1 Z; use '
                        '--config.dp.noise_mechanism=independent, or a method that noises every '
                        'coordinate (e.g. fed_smp_topk_safe, dp_pfeddsu_safe).')
    if self.postprocess.on_client_noise:
      raise ConfigError(f"{field}: {self.name} sparsifies each client's own noised share "
                        '(distributed noise); use dp_fedsam_topk_server (top-k of the noised sum) '
                        'or --config.dp.noise_mechanism=independent.')

  @property
  def mask_is_private(self) -> bool:
    """The upload mask is computed from the client's own data (not from the round key)."""
    return self.upload_mask.private

  def privacy_caveat(self) -> str:
    """What the accounted epsilon does not cover for this method ('' if it covers everything)."""
    if not self.private:
      return ''
    if self.noise_on_mask and self.mask_is_private:
      return (f'{self.name}: noise is added only where a mask computed from the client\'s own update '
              'is 1, so the mask (which coordinates changed most) is released without noise; the '
              'reported epsilon does not cover it. Use the _safe variant for a covered release.')
    if self.postprocess.on_client_noise:
      return (f'{self.name}: each client keeps the top-k of its own noised upload (noise '
              'sigma/sqrt(m)), so a coordinate of the sum is noised only by the clients that kept '
              'it, and one nobody kept is released as an exact 0 whose probability depends on '
              'whether a client took part: the reported epsilon does not cover the sum, nor the '
              'uploads the server sees (docs/privacy.md section 4). '
              f'{self.name}_server sparsifies the noised sum, which is post-processing and covered.')
    return ''


# Every method, the package's and those a user's file registers (api.register_method).
METHODS: Registry[MethodSpec] = Registry('method', 'method')


def register(spec: MethodSpec, *, description: str = '', replace: bool = False) -> MethodSpec:
  """Adds `spec` under `spec.name` (description: its `paper` line unless given), and each
  registries.Knob of its pieces to registries.KNOBS, so config.base_config() holds the knob and
  validate_config checks it. A name taken raises RegistrationError unless `replace`."""
  if not isinstance(spec, MethodSpec):
    raise RegistrationError(f'{spec!r} is not a MethodSpec.')
  knobs = spec.knobs()
  for knob, default, owner in knobs:
    problem = knob.problem(default, default)
    if problem:
      raise RegistrationError(f'{owner}: its default {default!r} {problem}.')
    old = KNOBS.get(knob.path)
    if old is not None and (old.knob, old.default) != (knob, default) and not replace:
      raise RegistrationError(f'config.{knob.path} is already a knob of {old.owner}, with another '
                              f'default or range; give {owner} its own path.')
  METHODS.register(spec.name, spec, description=description or spec.paper, replace=replace)
  for knob, default, owner in knobs:
    if KNOBS.get(knob.path) is None or replace:
      KNOBS.register(knob.path, DeclaredField(knob, default, owner), replace=True)
  return spec


def get_method(name: str) -> MethodSpec:
  """The registered method `name` (a ConfigError naming the choices if there is none)."""
  return METHODS.lookup(name)


_PERSONAL_HEAD = dict(personal=OWN_HEAD, personal_phase=True, evaluation=TEST_PERSONAL)

# Non-private references.
register(MethodSpec('fedavg', private=False, paper='FedAvg (McMahan et al., 2017)'))
register(MethodSpec('fedsam', shared_optimizer=local.SAM(), private=False,
                    paper='FedAvg with SAM as local optimizer (Qu et al., 2022)'))
register(MethodSpec('fedrep', **_PERSONAL_HEAD, private=False,
                    paper='FedRep: head epochs, then body epochs, SGD (Collins et al., 2021)'))

# The reference every personalization claim is measured against: each client trains its own model
# from the initial one on its own data, nothing is released (epsilon 0).
register(MethodSpec('local_only', private=False, federated=False,
                    paper='local training only: no communication, each client its own model'))

# Global-model DP baselines (dp-fedsam-topk.txt, dp2-fedsam.txt section 5).
register(MethodSpec('dp_fedavg', paper='DP-FedAvg, dp2-fedsam.txt Algorithm 1'))
register(MethodSpec('dp_fedavg_ft', evaluation=FINETUNE,
                    paper='DP-FedAvg; each client fine-tunes a copy of the global model to test'))
register(MethodSpec('dp_fedsam', shared_optimizer=local.SAM(),
                    paper='DP-FedSAM, dp-fedsam-topk.txt Algorithm 1 Option I'))
register(MethodSpec('dp_fedasam', shared_optimizer=local.ASAM(),
                    paper='DP-FedSAM with ASAM (what the reference code runs: its --adaptive flag)'))
register(MethodSpec('dp_fedsam_ft', shared_optimizer=local.SAM(), evaluation=FINETUNE,
                    paper='DP-FedSAM + local fine-tuning before testing'))
register(MethodSpec('dp_fedsam_topk', shared_optimizer=local.SAM(), postprocess=TOPK_CLIENT,
                    paper='DP-FedSAM-topk, dp-fedsam-topk.txt Algorithm 1 Option II (eq. 12): each '
                          'client top-k\'s its own noised update (distributed noise)'))
register(MethodSpec('dp_fedsam_topk_server', shared_optimizer=local.SAM(), postprocess=TOPK_SERVER,
                    paper='DP-FedSAM-topk variant: the server top-k\'s the noised sum '
                          '(post-processing, covered by epsilon)'))
register(MethodSpec('fed_smp_randk', upload_mask=RANDK, noise_on_mask=True,
                    paper='Fed-SMP-randk (Hu et al., 2023): data-independent rand-k mask, noise on it'))
register(MethodSpec('fed_smp_topk', upload_mask=TOPK, noise_on_mask=True,
                    paper='Fed-SMP-topk as written: top-k mask of the own update, noise only on it '
                          '(the mask leaks)'))
register(MethodSpec('fed_smp_topk_safe', upload_mask=TOPK,
                    paper='Fed-SMP-topk with noise on every coordinate (covered by epsilon)'))
register(MethodSpec('dp_fedavg_blur', regularizer=BLUR,
                    paper='DP-FedAvg + bounded local update regularization (Cheng et al., 2022)'))
register(MethodSpec('dp_fedavg_blurs', regularizer=BLUR, upload_mask=TOPK,
                    paper='DP-FedAvg-blur + local update sparsification before clipping; noise on '
                          'every coordinate'))

# Personalized: a private shared extractor, a local head (dp2-fedsam.txt, dp-pfeddsu.txt).
register(MethodSpec('dp2fedsam', **_PERSONAL_HEAD, shared_optimizer=local.SAM(),
                    paper='DP²-FedSAM, dp2-fedsam.txt Algorithm 2'))
register(MethodSpec('centaur', **_PERSONAL_HEAD,
                    paper='CENTAUR at client level: DP²-FedSAM with SGD instead of SAM'))
register(MethodSpec('p_fedsam', **_PERSONAL_HEAD, shared_optimizer=local.SAM(), private=False,
                    paper='DP²-FedSAM without clipping or noise (epsilon = inf)'))
register(MethodSpec('dp_pfeddsu', **_PERSONAL_HEAD, regularizer=ADAPTIVE_NORM, weight_mask=DSU_WEIGHTS,
                    upload_mask=DSU_MASK, noise_on_mask=True,
                    paper='DP-pFedDSU as written (dp-pfeddsu.txt Algorithm 1): noise only on the '
                          'private mask M (the mask leaks)'))
register(MethodSpec('dp_pfeddsu_safe', **_PERSONAL_HEAD, regularizer=ADAPTIVE_NORM,
                    weight_mask=DSU_WEIGHTS, upload_mask=DSU_MASK,
                    paper='DP-pFedDSU with noise on every coordinate (covered by epsilon)'))
register(MethodSpec('dp_fedavg_fb', evaluation=FINETUNE_HEAD,
                    paper='DP-FedAvg; each client fine-tunes its classifier head to test'))
register(MethodSpec('ppsgd', personal=HEAD_OFFSET, personal_phase=True, evaluation=TEST_PERSONAL,
                    paper='PPSGD (Bietti et al., 2022): global model + own additive head, '
                          'alternating local steps'))
register(MethodSpec('pmtl_ft', regularizer=PROXIMAL, evaluation=FINETUNE_HEAD,
                    paper='Private mean-regularized multi-task learning (Hu et al., 2021) as the '
                          'CENTAUR reference runs it: lam ||theta - theta_mean||^2, the head '
                          'fine-tuned to test'))
