#!/usr/bin/env bash
# `make test-wheel`: install a built wheel into a fresh virtualenv and run tests/wheel/smoke.py
# there, from a temporary folder outside the source tree. When a private mount namespace is
# available (unshare), the system's libjpeg (headers, static and shared libraries, pkg-config
# file) and libgomp are hidden behind empty files first, so the test fails if the wheel needed
# any of them. Usage: tests/wheel/run.sh WHEEL REFERENCE_PYTHON (a Python with OpenCV, for the
# independent decode checksum).
set -euo pipefail
wheel=$(readlink -f "$1")
ref_python=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
work=$(mktemp -d)        # the virtualenv and the working folder, both outside the source tree
trap 'rm -rf "$work"' EXIT
venv="$work/venv"

"$PYTHON" -m venv "$venv"
# --only-binary: nothing may be compiled here, loaderlib least of all.
"$venv/bin/python" -m pip install -q --only-binary :all: "$wheel"

sha=$("$ref_python" -c "
import hashlib, sys, cv2, numpy as np
img = cv2.imdecode(np.fromfile(sys.argv[1], np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
print(hashlib.sha256(np.ascontiguousarray(img[:, :, ::-1]).tobytes()).hexdigest())" "$repo/loaderlib/_data/grace_hopper.jpg")

mkdir "$work/cwd"
cd "$work/cwd"
run=("$venv/bin/python" -I "$repo/tests/wheel/smoke.py" --expect-sha256 "$sha" --source-tree "$repo")

hide=()
for f in /usr/include/jpeglib.h /usr/include/jerror.h /usr/include/jmorecfg.h /usr/include/*/jconfig.h \
         /usr/lib/*/libjpeg.* /usr/lib/*/pkgconfig/libjpeg.pc /usr/lib/*/libgomp.so*; do
    [ -e "$f" ] && hide+=("$(readlink -f "$f")")
done
: > "$work/empty"
if unshare -m true 2>/dev/null; then ns=(unshare -m); elif unshare -rm true 2>/dev/null; then ns=(unshare -rm); else ns=(); fi
if [ ${#ns[@]} -gt 0 ]; then
    echo "test-wheel: hiding ${#hide[@]} system files (libjpeg headers/libraries/pkg-config, libgomp) in a private mount namespace"
    "${ns[@]}" bash -c '
        set -e; empty=$1; shift
        while [ "$1" != "--" ]; do mount --bind "$empty" "$1"; shift; done; shift
        [ ! -s /usr/include/jpeglib.h ] || { echo "jpeglib.h still visible"; exit 1; }
        exec "$@"' _ "$work/empty" "${hide[@]}" -- "${run[@]}"
else
    echo "test-wheel: WARNING: no private mount namespace (unshare): the system libjpeg stays visible;" \
         "the ldd checks below still require libjpeg and libgomp from the wheel"
    "${run[@]}"
fi
