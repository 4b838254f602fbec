#!/usr/bin/env bash
# An instrumented libjpeg-turbo 3.1 for the sanitizer targets (issue 50, `make fuzz-native`,
# `make sanitize`): libjpeg's own reads and writes are then checked too, where the system
# library (Debian's 2.1.5, uninstrumented) let a stale read pass unseen
# (NOTE [ Merged upsampling leaves cconvert stale ] in pyx/include/ll_jpeg.h).
#
#   fuzz/build_libjpeg.sh VARIANT [SERIES]     prints the install prefix on its last line
#
# VARIANT:
#   fuzz   clang, -fsanitize=address,undefined + fuzzer-no-link: the libFuzzer harness
#          (fuzz/native_fuzz.c) and the C programs of tests/kernels; libFuzzer's coverage then
#          includes libjpeg's own branches (markers, Huffman tables, scans).
#   asan   gcc, -fsanitize=address,undefined: the side build of the extensions (setup.py with
#          LOADERLIB_LIBJPEG_PREFIX), run under gcc's libasan as `make fuzz` already does;
#          one compiler for the extension and the library it links, so one sanitizer runtime.
#   msan   clang, -fsanitize=memory with origin tracking: the MemorySanitizer build of the
#          pure-C harness (every byte libjpeg never wrote is tracked to where it came from).
# SERIES: 3.1 (default: 3.1.3, the series the release wheels bundle) or 2.1 (2.1.5, Debian's
#   system library, which `make build` links).
# The prefix is $SANITIZE_DIR/libjpeg-SERIES-VARIANT (SANITIZE_DIR: build/sanitize).
#
# NOTE [ Where the instrumented libjpeg comes from ]
# A fresh CI machine reaches PyPI, npm and Debian's apt repositories, nothing else, and no
# Debian release here has libjpeg-turbo 3.x source (bookworm: 2.1.5). The pylibjxl sdist on
# PyPI vendors the complete libjpeg-turbo 3.1.3 tree (third_party/libjpeg-turbo, with its
# CMake build); pip fetches it by its pinned version and the archive is checked against its
# sha256. The 2.1 series is Debian's own source package (apt-get source with a deb-src list
# and apt state of its own under build/sanitize/apt, so the machine's apt setup is left
# alone; apt checks the signatures and hashes), with Debian's patches applied.
# Both matter: 3.1.3 no longer touches cconvert under merged upsampling
# (read_and_discard_scanlines tests master->using_merged_upsample first), so the use after
# free of NOTE [ Merged upsampling leaves cconvert stale ] exists only with 2.1 and 3.0,
# which is what developers and CI link today; a bug of either kind must be found by the
# build of the library it lives in.
# SIMD is off (WITH_SIMD=0): the assembly kernels are not instrumented (MemorySanitizer
# would report every byte they write), so the C paths that replace them are the ones checked,
# as in libjpeg-turbo's own OSS-Fuzz builds. The build is cached by a key of the series, the
# compiler's version and the flags: a second run prints the prefix at once.
set -euo pipefail

