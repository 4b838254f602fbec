"""Benchmark photos: an ImageFolder of JPEGs with ImageNet's statistics, and the old one-photo set.

``imagenet-like`` (the default of every benchmark that generates photos): the content comes
from the colour and grey photos that ship with scikit-image (``skimage/data``: astronaut,
chelsea, coffee, rocket, motorcycle, hubble_deep_field, ihc, retina; camera, brick, grass,
gravel, coins, moon, clock_motion, cell) and with loaderlib (grace_hopper): a random crop of one
of them, flipped, colour-shifted, resized to a size drawn from ImageNet's shapes (short side
mostly 300-500 px, most images 500 px on their long side; 4:3 and 3:2 landscapes dominate, with
portraits, squares and a few panoramas), with sensor-like noise (shot noise that grows with
brightness plus read noise, a little spatially correlated, as a demosaicked and denoised camera
file has), encoded at quality 75-95, mostly 4:2:0, with a few 4:2:2 / 4:4:4, grayscale and
progressive files. The noise brings the files near ImageNet train's sizes (about 110 KB mean);
without it a crop of a clean photo encodes to a third of that, and entropy decoding, the
largest part of a loader's CPU per image, is that much cheaper than on users' data.

``one-photo``: the data of the benchmarks before round 4, random crops of the one sample photo
with no noise (about 43 KB median), kept only as a named variant (``--data-kind one-photo``) so
that older figures can be reproduced.

:func:`describe` prints the statistics of any folder of JPEGs (read from their headers), so a
report states what it ran on, generated data or ``--data DIR`` alike. Test data only: nothing in
the ``loaderlib`` package imports this module.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from collections.abc import Sequence

import numpy as np

__all__ = ["DATA_KINDS", "DEFAULT_KIND", "add_data_kind", "data_root", "describe", "jpeg_header", "jpegs",
           "make_photos", "photos_for", "stats"]

DATA_KINDS = ("imagenet-like", "one-photo")
DEFAULT_KIND = "imagenet-like"

#: Colour source photos of scikit-image's data folder (files shipped in its wheel).
COLOUR = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png",
          "hubble_deep_field.jpg", "ihc.png", "retina.jpg")
#: Grey ones (scikit-image), for the grayscale files and, colourised, for a share of colour ones.
GREY = ("camera.png", "brick.png", "grass.png", "gravel.png", "coins.png", "moon.png", "clock_motion.png",
        "cell.png")

#: (width / height, probability): ImageNet train's shapes, coarsely (about two thirds are 4:3 or
#: 3:2 landscapes, about a fifth portraits, a few squares and panoramas).
ASPECTS = ((4 / 3, 0.44), (3 / 2, 0.18), (3 / 4, 0.12), (2 / 3, 0.07), (1.0, 0.08), (16 / 9, 0.05),
           (2.0, 0.03), (5 / 4, 0.03))
QUALITIES = ((75, 0.2), (80, 0.15), (85, 0.2), (90, 0.25), (95, 0.2))
SAMPLINGS = (("420", 0.87), ("422", 0.05), ("444", 0.08))
GREY_SHARE = 0.03
#: Noise strength range (levels at mid grey before the blur), gain and sharpening: chosen so
#: that the files come out near ImageNet train's sizes (about 110 KB mean).
NOISE = (7.0, 14.0)
NOISE_GAIN = 2.5
SHARPEN = 1.5
PROGRESSIVE_SHARE = 0.05


def add_data_kind(parser) -> None:
    """Add ``--data-kind`` to a benchmark's argument parser."""
    parser.add_argument("--data-kind", choices=DATA_KINDS, default=DEFAULT_KIND,
                        help="generated photos: ImageNet-like sizes, noise and encodings (default), or "
                             "one-photo, the clean crops of one photo the benchmarks used before round 4")


def data_root(base: str, kind: str, n: int) -> str:
    """Where a benchmark keeps ``n`` generated photos of ``kind`` under ``base``."""
    return os.path.join(base, f"photos-{kind}-{n}")


