# tools/setup's step: local wheel mirrors into Bazel's repository cache. Sourced by tools/setup (its variables and helpers), never run alone.
# shellcheck shell=bash

# --- Local wheel mirrors --------------------------------------------------------------
# Some offline machines carry wheels PyPI does not serve (the CPU build of torch, from
# PyTorch's index) in pip's find-links folders. Any such file whose sha256 one of the
# project's locks names is placed in Bazel's repository cache, which Bazel consults by
# sha256 before any URL; nothing else changes and the project names no local path.
seed_repository_cache() {
  local links locks cache file sum
  links=$(PIP_CONFIG_FILE= python3 -m pip config get global.find-links 2>/dev/null || true)
  [ -n "$links" ] || return 0
  locks=$(cat "$(dirname "$0")"/../tests/engines/*.lock "$(dirname "$0")"/../requirements.lock 2>/dev/null || true)
  cache=""
  for dir in $links; do
    for file in "$dir"/*.whl; do
      [ -f "$file" ] || continue
      sum=$(sha256sum "$file" | cut -d' ' -f1)
      grep -q "sha256=$sum" <<<"$locks" || continue
      if [ "$DRY_RUN" = 1 ]; then  # `bazel info` would start a server: the plan names the file only
        would "place $(basename "$file") in Bazel's repository cache, unless it is there already"
        continue
      fi
      if [ -z "$cache" ]; then
        cache=$(cd "$(dirname "$0")/.." && bazel info repository_cache 2>/dev/null) || return 0
      fi
      if [ ! -f "$cache/content_addressable/sha256/$sum/file" ]; then
        say "repository cache: $(basename "$file") from $dir (sha256 $sum, named by a lock)"
        mkdir -p "$cache/content_addressable/sha256/$sum"
        cp "$file" "$cache/content_addressable/sha256/$sum/file.tmp"
        mv "$cache/content_addressable/sha256/$sum/file.tmp" "$cache/content_addressable/sha256/$sum/file"
      fi
    done
  done
}
seed_repository_cache
