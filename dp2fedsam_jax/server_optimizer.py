"""The server's step on the released average (Reddi et al. 2021, "Adaptive Federated Optimization").

A round releases the noised sum of the clipped uploads; divided by the public denominator m it is
the average update. The server takes its negation as a pseudo-gradient g = -sum / m and steps with
an optax optimizer (`config.server_optimizer`):

    sgd       phi <- phi + lr * sum / m       no state; the rule before server optimizers, bit for bit
    momentum  v <- beta v + sum / m, phi <- phi + lr v   heavy ball, optax.sgd(lr, beta) (FedAvgM);
              its steady step is lr / (1 - beta) times SGD's
    adam      optax.adam(lr, b1, b2, eps)     (FedAdam; optax corrects the moments' bias, so the
    yogi      optax.yogi(lr, b1, b2, eps)     (FedYogi)  first step is ~lr * sign of the mean)
    adagrad   phi <- phi + lr * sum / m / sqrt(eps^2 + sum of (sum / m)^2 so far)   (FedAdagrad)

Everything here is a function of the released sums and public constants, so it is post-processing:
the accounted epsilon does not depend on it (docs/privacy.md section 1).
"""

from __future__ import annotations

import dataclasses

import jax
import optax

SERVER_OPTIMIZERS = ('sgd', 'momentum', 'adam', 'yogi', 'adagrad')


@dataclasses.dataclass(frozen=True)
class ServerOptimizer:
  """The server optimizer's name and hyperparameters (static: hashable, jit-friendly); the learning
  rate is `RoundConfig.server_lr`."""
  name: str = 'sgd'
  momentum: float = 0.9  # momentum
  beta1: float = 0.9     # adam, yogi: decay of the first moment
  beta2: float = 0.99    # adam, yogi: decay of the second moment
  eps: float = 1e-3      # adam, yogi, adagrad: the adaptivity tau of Reddi et al.

  def __post_init__(self):
    if self.name not in SERVER_OPTIMIZERS:
      raise ValueError(f'config.server_optimizer={self.name!r}: unknown; choose one of '
                       f'{list(SERVER_OPTIMIZERS)}.')

  @classmethod
  def from_config(cls, config) -> 'ServerOptimizer':
    return cls(name=config.server_optimizer, momentum=config.server_momentum,
               beta1=config.server_beta1, beta2=config.server_beta2, eps=config.server_eps)

  def transform(self, learning_rate: float) -> optax.GradientTransformation:
    """The optax optimizer of the pseudo-gradient (not used by 'sgd', which keeps its own rule)."""
    if self.name == 'momentum':
      return optax.sgd(learning_rate, momentum=self.momentum)
    if self.name == 'adam':
      return optax.adam(learning_rate, b1=self.beta1, b2=self.beta2, eps=self.eps)
    if self.name == 'yogi':
      return optax.yogi(learning_rate, b1=self.beta1, b2=self.beta2, eps=self.eps)
    if self.name == 'adagrad':  # the accumulator starts at eps^2 > 0, so no eps is added later
      return optax.adagrad(learning_rate, initial_accumulator_value=self.eps ** 2, eps=0.0)
    return optax.sgd(learning_rate)

  def init(self, shared):
    """The state the server carries between rounds (checkpointed with the ServerState): () for sgd."""
    if self.name == 'sgd':
      return ()
    return self.transform(1.0).init(shared)  # the state's shape does not depend on the rate

  def apply(self, shared, total, denominator, learning_rate: float, opt_state):
    """(new shared params, new state) from the released sum `total` and the public `denominator`."""
    if self.name == 'sgd':  # kept as written before server optimizers: the same float ops
      return jax.tree.map(lambda p, s: p + learning_rate * s / denominator, shared, total), opt_state
    pseudo_gradient = jax.tree.map(lambda s: -(s / denominator), total)
    updates, opt_state = self.transform(learning_rate).update(pseudo_gradient, opt_state, shared)
    return optax.apply_updates(shared, updates), opt_state