def _sources() -> tuple[list[np.ndarray], list[np.ndarray]]:
    import cv2

    try:
        import skimage
    except ImportError as e:   # pragma: no cover - the Makefile installs it
        raise SystemExit("the imagenet-like benchmark photos need scikit-image's sample photos: "
                         "pip install -r requirements-test.txt (or --data-kind one-photo)") from e
    from loaderlib._sample import sample_photo_bgr

    folder = os.path.join(os.path.dirname(skimage.__file__), "data")
    colour = [sample_photo_bgr()]
    for f in COLOUR:
        img = cv2.imread(os.path.join(folder, f), cv2.IMREAD_COLOR)
        if img is None:
            raise SystemExit(f"cannot read scikit-image's sample photo {f!r} in {folder}")
        colour.append(img)
    grey = []
    for f in GREY:
        img = cv2.imread(os.path.join(folder, f), cv2.IMREAD_GRAYSCALE)
        if img is None:
            raise SystemExit(f"cannot read scikit-image's sample photo {f!r} in {folder}")
        grey.append(img)
    return colour, grey


def _pick(rng: np.random.Generator, table: Sequence[tuple]) -> object:
    p = np.array([w for _, w in table], float)
    return table[int(rng.choice(len(table), p=p / p.sum()))][0]


def _size(rng: np.random.Generator) -> tuple[int, int]:
    aspect = float(_pick(rng, ASPECTS)) * float(rng.uniform(0.97, 1.03))
    # Most ImageNet photos are 500 px on their long side; the rest spread around it.
    r = rng.random()
    long = 500 if r < 0.6 else int(rng.integers(400, 500)) if r < 0.8 else int(rng.integers(501, 800))
    if aspect >= 1:
        w, h = long, round(long / aspect)
    else:
        w, h = round(long * aspect), long
    return max(64, w), max(64, h)


def _noise(rng: np.random.Generator, img: np.ndarray, strength: float) -> np.ndarray:
    """Camera-like detail and noise: an unsharp mask (cameras sharpen; the crops here are
    upscaled, so softer than a downscaled camera file), then shot noise that grows with the
    square root of brightness plus read noise, mostly luminance, blurred a little
    (demosaicking and in-camera denoising correlate neighbours)."""
    import cv2

    f = img.astype(np.float32)
    f += SHARPEN * (f - cv2.GaussianBlur(f, (0, 0), 1.2))
    sigma = strength * (0.35 + np.sqrt(np.clip(f, 0, 255) / 255.0))
    if img.ndim == 3:
        n = rng.standard_normal(img.shape[:2] + (1,), dtype=np.float32)
        n = n + 0.35 * rng.standard_normal(img.shape, dtype=np.float32)
    else:
        n = rng.standard_normal(img.shape, dtype=np.float32)
    n = cv2.GaussianBlur(n, (3, 3), 0.5) * NOISE_GAIN
    return np.clip(f + sigma * n.reshape(f.shape), 0, 255).astype(np.uint8)


def _imagenet_like(rng: np.random.Generator, colour: list, grey: list) -> tuple[bytes, dict]:
    import cv2
    from _synth import encode_jpeg

    w, h = _size(rng)
    is_grey = rng.random() < GREY_SHARE
    if is_grey or rng.random() < 0.25:
        src = grey[int(rng.integers(len(grey)))]
    else:
        src = colour[int(rng.integers(len(colour)))]
    H, W = src.shape[:2]
    # A crop of the source with the target's aspect ratio, 35%-100% of its largest such box.
    aspect = w / h
    cw0, ch0 = (W, round(W / aspect)) if W / H < aspect else (round(H * aspect), H)
    cw0, ch0 = min(W, max(8, cw0)), min(H, max(8, ch0))
    s = float(np.sqrt(rng.uniform(0.35, 1.0)))
    cw, ch = max(8, round(cw0 * s)), max(8, round(ch0 * s))
    x, y = int(rng.integers(0, W - cw + 1)), int(rng.integers(0, H - ch + 1))
    img = src[y:y + ch, x:x + cw]
    if rng.random() < 0.5:
        img = img[:, ::-1]
    interp = cv2.INTER_AREA if w < cw else cv2.INTER_CUBIC
    img = cv2.resize(np.ascontiguousarray(img), (w, h), interpolation=interp)
    if img.ndim == 2 and not is_grey:
        # A grey source in colour: a random tint, so it is no grayscale file in disguise.
        tint = rng.uniform(0.75, 1.15, size=3).astype(np.float32)
        img = np.clip(img[:, :, None].astype(np.float32) * tint, 0, 255).astype(np.uint8)
    elif img.ndim == 3:
        gain = rng.uniform(0.85, 1.15, size=3).astype(np.float32)
        img = np.clip(img.astype(np.float32) * gain + rng.uniform(-12, 12), 0, 255).astype(np.uint8)
    img = _noise(rng, img, float(rng.uniform(*NOISE)))
    quality = int(_pick(rng, QUALITIES))
    sampling = str(_pick(rng, SAMPLINGS))
    progressive = bool(rng.random() < PROGRESSIVE_SHARE)
    data = encode_jpeg(img, quality=quality, sampling=sampling, progressive=progressive)
    return data, {"quality": quality}


