"""Write the fused chains the native fuzzer runs as C initialisers of ``ll_plan`` (``make fuzz``).

Usage::

    python fuzz/gen_native_plans.py build/fuzz-native/fuzz_plans.h

NOTE [ Fuzzed plans come from compile_chain ]
The harness in fuzz/native_fuzz.c must drive ``ll_chain_run`` with plans the library can
actually build, not with field values of its own invention: an ``ll_plan`` that
``compile_chain`` would never produce can fail in ways no user can reach, and a hand-written
copy of the op and augmentation encodings would drift from ``loaderlib/transforms/``. So
each chain below is compiled by ``loaderlib._chain.compile_chain`` itself, the arguments it
hands to ``_chain.CompiledChain`` are recorded, and they are written out field by field
the way ``CompiledChain.__cinit__`` (pyx/_chain.pyx) fills the struct: ops, decode
options, the lookup table in the slot for its dtype, the augmentation and erasing ops.
The chains together reach every geometric op, every output dtype and layout, every
interpolation, DCT scaling on and off, the fast decode, both strictness levels and every
augmentation kind.
"""

from __future__ import annotations

import inspect
import math
import sys

import numpy as np

from loaderlib import transforms as T
from loaderlib._chain import compile_chain
from loaderlib._ext import _chain

_NORM = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
#: max_pixels of the chains (NOTE [ Fuzzing pixel budget ] in fuzz/native_fuzz.c).
_MAX_PX = 1 << 20

#: (name, chain). The first is fuzz/fuzz_decode.py's chain (with the native harness's max_pixels).
CHAINS = [
    ("RandomResizedCrop(16) + flip + Normalize + ToCHW (float32 CHW)",
     T.Compose([T.Decode(max_pixels=_MAX_PX), T.RandomResizedCrop(16), T.RandomHorizontalFlip(),
                T.Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)), T.ToCHW()])),
    ("GRAY strict: Resize(24) + CenterCrop(16) (uint8 HWC, no table)",
     T.Compose([T.Decode(mode="GRAY", strict=True, max_pixels=_MAX_PX), T.Resize(24), T.CenterCrop(16)])),
    ("BGR fast: Resize((20, 30), area) + RandomResizedCrop(12, nearest) + flip + Normalize float16 (2 stages)",
     T.Compose([T.Decode(mode="BGR", fast=True, max_pixels=_MAX_PX), T.Resize((20, 30), interpolation="area"),
                T.RandomResizedCrop(12, interpolation="nearest", antialias=False), T.RandomHorizontalFlip(p=1.0),
                T.Normalize(_NORM[0], _NORM[1], dtype="float16")])),
    ("no DCT scaling, strict=False: RandomResizedCrop(24) + every pixel augmentation + ToCHW + RandomErasing",
     T.Compose([T.Decode(dct_scaling=False, strict=False, max_pixels=1 << 16), T.RandomResizedCrop(24),
                T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(0.5), T.GaussianBlur(3),
                T.TrivialAugmentWide(), T.RandomRotation(20),
                T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=5),
                T.RandomCrop(16, padding=2, padding_mode="reflect"), T.ToCHW(), T.RandomErasing(p=1.0)])),
    ("CenterCrop(40) (pads) + Resize(8, nearest) + RandAugment + AutoAugment + RandomCrop(12, pad) + bfloat16 CHW",
     T.Compose([T.Decode(max_pixels=_MAX_PX), T.CenterCrop(40), T.Resize(8, interpolation="nearest"),
                T.RandAugment(), T.AutoAugment(),
                T.RandomCrop(12, pad_if_needed=True, padding_mode="edge"),
                T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5), dtype="bfloat16"), T.ToCHW()])),
    ("fast, strict=False: RandomResizedCrop((10, 14), area) + Resize((9, 7)) + Normalize + RandomErasing(random)",
     T.Compose([T.Decode(fast=True, strict=False, max_pixels=_MAX_PX),
                T.RandomResizedCrop((10, 14), scale=(0.5, 1.0), interpolation="area"), T.Resize((9, 7)),
                T.Normalize(_NORM[0], _NORM[1]), T.RandomErasing(p=1.0, value="random")])),
    ("GRAY: RandomResizedCrop(20) + one-channel augmentations (bilinear, fill, padding) + float32 CHW + erasing",
     T.Compose([T.Decode(mode="GRAY", max_pixels=_MAX_PX), T.RandomResizedCrop(20, scale=(0.3, 1.0)),
                T.ColorJitter(0.3, 0.3), T.GaussianBlur(5, sigma=(0.5, 1.5)),
                T.RandomRotation(30, interpolation="bilinear", fill=7),
                T.RandomAffine(0, translate=(0.2, 0.2), interpolation="bilinear"),
                T.RandomCrop(18, padding=1, padding_mode="symmetric"), T.RandomCrop(14, padding=2, fill=9),
                T.Normalize((0.5,), (0.2,)), T.ToCHW(),
                T.RandomErasing(p=1.0, scale=(0.9, 0.99), ratio=(10.0, 20.0))])),
]


