# tools/setup's step: Bazel 7.7.1 from Debian unstable and the offline module overrides. Sourced by tools/setup (its variables and helpers), never run alone.
# shellcheck shell=bash

bazel_major() {
  local v
  v=$("$1" --version 2>/dev/null | awk '/^bazel /{print $2}') || return 1
  [ -n "$v" ] || return 1
  echo "${v%%.*}"
}

registry_reachable() {
  command -v curl >/dev/null 2>&1 || return 1
  curl -fsS -m 5 -o /dev/null https://bcr.bazel.build/bazel_registry.json 2>/dev/null
}

bazel_packages() {  # what the Bazel step installs from unstable, in order
  if [ "$CODENAME" = bookworm ] && ! dpkg -s libssl3t64 >/dev/null 2>&1; then
    echo libssl3t64 openssl-provider-legacy
  fi
  echo "${DEBIAN_BAZEL_PACKAGES[@]}"
}

# apt-get -s transcripts on stdin -> one line per package, then the count moved to unstable.
summarize_moves() { awk -v core="${CORE_PACKAGES[*]}" -f "$(dirname "$0")/setup_moves.awk"; }

install_bazel_from_debian() {
  local sources=${UNSTABLE_FILES[0]} prefs=${UNSTABLE_FILES[1]} aptconf=${UNSTABLE_FILES[2]}
  if [ "$DRY_RUN" = 1 ]; then
    [ -f "$sources" ] || would "add $sources: $UNSTABLE_SOURCE"
    [ -f "$prefs" ] || would "add $prefs: Pin: release a=unstable, Pin-Priority: 100"
    [ -f "$aptconf" ] || would "add $aptconf: Acquire::Check-Valid-Until \"false\""
    apt_update
    # shellcheck disable=SC2046  # one package name per word
    apt_install -t unstable $(bazel_packages)
    return 0
  fi
  if [ ! -f "$sources" ]; then
    say "adding Debian unstable (priority 100: only packages asked for explicitly come from it)"
    printf '%s\n%s\n' "$MARK" "$UNSTABLE_SOURCE" >"$sources"
    APT_UPDATED=0
  fi
  [ -f "$prefs" ] || printf '%s\nPackage: *\nPin: release a=unstable\nPin-Priority: 100\n' "$MARK" >"$prefs"
  # unstable's Release file can be older than apt's validity window.
  [ -f "$aptconf" ] || printf '%s\nAcquire::Check-Valid-Until "false";\n' "$MARK" >"$aptconf"
  apt_update
  # shellcheck disable=SC2046  # one package name per word
  say "taking Bazel from unstable: $(apt-get -s install -t unstable --no-install-recommends $(bazel_packages) \
    | summarize_moves | tail -n 1) (tools/setup --dry-run lists them)"
  export DEBIAN_FRONTEND=noninteractive
  if [ "$CODENAME" = bookworm ] && ! dpkg -s libssl3t64 >/dev/null 2>&1; then
    # sid's openssl-provider-legacy ships a file bookworm's libssl3 owns, without Replaces.
    say "bookworm: moving libssl3 to unstable's libssl3t64 first"
    apt-get install -y -qq -t unstable --no-install-recommends -o Dpkg::Options::=--force-overwrite \
      libssl3t64 openssl-provider-legacy >/dev/null || die "libssl3t64 transition failed"
  fi
  say "installing ${DEBIAN_BAZEL_PACKAGES[*]} from unstable (about a minute)"
  apt-get install -y -qq -t unstable --no-install-recommends "${DEBIAN_BAZEL_PACKAGES[@]}" >/dev/null \
    || die "installing Bazel from Debian unstable failed"
  update-ca-certificates >/dev/null 2>&1 || true
}

write_offline_overrides() {
  local m
  for m in "${STUB_MODULES[@]}"; do
    if [ ! -f "$STUB_ROOT/$m/MODULE.bazel" ]; then
      [ "$DRY_RUN" = 0 ] || { would "create the stub module $STUB_ROOT/$m"; continue; }
      mkdir -p "$STUB_ROOT/$m"
      printf 'module(name = "%s")\n' "$m" >"$STUB_ROOT/$m/MODULE.bazel"
      : >"$STUB_ROOT/$m/BUILD.bazel"
    fi
  done
  local want
  want=$(
    echo "$MARK"
    echo "# Offline Bazel: modules bazel_tools needs that Debian does not package."
    for m in "${STUB_MODULES[@]}"; do echo "common --override_module=$m=$STUB_ROOT/$m"; done
    echo "common --noenable_workspace"
  )
  if [ -f "$SYSTEM_BAZELRC" ] && [ "$(cat "$SYSTEM_BAZELRC")" = "$want" ]; then
    return 0
  fi
  if [ -f "$SYSTEM_BAZELRC" ] && ! head -n1 "$SYSTEM_BAZELRC" | grep -qF "$MARK"; then
    die "$SYSTEM_BAZELRC exists and was not written by this script; move it aside and run again"
  fi
  [ "$DRY_RUN" = 0 ] || { would "write $SYSTEM_BAZELRC (the offline module overrides)"; return 0; }
  say "writing $SYSTEM_BAZELRC"
  printf '%s\n' "$want" >"$SYSTEM_BAZELRC.tmp" && mv "$SYSTEM_BAZELRC.tmp" "$SYSTEM_BAZELRC"
}

# Debian's /etc/bazel/bazelrc sets --host_javabase, deprecated in Bazel 7: every command
# then warns twice. --tool_java_runtime_version=local_jdk is the same choice without the
# warning. Only that one line of Debian's file changes; dpkg keeps it as a local edit.
DEBIAN_BAZELRC=/etc/bazel/bazelrc
replace_deprecated_javabase() {
  [ -f "$DEBIAN_BAZELRC" ] && grep -q '^build --host_javabase=@local_jdk//:jdk$' "$DEBIAN_BAZELRC" || return 0
  [ "$DRY_RUN" = 0 ] || { would "edit $DEBIAN_BAZELRC: --host_javabase -> --tool_java_runtime_version"; return 0; }
  say "$DEBIAN_BAZELRC: --host_javabase (deprecated) -> --tool_java_runtime_version=local_jdk"
  sed 's|^build --host_javabase=@local_jdk//:jdk$|build --tool_java_runtime_version=local_jdk|' \
    "$DEBIAN_BAZELRC" >"$DEBIAN_BAZELRC.tmp" && mv "$DEBIAN_BAZELRC.tmp" "$DEBIAN_BAZELRC"
}

# --- Bazel --------------------------------------------------------------------------
existing=$(command -v bazel || command -v bazelisk || true)
if [ -n "$existing" ] && ! dpkg -s bazel-bootstrap >/dev/null 2>&1 \
   && [ "$(bazel_major "$existing" || echo 0)" -ge 7 ] && registry_reachable; then
  say "Bazel >= 7 at $existing and the public registry is reachable: leaving Bazel as it is"
else
  missing=()
  dpkg -s bazel-bootstrap 2>/dev/null | grep -q "^Version: ${BAZEL_VERSION}" || missing+=(bazel-bootstrap)
  for p in "${DEBIAN_BAZEL_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    [ -f "${UNSTABLE_FILES[0]}" ] || WANTS_UNSTABLE=1
    install_bazel_from_debian
  fi
  write_offline_overrides
  replace_deprecated_javabase
  if [ "$DRY_RUN" = 0 ]; then
    got=$(bazel --version 2>/dev/null | awk '{print $2}')
    [ "$got" = "$BAZEL_VERSION" ] || die "bazel --version says '${got:-nothing}', expected ${BAZEL_VERSION}"
  fi
fi
