#!/usr/bin/env bash
# Install pyfuse3 with tierfs's patch, linked to libfuse 3.17, into the environment of
# the Python given ($1).
#
# Why a patch (tierfs.patch, 5 files):
# - pyfuse3's opendir can return only a file handle, so a file system cannot ask the
#   kernel to cache a directory's listing (FOPEN_CACHE_DIR) and keep it across opens
#   (FOPEN_KEEP_CACHE). That is what gcsfuse's kernel-list-cache-ttl-secs does: a warm
#   `ls -lR` answered by the kernel never reaches the daemon. With the patch, opendir may
#   return a FileInfo, which gains a cache_readdir field.
# - FUSE passthrough (Linux 6.9+): the kernel reads an open file straight from a backing
#   file the daemon names, without a round trip per read. tierfs hands it the SSD tier's
#   file of an object, so a restore after a remount reads at local-disk speed. The patch
#   adds FileInfo.backing_id, pyfuse3.backing_open/backing_close (the two ioctls) and
#   asks for FUSE_CAP_PASSTHROUGH at INIT when the file system sets enable_passthrough.
# - flush() gets no request context, so a file system cannot tell the last close() of a
#   file from a forked child's exit or the close of a dup'd fd (each is a FLUSH) and
#   publishes a file still being written. With the patch, a file system that sets
#   flush_takes_context gets flush(fh, ctx), the context holding the closer's pid.
# - pyfuse3 ignores FUSE INTERRUPT, so a process killed while its read waits on GCS
#   stays in D state until the read ends. With the patch, a handler can learn its
#   request's id (pyfuse3.current_request()) and a file system with an interrupt(id)
#   method hears of every INTERRUPT, to cancel that request and answer EINTR.
# - pyfuse3's loop hands the FUSE fd to a second task before every request is handled,
#   so each request, even one answered without waiting (a RAM-tier read, a cached
#   lookup), costs a lock handed over and two task switches. With the patch, the task
#   that read a request runs its handler until it first waits, and only then starts
#   another task to read the next requests. Random 4 KiB reads answered from the RAM
#   tier (probe, 4 interleaved pairs): 43-69 against 55-62 us of daemon CPU per read.
#
# Why libfuse 3.17: the passthrough fields of the INIT and OPEN replies exist from
# libfuse 3.16; Debian 12 ships 3.14. We build libfuse 3.17.2 from Debian 13's source
# tarball (sha256 pinned) into <venv>/libfuse (library only, no setuid helper: mounting
# and unmounting still use the system's fusermount3) and link pyfuse3 to it by rpath.
#
# tierfs works with a stock pyfuse3 too, without the kernel list cache or passthrough.
# Idempotent: does nothing when the patched version is already installed.
set -euo pipefail
PY=${1:?usage: deploy/pyfuse3/build.sh PYTHON}
if [[ "$PY" == */* ]]; then  # a path: made absolute (the build runs elsewhere), links kept
  PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
fi
VERSION=3.5.0
LOCAL=tierfs.5
SHA256=88399a9494b88603230bba300f4ba9ad63fece5ed514ca3633d555a0c6a42b24
FUSE_VERSION=3.17.2
FUSE_URL=http://deb.debian.org/debian/pool/main/f/fuse3/fuse3_$FUSE_VERSION.orig.tar.gz
FUSE_SHA256=3d932431ad94e86179e5265cddde1d67aa3bb2fb09a5bd35c641f86f2b5ed06f
here=$(cd "$(dirname "$0")" && pwd)

if "$PY" -m pip show pyfuse3 2>/dev/null | grep -x "Version: $VERSION+$LOCAL" >/dev/null; then
  exit 0
fi
prefix="$("$PY" -c 'import sys; print(sys.prefix)')/libfuse"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "building libfuse $FUSE_VERSION into $prefix (deploy/pyfuse3: FUSE passthrough)"
"$PY" -m pip install -q meson ninja
"$PY" -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
  "$FUSE_URL" "$work/fuse.tar.gz"
echo "$FUSE_SHA256  $work/fuse.tar.gz" | sha256sum -c --quiet
tar -xzf "$work/fuse.tar.gz" -C "$work"
bindir=$(dirname "$PY")
PATH="$bindir:$PATH" "$bindir/meson" setup "$work/fuse-build" "$work/fuse-$FUSE_VERSION" \
  --prefix="$prefix" --libdir=lib -Dutils=false -Dexamples=false -Dtests=false \
  -Dinitscriptdir= -Duseroot=false >"$work/meson.log" || { cat "$work/meson.log"; exit 1; }
PATH="$bindir:$PATH" "$bindir/ninja" -C "$work/fuse-build" install >"$work/ninja.log" \
  || { cat "$work/ninja.log"; exit 1; }

echo "building pyfuse3 $VERSION+$LOCAL (deploy/pyfuse3: the kernel's list cache, passthrough, interrupts, request loop)"
"$PY" -m pip download -q --no-deps --no-binary :all: "pyfuse3==$VERSION" -d "$work"
echo "$SHA256  $work/pyfuse3-$VERSION.tar.gz" | sha256sum -c --quiet
tar -xzf "$work/pyfuse3-$VERSION.tar.gz" -C "$work"
cd "$work/pyfuse3-$VERSION"
patch -p1 -s < "$here/tierfs.patch"
rm -f src/pyfuse3/__init__.c  # generated from the patched .pyx by Cython
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" LDFLAGS="-Wl,-rpath,$prefix/lib" \
  SETUPTOOLS_SCM_PRETEND_VERSION="$VERSION+$LOCAL" "$PY" -m pip install -q --no-deps .
