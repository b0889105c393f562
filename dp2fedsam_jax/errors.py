"""The project's own error types, in a leaf module every layer may raise them from."""


class ConfigError(ValueError):
  """A config field has a value that cannot work; the message names the field and the fix."""
