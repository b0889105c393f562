"""Named registries: the one mechanism behind every name a config picks, and the knobs pieces declare.

`Registry` maps a name to an entry (a MethodSpec, a model builder, a dataset source, a partition).
The package registers its built-ins through it, and a user's file registers its own the same way
(dp2fedsam_jax.api: register_method, register_model, register_dataset, register_partition), so
config validation, `--list`, the inline help and the benchmarks see both alike.

A name registered twice raises `RegistrationError`, unless `replace=True`, or unless the second
registration comes from the same line of the same file (a config file that a tool loads twice).

`Knob` is a config field a piece reads (`config.<path>` overrides one of its dataclass fields),
with the range validate_config checks; `KNOBS` holds those of the registered methods, and
config.base_config() adds each with its piece's default. This module imports no JAX.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import sys
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

from dp2fedsam_jax.errors import ConfigError

T = TypeVar('T')

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def did_you_mean(name: Any, choices) -> str:
  """"did you mean 'x'? " for the closest of `choices` to `name` ('' if none is close)."""
  guess = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1)
  return f"did you mean '{guess[0]}'? " if guess else ''


class RegistrationError(ValueError):
  """A registration that cannot be made: a name taken, a bad entry."""


def _registering_line() -> str:
  """'file:line' of the statement that registers: the first caller outside the registration
  functions (this module, and the package's functions whose name starts with 'register')."""
  frame = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    path = os.path.abspath(frame.f_code.co_filename)
    plumbing = path == os.path.abspath(__file__) or (
        path.startswith(_PACKAGE_DIR + os.sep) and frame.f_code.co_name.startswith('register'))
    if not plumbing:
      return f'{path}:{frame.f_lineno}'
    frame = frame.f_back
  return '<unknown>:0'


@dataclasses.dataclass(frozen=True)
class Entry(Generic[T]):
  """One registered name: its value, a one-line description, and where it was registered."""
  name: str
  value: T
  description: str
  origin: str  # 'file:line' of the registering statement

  @property
  def builtin(self) -> bool:
    """Registered by the package itself (not by a user's file or a test)."""
    return self.origin.startswith(_PACKAGE_DIR + os.sep)


class Registry(Mapping[str, T]):
  """name -> entry, in registration order; read like a dict (`name in r`, `r[name]`, `sorted(r)`).

  Args:
    kind: what an entry is, for messages ('method', 'model', ...).
    field: the config field that names one ('method', 'model', ...).
  """

  def __init__(self, kind: str, field: str):
    self.kind = kind
    self.field = field
    self._entries: dict[str, Entry[T]] = {}

  def register(self, name: str, value: T, *, description: str = '', replace: bool = False) -> T:
    """Adds `value` under `name` and returns it.

    Raises:
      RegistrationError: `name` is not an identifier-like string, or is taken (pass replace=True
        to replace it on purpose).
    """
    if not isinstance(name, str) or not name or any(c.isspace() for c in name) or ':' in name:
      raise RegistrationError(f'{self.kind} name {name!r}: a non-empty string without spaces or ":".')
    origin = _registering_line()
    old = self._entries.get(name)
    if old is not None and not replace and old.origin != origin:
      raise RegistrationError(
          f'{self.kind} {name!r} is already registered (at {old.origin}); choose another name, or '
          f'pass replace=True to replace it.')
    self._entries[name] = Entry(name, value, ' '.join(description.split()), origin)
    return value

  def unregister(self, name: str) -> None:
    """Removes `name` (tests that register an entry of their own take it back)."""
    self._entries.pop(name, None)

  def snapshot(self) -> dict:
    """The entries as they are now, for `restore` (a process that loads a user's file for a
    while, such as a test, takes its registrations back)."""
    return dict(self._entries)

  def restore(self, snapshot: dict) -> None:
    self._entries = dict(snapshot)

  def __setitem__(self, name: str, value: T) -> None:
    """Swaps the value of a registered `name`, keeping its description and origin (a test's
    monkeypatch.setitem); a new name is registered as by `register`."""
    if name in self._entries:
      self._entries[name] = dataclasses.replace(self._entries[name], value=value)
    else:
      self.register(name, value)

  def __delitem__(self, name: str) -> None:
    del self._entries[name]

  def __getitem__(self, name: str) -> T:
    return self._entries[name].value

  def __iter__(self) -> Iterator[str]:
    return iter(list(self._entries))

  def __len__(self) -> int:
    return len(self._entries)

  def entry(self, name: str) -> Entry[T]:
    return self._entries[name]

  def names(self) -> list[str]:
    return sorted(self._entries)

  def builtin_names(self) -> list[str]:
    """The names the package registers itself (a golden file lists these)."""
    return sorted(n for n, e in self._entries.items() if e.builtin)

  def unknown_message(self, name: Any, choices: list[str] | None = None) -> str:
    """'config.<field>=<name>: unknown <kind>; did you mean ...? choose one of [...]'."""
    choices = self.names() if choices is None else choices
    return (f'config.{self.field}={name!r}: unknown {self.kind}; {did_you_mean(name, choices)}choose '
            f'one of {choices}.')

  def lookup(self, name: str) -> T:
    """The entry's value, or a ConfigError naming the choices (and the closest one)."""
    if name not in self._entries:
      raise ConfigError(self.unknown_message(name))
    return self._entries[name].value

  def where(self, predicate: Callable[[T], bool],
            value: Callable[[T], Any] = lambda v: v) -> 'Mapping[str, Any]':
    """A live, read-only view of the entries whose value satisfies `predicate` (later
    registrations included), mapping each name to `value(entry value)`."""
    return _View(self, predicate, value)

  def listing(self, extra: dict[str, str] | None = None) -> list[str]:
    """'name  description' lines, sorted by name, then `extra`'s (`--list`)."""
    rows = [(n, self._entries[n].description) for n in self.names()] + list((extra or {}).items())
    width = max((len(n) for n, _ in rows), default=0)
    return [f'{n:{width}s}  {about}'.rstrip() for n, about in rows]


class _View(Mapping[str, Any]):
  """Registry.where: the entries of a registry that satisfy a predicate, as they are now."""

  def __init__(self, registry: Registry, predicate: Callable, value: Callable):
    self._registry, self._predicate, self._value = registry, predicate, value

  def _names(self) -> list[str]:
    return [n for n in self._registry if self._predicate(self._registry[n])]

  def __getitem__(self, name: str):
    if name not in self._registry or not self._predicate(self._registry[name]):
      raise KeyError(name)
    return self._value(self._registry[name])

  def __iter__(self) -> Iterator[str]:
    return iter(self._names())

  def __len__(self) -> int:
    return len(self._names())


# ------------------------------------------------------------------ knobs: a piece's config fields


@dataclasses.dataclass(frozen=True)
class Knob:
  """A config field a piece reads: `config.<path>` overrides the piece's dataclass field `attribute`.

  A piece lists its knobs in `config_fields`; registering a method that holds the piece adds
  `config.<path>` to config.base_config() with the piece's own default, and validate_config checks
  its value: of the default's type (an int is a float), and within [low, high] (an open end where
  `low_open` / `high_open`).
  """
  attribute: str
  path: str
  low: float | None = None
  high: float | None = None
  low_open: bool = False
  high_open: bool = False
  help: str = ''

  def problem(self, value, default) -> str | None:
    """What is wrong with `value` as this knob (None: nothing)."""
    integer = isinstance(default, int) and not isinstance(default, bool)
    if isinstance(default, bool):
      return None if isinstance(value, bool) else 'must be True or False'
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
        or (integer and not isinstance(value, int)) or not math.isfinite(value)):
      bounds = self.range_text()
      return f'must be {"an integer" if integer else "a finite number"}' + (f' in {bounds}' if bounds else '')
    too_low = self.low is not None and (value < self.low or (self.low_open and value == self.low))
    too_high = self.high is not None and (value > self.high or (self.high_open and value == self.high))
    return f'must lie in {self.range_text()}' if too_low or too_high else None

  def range_text(self) -> str:
    if self.low is None and self.high is None:
      return ''
    left = '(' if self.low_open or self.low is None else '['
    right = ')' if self.high_open or self.high is None else ']'
    low = '-inf' if self.low is None else f'{self.low:g}'
    high = 'inf' if self.high is None else f'{self.high:g}'
    return f'{left}{low}, {high}{right}'


@dataclasses.dataclass(frozen=True)
class DeclaredField:
  """A knob as registered: the knob, its default (the piece's field default) and who reads it."""
  knob: Knob
  default: Any
  owner: str  # e.g. 'EMAServerStep.beta (method dp_fedavg_ema)'


# config path -> the DeclaredField of a registered method's piece (config.base_config adds them).
KNOBS: Registry[DeclaredField] = Registry('config field', 'knob')
