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

Each is a `ServerStep`, the slot of a method's server step (MethodSpec.server_step; None there
means the run's config.server_optimizer): `init(shared)` gives the state the server carries between
rounds (ServerState.server_opt_state, checkpointed), `apply(...)` the new shared parameters and
state. A new server step (a control variate, a post-processing of the released mean, more server
state) is one more subclass, in the package or in a user's file (docs/extending.md).

Everything here is a function of the released sums and public constants, so it is post-processing:
the accounted epsilon does not depend on it (docs/privacy.md section 1). A server step must keep it
so: read nothing but its arguments and its own state.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import jax
import optax


class ServerStep(abc.ABC):
  """The step from a round's released sum to the new shared (global) parameters, line 25.

  Subclasses are frozen dataclasses (hashable: the round step is traced with them as constants);
  their fields are their hyperparameters, and a `config_fields` of registries.Knob lets the run's
  config override them (MethodSpec.bind). `name` is the step's one-word name (logs, messages).
  """
  name: ClassVar[str] = 'server_step'

  def init(self, shared) -> Any:
    """The state the server carries between rounds, from the initial shared params (a pytree;
    () for none). Checkpointed with the ServerState."""
    del shared
    return ()

  @abc.abstractmethod
  def apply(self, shared, total, denominator, learning_rate: float, state) -> tuple[Any, Any]:
    """(new shared params, new state) from the released (noised, post-processed) sum `total` of the
    clipped uploads and the public `denominator` m (`total / m` is the released mean update);
    `learning_rate` is config.server_lr."""


@dataclasses.dataclass(frozen=True)
class SGDStep(ServerStep):
  """phi <- phi + lr * sum / m; no state (the rule before server optimizers, bit for bit)."""
  name: ClassVar[str] = 'sgd'

  def apply(self, shared, total, denominator, learning_rate: float, state):
    return jax.tree.map(lambda p, s: p + learning_rate * s / denominator, shared, total), state


@dataclasses.dataclass(frozen=True)
class OptaxStep(ServerStep):
  """An optax optimizer on the pseudo-gradient g = -sum / m (Reddi et al. 2021)."""

  @abc.abstractmethod
  def transform(self, learning_rate: float) -> optax.GradientTransformation:
    """The optax optimizer at `learning_rate`."""

  def init(self, shared):
    return self.transform(1.0).init(shared)  # the state's shape does not depend on the rate

  def apply(self, shared, total, denominator, learning_rate: float, state):
    pseudo_gradient = jax.tree.map(lambda s: -(s / denominator), total)
    updates, state = self.transform(learning_rate).update(pseudo_gradient, state, shared)
    return optax.apply_updates(shared, updates), state


@dataclasses.dataclass(frozen=True)
class MomentumStep(OptaxStep):
  """Heavy ball, optax.sgd(lr, momentum) (FedAvgM)."""
  momentum: float = 0.9
  name: ClassVar[str] = 'momentum'

  def transform(self, learning_rate: float) -> optax.GradientTransformation:
    return optax.sgd(learning_rate, momentum=self.momentum)


@dataclasses.dataclass(frozen=True)
class AdamStep(OptaxStep):
  """optax.adam(lr, b1, b2, eps) (FedAdam)."""
  beta1: float = 0.9   # decay of the first moment
  beta2: float = 0.99  # decay of the second moment
  eps: float = 1e-3    # the adaptivity tau of Reddi et al.
  name: ClassVar[str] = 'adam'

  def transform(self, learning_rate: float) -> optax.GradientTransformation:
    return optax.adam(learning_rate, b1=self.beta1, b2=self.beta2, eps=self.eps)


@dataclasses.dataclass(frozen=True)
class YogiStep(AdamStep):
  """optax.yogi(lr, b1, b2, eps) (FedYogi)."""
  name: ClassVar[str] = 'yogi'

  def transform(self, learning_rate: float) -> optax.GradientTransformation:
    return optax.yogi(learning_rate, b1=self.beta1, b2=self.beta2, eps=self.eps)


@dataclasses.dataclass(frozen=True)
class AdagradStep(OptaxStep):
  """FedAdagrad: the accumulator starts at eps^2 > 0, so no eps is added later."""
  eps: float = 1e-3
  name: ClassVar[str] = 'adagrad'

  def transform(self, learning_rate: float) -> optax.GradientTransformation:
    return optax.adagrad(learning_rate, initial_accumulator_value=self.eps ** 2, eps=0.0)


# config.server_optimizer -> its ServerStep class.
SERVER_STEPS: dict[str, type[ServerStep]] = {
    cls.name: cls for cls in (SGDStep, MomentumStep, AdamStep, YogiStep, AdagradStep)}
SERVER_OPTIMIZERS = tuple(SERVER_STEPS)


def make_server_step(name: str = 'sgd', *, momentum: float = 0.9, beta1: float = 0.9,
                     beta2: float = 0.99, eps: float = 1e-3) -> ServerStep:
  """The server optimizer `name` of SERVER_OPTIMIZERS with its hyperparameters (each takes those
  it has: momentum; adam, yogi: beta1, beta2, eps; adagrad: eps)."""
  if name not in SERVER_STEPS:
    raise ValueError(f'config.server_optimizer={name!r}: unknown; choose one of '
                     f'{list(SERVER_OPTIMIZERS)}.')
  cls = SERVER_STEPS[name]
  given = {'momentum': momentum, 'beta1': beta1, 'beta2': beta2, 'eps': eps}
  return cls(**{f.name: given[f.name] for f in dataclasses.fields(cls)})


def from_config(config) -> ServerStep:
  """config.server_optimizer with its config.server_* hyperparameters."""
  return make_server_step(config.server_optimizer, momentum=config.server_momentum,
                          beta1=config.server_beta1, beta2=config.server_beta2,
                          eps=config.server_eps)
