# tools/setup's step: buildifier, from npm, checked by sha256. Sourced by tools/setup (its variables and helpers), never run alone.
# shellcheck shell=bash

# --- buildifier ---------------------------------------------------------------------
install_buildifier() {
  local have arch tmp tarball
  have=$(/usr/local/bin/buildifier --version 2>/dev/null | awk '/version:/ {print $3; exit}') || have=""
  [ "$have" = "$BUILDIFIER_VERSION" ] && return 0
  case "$(dpkg --print-architecture)" in
    amd64) arch=amd64 ;; arm64) arch=arm64 ;; *) die "buildifier: no release binary for $(dpkg --print-architecture)" ;;
  esac
  if ! command -v npm >/dev/null 2>&1; then
    apt_update
    say "installing npm (for buildifier)"
    # bookworm's npm needs its libssl-dev, which the newer libssl Bazel brought from unstable
    # rules out: there npm comes from unstable too (set up above), as cosign does.
    if [ "$DRY_RUN" = 1 ]; then
      apt_install npm 2>/dev/null || apt_install -t unstable npm
    else
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null 2>&1 \
        || apt_install -t unstable npm
    fi
  fi
  [ "$DRY_RUN" = 0 ] || { would "install /usr/local/bin/buildifier ${BUILDIFIER_VERSION} from npm (sha256-checked)"; return 0; }
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "@bazel/buildifier@${BUILDIFIER_VERSION}" >/dev/null) \
    || { rm -rf "$tmp"; die "npm pack @bazel/buildifier@${BUILDIFIER_VERSION} failed: is the npm registry reachable?"; }
  tarball="$tmp/bazel-buildifier-${BUILDIFIER_VERSION}.tgz"
  if [ "$(sha256sum "$tarball" | cut -d' ' -f1)" != "$BUILDIFIER_PACKAGE_SHA256" ]; then
    rm -rf "$tmp"
    die "@bazel/buildifier@${BUILDIFIER_VERSION}: the package's sha256 is not ${BUILDIFIER_PACKAGE_SHA256}"
  fi
  tar -xzf "$tarball" -C "$tmp" "package/buildifier-linux_${arch}"
  install -m 0755 "$tmp/package/buildifier-linux_${arch}" /usr/local/bin/buildifier.tmp
  mv /usr/local/bin/buildifier.tmp /usr/local/bin/buildifier
  rm -rf "$tmp"
  say "installed buildifier ${BUILDIFIER_VERSION}"
}
install_buildifier
