# tools/setup's step: the suite's second cosign (the major the host lacks). Sourced by tools/setup (its variables and helpers), never run alone.
# shellcheck shell=bash

# --- the suite's second cosign ------------------------------------------------------
# Users verify a release with the cosign their host has: Debian 13's own 2.x reads only cosign's
# legacy .sig/.att tags, unstable's 3.x (Debian 12 through this script) prefers the Sigstore
# bundles. The suite checks every signed push with both, so it keeps the other major beside the
# host's: the .deb from Debian's archive (unstable's 3.x where the host has 2.x, else trixie's
# 2.x), unpacked under ${SECOND_COSIGN_ROOT}/<version>/. Nothing of apt's own changes: the
# download reads a private sources list and lists directory, removed afterwards.
cosign_major() { printf '%s' "${1%%.*}"; }

second_cosign_wanted() {  # prints the suite to take it from, nothing when one is in place
  local host dir
  # In --dry-run before cosign is installed: which major the host gets is known only then.
  if ! host=$(dpkg-query -W -f '${Version}' cosign 2>/dev/null); then
    [ "$DRY_RUN" = 0 ] || echo "trixie or unstable (the major the host's lacks)"
    return 0
  fi
  for dir in "$SECOND_COSIGN_ROOT"/*/; do
    [ -x "${dir}cosign" ] || continue
    [ "$(cosign_major "$(basename "$dir")")" != "$(cosign_major "$host")" ] && return 0
  done
  if [ "$(cosign_major "$host")" -ge 3 ]; then echo trixie; else echo unstable; fi
}

install_second_cosign() {
  local suite state version
  suite=$(second_cosign_wanted)
  [ -n "$suite" ] || return 0
  [ "$DRY_RUN" = 0 ] || { would "unpack the cosign .deb of ${suite} under $SECOND_COSIGN_ROOT/ (apt untouched)"; return 0; }
  state=$(mktemp -d)
  local apt_private=("$PRIVATE_APT" "$state" "$state/sources.list")
  mkdir -p "$state/deb"
  printf 'deb http://deb.debian.org/debian %s main\n' "$suite" >"$state/sources.list"
  say "fetching ${suite}'s cosign for the suite (the other major than the host's; apt's sources unchanged)"
  "${apt_private[@]}" apt-get update -qq 2>/dev/null \
    || { rm -rf "$state"; die "reading ${suite}'s package list failed: is Debian's archive reachable?"; }
  version=$("${apt_private[@]}" apt-cache madison cosign | awk -v s="$suite" '$0 ~ s {print $3; exit}')
  [ -n "$version" ] || { rm -rf "$state"; die "${suite} lists no cosign package"; }
  (cd "$state/deb" && "${apt_private[@]}" apt-get download -qq "cosign=$version" 2>/dev/null) \
    || { rm -rf "$state"; die "downloading cosign ${version} from ${suite} failed"; }
  dpkg-deb -x "$state"/deb/cosign_*.deb "$state/root"
  mkdir -p "$SECOND_COSIGN_ROOT/$version"
  install -m 0755 "$state/root/usr/bin/cosign" "$SECOND_COSIGN_ROOT/$version/cosign.tmp"
  mv "$SECOND_COSIGN_ROOT/$version/cosign.tmp" "$SECOND_COSIGN_ROOT/$version/cosign"
  rm -rf "$state"
  say "cosign ${version} (from ${suite}) at $SECOND_COSIGN_ROOT/$version/cosign, for the suite only"
}
install_second_cosign