def _one_photo(rng: np.random.Generator, photo: np.ndarray) -> bytes:
    """The pre-round-4 benchmark image: a crop of the one sample photo, quality 90, 4:2:0."""
    import cv2

    h, w = int(rng.integers(250, 512)), int(rng.integers(250, 600))
    y, x = int(rng.integers(0, 513 - h)), int(rng.integers(0, 601 - w))
    img = photo[y:y + h, x:x + w]
    tw = int(rng.integers(400, 520))
    th = round(tw * rng.uniform(0.66, 0.8)) if rng.random() < 0.8 else round(tw * rng.uniform(1.2, 1.4))
    img = cv2.resize(img, (tw, th), interpolation=cv2.INTER_AREA)
    if rng.random() < 0.5:
        img = img[:, ::-1]
    shift = rng.integers(-25, 26, size=3)
    img = np.clip(img.astype(np.int16) + shift, 0, 255).astype(np.uint8)
    ok, buf = cv2.imencode(".JPEG", img, [cv2.IMWRITE_JPEG_QUALITY, 90])
    if not ok:
        raise RuntimeError("cv2.imencode failed")
    return buf.tobytes()


def jpegs(n: int, kind: str = DEFAULT_KIND, seed: int = 0) -> list[bytes]:
    """``n`` generated JPEGs of ``kind``, in memory (deterministic)."""
    if kind not in DATA_KINDS:
        raise ValueError(f"data kind {kind!r}: expected one of {', '.join(DATA_KINDS)}")
    rng = np.random.default_rng(seed)
    if kind == "one-photo":
        from loaderlib._sample import sample_photo_bgr

        photo = sample_photo_bgr()
        return [_one_photo(rng, photo) for _ in range(n)]
    colour, grey = _sources()
    return [_imagenet_like(rng, colour, grey)[0] for _ in range(n)]


def make_photos(root: str, n: int, kind: str = DEFAULT_KIND, classes: int = 8) -> str:
    """An ImageFolder of ``n`` generated JPEGs of ``kind`` in ``classes`` class folders under
    ``root`` (made once: a marker file records that ``n`` were written). Deterministic."""
    if kind not in DATA_KINDS:
        raise ValueError(f"data kind {kind!r}: expected one of {', '.join(DATA_KINDS)}")
    marker = os.path.join(root, f".complete-{n}")
    if os.path.exists(marker):
        return root
    rng = np.random.default_rng(0)
    for c in range(classes):
        os.makedirs(os.path.join(root, f"n{c:08d}"), exist_ok=True)
    if kind == "one-photo":
        from loaderlib._sample import sample_photo_bgr

        photo = sample_photo_bgr()
        make = lambda: _one_photo(rng, photo)  # noqa: E731
    else:
        colour, grey = _sources()
        make = lambda: _imagenet_like(rng, colour, grey)[0]  # noqa: E731
    for i in range(n):
        data = make()
        with open(os.path.join(root, f"n{i % classes:08d}", f"img_{i:06d}.JPEG"), "wb") as f:
            f.write(data)
    open(marker, "w").close()
    return root


# --------------------------------------------------------------------------- statistics


