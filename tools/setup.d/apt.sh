# tools/setup's step: apt, or in --dry-run a private copy of its state (tools/private_apt). Sourced by tools/setup (its variables and helpers), never run alone.
# shellcheck shell=bash

plan_apt_state() {
  PLAN_DIR=$(mktemp -d)
  trap 'rm -rf "$PLAN_DIR"' EXIT
  APT=("$PRIVATE_APT" "$PLAN_DIR" /etc/apt/sources.list apt-get)
  APT_CACHE=("$PRIVATE_APT" "$PLAN_DIR" /etc/apt/sources.list apt-cache)
  mkdir -p "$PLAN_DIR/parts" "$PLAN_DIR/prefs"
  cp -a /etc/apt/sources.list.d/. "$PLAN_DIR/parts/" 2>/dev/null || true
  cp -a /etc/apt/preferences.d/. "$PLAN_DIR/prefs/" 2>/dev/null || true
  [ ! -f /etc/apt/preferences ] || cp /etc/apt/preferences "$PLAN_DIR/prefs/none"
  if [ "$WANTS_UNSTABLE" = 1 ]; then
    printf '%s\n' "$UNSTABLE_SOURCE" >"$PLAN_DIR/parts/omni-unstable.list"
    printf 'Package: *\nPin: release a=unstable\nPin-Priority: 100\n' >"$PLAN_DIR/prefs/omni-unstable"
  fi
  : >"$PLAN_DIR/transcript"
}

apt_update() {
  if [ "$APT_UPDATED" = 0 ]; then
    if [ "$DRY_RUN" = 1 ] && [ -z "$PLAN_DIR" ]; then plan_apt_state; fi
    say "apt-get update${PLAN_DIR:+ (a private copy of apt's lists: the host's stay as they are)}"
    "${APT[@]}" update -qq -o Acquire::Check-Valid-Until=false \
      || die "apt-get update failed${PLAN_DIR:+ (the private one of the dry run)}: is Debian's archive reachable? nothing can be planned without it"
    APT_UPDATED=1
  fi
}

apt_install() {  # apt-get install ARGS..., or in --dry-run its simulation, kept for the plan
  if [ "$DRY_RUN" = 1 ]; then
    "${APT[@]}" -s install --no-install-recommends "$@" >>"$PLAN_DIR/transcript" 2>&1 \
      || die "apt-get -s install ${*} failed"
  else
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
      || die "installing ${*} failed"
  fi
}
