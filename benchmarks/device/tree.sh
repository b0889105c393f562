#!/usr/bin/env bash
# What a device call sends, and a slimmer tree when that is over the tool's 64 MiB:
#
#   bash benchmarks/device/tree.sh size [PATH...]   # MiB sent: tracked + untracked-not-ignored + PATHs
#   bash benchmarks/device/tree.sh slim             # before the device calls
#   bash benchmarks/device/tree.sh restore          # after them, before any commit
#   bash benchmarks/device/tree.sh stage BLOCK [CPU_ROOT]  # a CPU root's block into
#                                                          # .device_sweeps/fair
#
# A call sends every tracked file, and every committed run adds to them (31 MiB on 2026-11-29, 15 of
# them the Shakespeare study's round logs), so Fashion-MNIST (26 MB xz) and the wheels (5 MB) stop
# fitting beside them once more blocks are committed. The device steps read none of the earlier
# studies' runs. `slim` switches to a branch `device-slim` whose one commit removes every folder of
# experiments/results/ but those matching KEEP (default 'fair_*': the benchmark's own blocks, 2 MiB
# each, kept beside the scripts that write them); uncommitted edits come along, so they travel too.
# `restore` switches back to the branch slim started from and deletes device-slim; it refuses while
# device-slim holds commits of its own (commit on the real branch, never on this one).
set -euo pipefail
cd "$(dirname "$0")/../.."
SLIM=device-slim
FROM_FILE="$(git rev-parse --git-dir)/device-slim-from"

sent_bytes() {  # what the device tool copies: git's tracked and untracked-not-ignored files, plus "$@"
  local tree extra=0
  tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null |
         tail -1 | cut -f1)
  if [ "$#" -gt 0 ]; then extra=$(du -cb "$@" 2>/dev/null | tail -1 | cut -f1); fi
  echo $(( tree + extra ))
}

case "${1:-}" in
  size)
    shift
    echo "$(( $(sent_bytes "$@") / 1024 / 1024 ))"
    ;;
  slim)
    [ ! -e "$FROM_FILE" ] || { echo "already slim (from $(cat "$FROM_FILE")): restore first" >&2; exit 1; }
    from=$(git symbolic-ref -q --short HEAD) || { echo "slim starts from a branch, not a detached HEAD" >&2; exit 1; }
    before=$(sent_bytes)
    drop=()
    for dir in experiments/results/*/; do
      dir=${dir%/}
      # shellcheck disable=SC2053  # KEEP is a glob on purpose
      [[ $(basename "$dir") == ${KEEP:-fair_*} ]] && continue
      [ -n "$(git ls-files -- "$dir" | head -1)" ] && drop+=("$dir")
    done
    [ "${#drop[@]}" -gt 0 ] || { echo "nothing to leave behind under experiments/results/" >&2; exit 1; }
    git switch -q -c "$SLIM"
    echo "$from" > "$FROM_FILE"
    git rm -r -q -- "${drop[@]}"  # tracked on $from: restore brings them back
    git -c user.name=device-slim -c user.email=device-slim@localhost commit -q --no-verify \
        -m "device-slim: leave ${drop[*]} behind for a device call (benchmarks/device/tree.sh)" \
        -- "${drop[@]}"  # only the removal: staged edits stay staged
    echo "on $SLIM (from $from): left behind ${drop[*]};" \
         "a call now sends $(( $(sent_bytes) / 1024 / 1024 )) MiB (was $(( before / 1024 / 1024 )))"
    ;;
  restore)
    [ -e "$FROM_FILE" ] || { echo "not slim: nothing to restore" >&2; exit 1; }
    from=$(cat "$FROM_FILE")
    own=$(git rev-list --count "$from..$SLIM")
    [ "$own" = 1 ] || { echo "$SLIM holds $(( own - 1 )) commit(s) beyond its removal: move them to" \
                             "$from (git cherry-pick) and drop them here first" >&2; exit 1; }
    git switch -q "$from"
    git branch -q -D "$SLIM"
    rm -f "$FROM_FILE"
    echo "back on $from"
    ;;
  stage)
    # A block's state under a CPU root (default $HOME/fair) for benchmarks/device/fair_benchmark.sh: its
    # runs' small files and each search's operator file (benchmarks/device/small_files.sh), so that a search
    # under way continues on the device with its secret instead of drawing a second K. Carry DEST.
    # An unfinished run starts again from round 0 there (no checkpoint travels). Refused while a
    # sweep of that root runs: the two machines would train the same runs.
    block=${2:?usage: bash benchmarks/device/tree.sh stage BLOCK [CPU_ROOT]}
    cpu_root=${3:-$HOME/fair}
    dest=${DEST:-.device_sweeps/fair}
    configs=(experiments/configs/fair_"$block"_*.py)
    [ "${#configs[@]}" = 1 ] && [ -e "${configs[0]}" ] || { echo "no block $block" >&2; exit 1; }
    name=$(basename "${configs[0]}" .py)
    if pgrep -f "launch.fair_benchmark.*--root=$cpu_root( |$)" > /dev/null; then
      echo "a sweep of $cpu_root is running: stop it first (it resumes from its checkpoints)" >&2
      exit 1
    fi
    [ -d "$cpu_root/$name" ] || { echo "nothing of block $block under $cpu_root" >&2; exit 1; }
    # shellcheck source=benchmarks/device/small_files.sh
    source benchmarks/device/small_files.sh
    mkdir -p "$dest"
    (cd "$cpu_root" && small_files "$name" | tar cf - --null -T -) | tar xf - -C "$dest"
    echo "staged $cpu_root/$name into $dest: $(( $(du -sb "$dest" | cut -f1) / 1024 )) KiB to carry"
    ;;
  *)
    echo "usage: bash benchmarks/device/tree.sh size [PATH...] | slim | restore | stage BLOCK [CPU_ROOT]" >&2
    exit 2
    ;;
esac
