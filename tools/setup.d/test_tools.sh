# tools/setup's step: the test tools the suite starts on loopback. Sourced by tools/setup (its variables and helpers), never run alone.
# shellcheck shell=bash

# --- Test tools ---------------------------------------------------------------------
need=()
for t in "${BAZEL_TEST_RUNNER_TOOLS[@]}"; do command -v "$t" >/dev/null 2>&1 || need+=("$t"); done
for t in "${TEST_TOOLS[@]}"; do
  case "$t" in
    docker-registry) [ -x /usr/bin/docker-registry ] || need+=("${TOOL_PACKAGE[$t]}") ;;
    nginx) [ -x /usr/sbin/nginx ] || need+=("${TOOL_PACKAGE[$t]}") ;;
    archive-keyring) [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || need+=("${TOOL_PACKAGE[$t]}") ;;
    *) command -v "$t" >/dev/null 2>&1 || need+=("${TOOL_PACKAGE[$t]}") ;;
  esac
done
plain=()
for p in "${need[@]}"; do [[ " ${NEWER_TOOLS[*]} " == *" $p "* ]] || plain+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
  apt_update
  say "installing test tools: ${need[*]}"
  [ ${#plain[@]} = 0 ] || apt_install "${plain[@]}"
  for p in "${NEWER_TOOLS[@]}"; do
    [[ " ${need[*]} " == *" $p "* ]] || continue
    # Where the release has none (bookworm: neither cosign nor kubectl), from unstable (set up above).
    if "${APT_CACHE[@]}" policy "$p" 2>/dev/null | grep -qE "^ +[0-9].* (bookworm|trixie)[/ -]"; then
      apt_install "$p"
    else
      apt_install -t unstable "$p"
    fi
  done
  # The package starts a registry service on :5000 where an init system runs; the tests
  # start their own on a free loopback port instead.
  if [ "$DRY_RUN" = 0 ] && command -v systemctl >/dev/null 2>&1 \
    && systemctl is-active --quiet docker-registry 2>/dev/null; then
    systemctl disable --now docker-registry >/dev/null 2>&1 || true
  fi
fi
