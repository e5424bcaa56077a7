#!/usr/bin/env bash
# copy_checkout.sh DEST: the checkout's files (tracked, and new ones git does not ignore, as they
# are in the working tree) copied into a new folder DEST. CI's wheel and CUDA builds run in such
# a copy while the suite runs in the checkout, so neither build writes where the other reads
# (pip's build writes metadata and build folders into the tree it builds).
# copy_checkout.sh --id: an id of the tracked files' content as they are in the working tree,
# which a build records so that its check never tests the build of other sources.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --id ]; then
  git ls-files | git hash-object --stdin-paths | sha1sum | cut -c1-12
  exit 0
fi
dest=${1:?usage: copy_checkout.sh DEST, or copy_checkout.sh --id}
rm -rf "$dest"
mkdir -p "$dest"
# --ignore-failed-read: a tracked file deleted in the working tree is left out.
git ls-files -z --cached --others --exclude-standard \
  | tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$dest"