VARIANT=${1:?usage: fuzz/build_libjpeg.sh fuzz|asan|msan [3.1|2.1]}
SERIES=${2:-3.1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${SANITIZE_DIR:-$ROOT/build/sanitize}
case "$OUT" in /*) ;; *) OUT=$ROOT/$OUT ;; esac
PY=${PYTHON:-python3}
JOBS=$(nproc 2>/dev/null || echo 2)

case "$VARIANT" in
  fuzz) CC=${CLANG:-clang}
        FLAGS="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined" ;;
  asan) CC=${GCC:-gcc}
        FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined" ;;
  msan) CC=${CLANG:-clang}
        FLAGS="-fsanitize=memory -fsanitize-memory-track-origins=2" ;;
  *) echo "unknown variant $VARIANT (fuzz, asan or msan)" >&2; exit 2 ;;
esac
FLAGS="$FLAGS -g -O1 -fno-omit-frame-pointer -fPIC"

command -v "$CC" >/dev/null 2>&1 || {
  echo "build_libjpeg.sh: $CC not found (apt-get install clang for the fuzz and msan variants)" >&2; exit 1; }
command -v cmake >/dev/null 2>&1 || {
  echo "build_libjpeg.sh: cmake not found (apt-get install cmake)" >&2; exit 1; }

SRC=$OUT/src
mkdir -p "$SRC"
case "$SERIES" in
  3.1)
    SDIST=pylibjxl==0.5.0; SDIST_FILE=pylibjxl-0.5.0.tar.gz
    SDIST_SHA256=3fea4e1a4b8fee307c4ce8c8be9f8ef14062d78baa85ee9137c234a9a2f89b79
    TREE=$SRC/pylibjxl-0.5.0/third_party/libjpeg-turbo; HDRS=src
    if [ ! -f "$TREE/CMakeLists.txt" ]; then
      if [ ! -f "$SRC/$SDIST_FILE" ]; then
        echo "build_libjpeg.sh: fetching the libjpeg-turbo 3.1.3 source from PyPI ($SDIST sdist)" >&2
        "$PY" -m pip download -q --no-deps --no-binary :all: -d "$SRC" "$SDIST" >&2
      fi
      echo "$SDIST_SHA256  $SRC/$SDIST_FILE" | sha256sum -c --quiet - >&2 || {
        echo "build_libjpeg.sh: $SDIST_FILE does not match its sha256" >&2; rm -f "$SRC/$SDIST_FILE"; exit 1; }
      tar -xzf "$SRC/$SDIST_FILE" -C "$SRC" pylibjxl-0.5.0/third_party/libjpeg-turbo
    fi ;;
  2.1)
    DEBVER=1:2.1.5-2; TREE=$SRC/libjpeg-turbo-2.1.5; HDRS=.
    if [ ! -f "$TREE/.debian-patched" ]; then
      APT=$OUT/apt
      mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/dl"
      echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main" \
        > "$APT/sources.list"
      AOPT=(-o "Dir::Etc::SourceList=$APT/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache" -o APT::Sandbox::User=root)
      echo "build_libjpeg.sh: fetching Debian's libjpeg-turbo $DEBVER source (apt-get source)" >&2
      apt-get "${AOPT[@]}" update -q >&2
      (cd "$APT/dl" && apt-get "${AOPT[@]}" source --download-only -q "libjpeg-turbo=$DEBVER" >&2)
      rm -rf "$TREE"
      tar -xzf "$APT/dl/libjpeg-turbo_2.1.5.orig.tar.gz" -C "$SRC"
      tar -xJf "$APT/dl/libjpeg-turbo_2.1.5-2.debian.tar.xz" -C "$TREE"
      while read -r p; do
        case "$p" in ''|'#'*) continue ;; esac
        patch -s -p1 -d "$TREE" < "$TREE/debian/patches/$p" >&2
      done < "$TREE/debian/patches/series"
      touch "$TREE/.debian-patched"
    fi ;;
  *) echo "unknown series $SERIES (3.1 or 2.1)" >&2; exit 2 ;;
esac
grep -q "set(VERSION $SERIES\." "$TREE/CMakeLists.txt" || { echo "build_libjpeg.sh: $TREE is not libjpeg-turbo $SERIES" >&2; exit 1; }

PREFIX=$OUT/libjpeg-$SERIES-$VARIANT
KEY=$( { echo "$SERIES 2"; "$CC" --version | head -n 1; echo "$FLAGS"; } | sha256sum | cut -c1-16)
if [ -f "$PREFIX/.key" ] && [ "$(cat "$PREFIX/.key")" = "$KEY" ] && [ -f "$PREFIX/lib/libjpeg.a" ]; then
  echo "$PREFIX"; exit 0
fi
BUILD=$OUT/build-libjpeg-$SERIES-$VARIANT
rm -rf "$BUILD" "$PREFIX"
mkdir -p "$BUILD"
echo "build_libjpeg.sh: building libjpeg-turbo $SERIES ($VARIANT: $CC $FLAGS) into $PREFIX" >&2
(
  cd "$BUILD"
  CC=$CC CFLAGS="$FLAGS" cmake -S "$TREE" -B . -DCMAKE_BUILD_TYPE=None -DCMAKE_INSTALL_PREFIX="$PREFIX" \
    -DCMAKE_INSTALL_LIBDIR=lib -DENABLE_SHARED=0 -DENABLE_STATIC=1 -DWITH_TURBOJPEG=0 -DWITH_SIMD=0 \
    -DWITH_JAVA=0 -DCMAKE_POSITION_INDEPENDENT_CODE=1 >cmake.log 2>&1 || { cat cmake.log >&2; exit 1; }
  cmake --build . -j "$JOBS" --target jpeg-static >build.log 2>&1 || { tail -n 40 build.log >&2; exit 1; }
  mkdir -p "$PREFIX/lib" "$PREFIX/include"
  cp libjpeg.a "$PREFIX/lib/"
  cp jconfig.h "$TREE/$HDRS/jpeglib.h" "$TREE/$HDRS/jmorecfg.h" "$TREE/$HDRS/jerror.h" "$PREFIX/include/"
) || exit 1
echo "$KEY" > "$PREFIX/.key"
echo "$PREFIX"