def jpeg_header(data: bytes) -> dict | None:
    """Width, height, components, chroma subsampling and progressiveness from a JPEG's frame
    header (None if there is none)."""
    i, end = 2, len(data)
    if data[:2] != b"\xff\xd8":
        return None
    while i + 4 <= end:
        if data[i] != 0xFF:
            i += 1
            continue
        marker = data[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            i += 1 if marker == 0xFF else 2
            continue
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            nc = data[i + 9]
            factors = [(data[i + 11 + 3 * c] >> 4, data[i + 11 + 3 * c] & 15) for c in range(nc)]
            if nc == 1:
                sampling = "gray"
            elif nc == 3:
                (hy, vy), (hc, vc) = factors[0], factors[1]
                sampling = {(1, 1): "444", (2, 1): "422", (2, 2): "420", (1, 2): "440"}.get(
                    (hy // max(1, hc), vy // max(1, vc)), f"{hy}x{vy}")
            else:
                sampling = f"{nc} comp"
            return {"width": w, "height": h, "components": nc, "sampling": sampling,
                    "progressive": marker in (0xC2, 0xC6, 0xCA, 0xCE)}
        i += 2 + length
    return None


def _files(root_or_paths: str | Sequence[str]) -> list[str]:
    if isinstance(root_or_paths, str):
        out = []
        for d, _dirs, files in os.walk(root_or_paths):
            out += [os.path.join(d, f) for f in files if f.lower().endswith((".jpg", ".jpeg"))]
        return sorted(out)
    return list(root_or_paths)


def _blobs(data: str | Sequence[str] | Sequence[bytes]):
    if isinstance(data, str):
        data = _files(data)
    for item in data:
        if isinstance(item, bytes):
            yield item
        else:
            with open(item, "rb") as f:
                yield f.read()


def stats(data: str | Sequence[str] | Sequence[bytes]) -> dict:
    """The statistics :func:`describe` prints, as numbers, of a folder of JPEGs, a list of
    paths or a list of encoded images."""
    sizes, widths, heights, shorts = [], [], [], []
    sampling: Counter = Counter()
    progressive = 0
    for data in _blobs(data):
        sizes.append(len(data))
        hdr = jpeg_header(data)
        if hdr is None:
            sampling["not a JPEG"] += 1
            continue
        widths.append(hdr["width"])
        heights.append(hdr["height"])
        shorts.append(min(hdr["width"], hdr["height"]))
        sampling[hdr["sampling"]] += 1
        progressive += hdr["progressive"]
    return {"files": len(sizes), "sizes": np.array(sizes), "widths": np.array(widths),
            "heights": np.array(heights), "shorts": np.array(shorts), "sampling": sampling,
            "progressive": progressive}


def describe(data: str | Sequence[str] | Sequence[bytes], kind: str | None = None) -> str:
    """A few lines on a folder of JPEGs (or a list of paths or encoded images): file size
    median and mean, dimension quartiles, chroma subsampling mix, grayscale and progressive
    counts."""
    s = stats(data)
    n = s["files"]
    if not n:
        return "data: no JPEG files"

    def q(a: np.ndarray) -> str:
        if not a.size:
            return "-"
        return "/".join(str(int(v)) for v in np.percentile(a, [25, 50, 75]))

    kb = s["sizes"] / 1000
    mix = ", ".join(f"{k} {100 * v / n:.0f}%" for k, v in s["sampling"].most_common())
    what = f" ({kind})" if kind else ""
    return (f"data{what}: {n} JPEGs, file size median {np.median(kb):.0f} KB, mean {kb.mean():.0f} KB "
            f"(p10 {np.percentile(kb, 10):.0f}, p90 {np.percentile(kb, 90):.0f})\n"
            f"      width q1/median/q3 {q(s['widths'])}, height {q(s['heights'])}, short side {q(s['shorts'])} px; "
            f"subsampling {mix}; {s['progressive']} progressive")


def photos_for(args, n: int, base: str) -> str:
    """The folder a benchmark runs on: ``args.data`` if given, else ``n`` generated photos of
    ``args.data_kind`` under ``base`` (made once). Prints :func:`describe` of it."""
    if getattr(args, "data", None):
        root, kind = args.data, "--data"
    else:
        kind = getattr(args, "data_kind", DEFAULT_KIND)
        root = make_photos(data_root(base, kind, n), n, kind)
    print(describe(root, kind), flush=True)
    return root