def _compiled_chain_args(ops, mode, channels, dct_scaling, strict, max_pixels, dtype, chw, lut, out_h, out_w,
                         augs=None, erases=None, fast=False) -> dict:
    """``_chain.CompiledChain``'s arguments by name (its signature, restated to bind them)."""
    return dict(inspect.getcallargs(_compiled_chain_args, ops, mode, channels, dct_scaling, strict, max_pixels,
                                    dtype, chw, lut, out_h, out_w, augs, erases, fast))


def record(chain: T.Compose) -> dict:
    """The arguments ``compile_chain(chain)`` passes to ``_chain.CompiledChain``."""
    calls = []
    real = _chain.CompiledChain

    def recorder(*args, **kwargs):
        calls.append(_compiled_chain_args(*args, **kwargs))
        return real(*args, **kwargs)

    _chain.CompiledChain = recorder
    try:
        plan = compile_chain(chain)
    finally:
        _chain.CompiledChain = real
    if plan is None or len(calls) != 1:
        raise SystemExit(f"gen_native_plans: {chain} does not compile to one native plan")
    return calls[0]


def _num(v: float) -> str:
    v = float(v)
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    return v.hex()


def _list(values) -> str:
    return "{" + ", ".join(values) + "}"


def _aug(op: tuple) -> str:
    kind, pos, ints, dbls = op
    ia = [int(v) for v in ints] + [0] * (8 - len(ints))
    da = [_num(v) for v in dbls] + ["0.0"] * (16 - len(dbls))
    return f"{{.kind = {kind}, .pos = {pos}, .ia = {_list(map(str, ia))}, .da = {_list(da)}}}"


def plan_c(a: dict) -> str:
    """One ``ll_plan`` initialiser, filled as ``CompiledChain.__cinit__`` fills the struct."""
    f = []
    ops = [f"{{.kind = {o[0]}, .pos = {o[1]}, .h = {o[2]}, .w = {o[3]}, .interp = {o[4]}, .antialias = {o[5]}, "
           f".s0 = {_num(o[6])}, .s1 = {_num(o[7])}, .r0 = {_num(o[8])}, .r1 = {_num(o[9])}, .p = {_num(o[10])}}}"
           for o in a["ops"]]
    f.append(f".nops = {len(ops)}")
    if ops:
        f.append(".ops = {\n        " + ",\n        ".join(ops) + "}")
    f.append(f".mode = {a['mode']}, .channels = {a['channels']}, .dct_scaling = {int(bool(a['dct_scaling']))}, "
             f".strict = {a['strict']}, .max_pixels = {a['max_pixels']}LL, .dtype = {a['dtype']}, "
             f".chw = {int(bool(a['chw']))}, .out_h = {a['out_h']}, .out_w = {a['out_w']}, "
             f".fast = {int(bool(a['fast']))}")
    lut = a["lut"]
    if lut is not None:
        flat = np.ascontiguousarray(lut).reshape(-1)
        if a["dtype"] == _chain.DTYPE_FLOAT32:
            f.append(".lutf = " + _list(_num(v) for v in flat.astype(np.float32).tolist()))
        elif a["dtype"] == _chain.DTYPE_UINT16:
            f.append(".lut16 = " + _list(str(int(v)) for v in flat.view(np.uint16).tolist()))
        else:
            f.append(".lut8 = " + _list(str(int(v)) for v in flat.astype(np.uint8).tolist()))
            f.append(".use_lut = 1")
    augs, erases = a["augs"] or [], a["erases"] or []
    aug = [f".n = {len(augs)}", f".nerase = {len(erases)}"]
    if augs:
        aug.append(".ops = {\n            " + ",\n            ".join(map(_aug, augs)) + "}")
    if erases:
        aug.append(".erase = {\n            " + ",\n            ".join(map(_aug, erases)) + "}")
    f.append(".aug = {" + ", ".join(aug) + "}")
    return "    {\n        " + ",\n        ".join(f) + "\n    }"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit(__doc__)
    plans = [plan_c(record(chain)) for _, chain in CHAINS]
    names = ",\n    ".join('"' + name.replace('"', "'") + '"' for name, _ in CHAINS)
    text = (
        "/* Generated by fuzz/gen_native_plans.py (NOTE [ Fuzzed plans come from compile_chain ]); do not edit. */\n"
        f"#define LL_FUZZ_NPLANS {len(plans)}\n"
        "static const ll_plan ll_fuzz_plans[LL_FUZZ_NPLANS] = {\n" + ",\n".join(plans) + "\n};\n"
        "static const char *const ll_fuzz_plan_names[LL_FUZZ_NPLANS] = {\n    " + names + "\n};\n"
    )
    with open(argv[0], "w") as fh:
        fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
