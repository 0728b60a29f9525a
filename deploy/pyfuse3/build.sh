#!/usr/bin/env bash
# Install pyfuse3 with tierfs's patch into the environment of the Python given ($1).
#
# Why: pyfuse3's opendir can return only a file handle, so a file system cannot ask the
# kernel to cache a directory's listing (FOPEN_CACHE_DIR) and keep it across opens
# (FOPEN_KEEP_CACHE). That is what gcsfuse's kernel-list-cache-ttl-secs does, and a
# warm `ls -lR` answered by the kernel never reaches the daemon. The patch
# (cache-readdir.patch, 4 files) lets opendir return a FileInfo, with a new
# cache_readdir field. tierfs works with a stock pyfuse3 too, without the kernel cache.
#
# Idempotent: does nothing when the patched version is already installed.
set -euo pipefail
PY=${1:?usage: deploy/pyfuse3/build.sh PYTHON}
if [[ "$PY" == */* ]]; then  # a path: made absolute (the build runs elsewhere), links kept
  PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
fi
VERSION=3.5.0
LOCAL=tierfs.1
SHA256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
here=$(cd "$(dirname "$0")" && pwd)

if "$PY" -m pip show pyfuse3 2>/dev/null | grep -x "Version: $VERSION+$LOCAL" >/dev/null; then
  exit 0
fi
echo "building pyfuse3 $VERSION+$LOCAL (deploy/pyfuse3: the kernel's list cache)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download -q --no-deps --no-binary :all: "pyfuse3==$VERSION" -d "$work"
echo "$SHA256  $work/pyfuse3-$VERSION.tar.gz" | sha256sum -c --quiet
tar -xzf "$work/pyfuse3-$VERSION.tar.gz" -C "$work"
cd "$work/pyfuse3-$VERSION"
patch -p1 -s < "$here/cache-readdir.patch"
rm -f src/pyfuse3/__init__.c  # generated from the patched .pyx by Cython
SETUPTOOLS_SCM_PRETEND_VERSION="$VERSION+$LOCAL" "$PY" -m pip install -q --no-deps .
