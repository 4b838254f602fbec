"""The per-item status codes (NOTE [ Status codes ] in pyx/include/ll_common.h): one table,
built from the header, that every kernel's codes reach Python through, and the one builder
that turns a code into a DecodeError."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from loaderlib import DecodeError
from loaderlib import transforms as T
from loaderlib._chain import compile_chain
from loaderlib._ext import _jpeg
from loaderlib.decoding import decode_batch
from tests.conftest import encode_jpeg, make_photo
from tests.kernels._loader_images import damaged

Status = _jpeg.Status

# Written out here, independently of the header: changing a code is a deliberate act.
EXPECTED = {"OK": 0, "WARNED": 1, "ERR_DECODE": -1, "ERR_EMPTY": -2, "ERR_NOT_JPEG": -3, "ERR_TOO_LARGE": -4,
            "ERR_SHAPE": -5, "ERR_CROP": -6, "ERR_STRICT": -7, "ERR_NOMEM": -8, "ERR_UNSUPPORTED": -9,
            "ERR_STATE": -10, "ERR_READ": -11}


def test_the_table_is_the_headers_list():
    assert {s.name: int(s) for s in Status} == EXPECTED
    assert all(s.message for s in Status)
    assert len({s.message for s in Status}) == len(Status)
    assert Status(-11) is Status.ERR_READ and Status.ERR_READ == -11
    assert pickle.loads(pickle.dumps(Status.ERR_STRICT)) is Status.ERR_STRICT


def test_each_code_the_decoder_writes_arrives_by_name():
    jpeg = encode_jpeg(make_photo(160, 120, seed=3), 90)
    items = [jpeg, b"", b"\xff\xd8\xff" + b"\x00" * 40, b"neither a JPEG nor any other image"]
    res = decode_batch(items, on_error="return", num_threads=2)
    assert [Status(int(s)) for s in res.status] == [Status.OK, Status.ERR_EMPTY, Status.ERR_DECODE,
                                                    Status.ERR_NOT_JPEG]
    assert res.errors[1].reason == Status.ERR_EMPTY.message   # the header's text, written by the kernel
    assert res.errors[3].index == 3 and "not a recognised image format" in res.errors[3].reason
    shape = decode_batch([jpeg, jpeg], out=[np.empty((120, 160, 3), np.uint8), np.empty((10, 10, 3), np.uint8)],
                         on_error="return")
    assert [Status(int(s)) for s in shape.status] == [Status.OK, Status.ERR_SHAPE]
    assert shape.errors[1].index == 1 and "output buffer is 10x10x3" in shape.errors[1].reason
    big = decode_batch([jpeg], max_pixels=100, on_error="return")
    assert big.status[0] == Status.ERR_TOO_LARGE and "max_pixels=100" in big.errors[0].reason
    crop = decode_batch([jpeg], crop=(150, 0, 20, 20), on_error="return")
    assert crop.status[0] == Status.ERR_CROP and "outside the 160x120 image" in crop.errors[0].reason
    with pytest.warns(UserWarning, match="corrupt data"):
        warned = decode_batch([damaged(encode_jpeg(make_photo(640, 480, seed=4), 90))], on_error="return")
    assert warned.status[0] == Status.WARNED and not warned.errors
    strict = decode_batch([damaged(encode_jpeg(make_photo(640, 480, seed=4), 90))], strict=True,
                          on_error="return")
    assert strict.status[0] == Status.ERR_STRICT
    assert strict.errors[0].reason.endswith("refused because strict=True")


def test_each_code_the_fused_chain_writes_arrives_by_name(tmp_path):
    plan = compile_chain(T.Compose([T.Resize((20, 24))]))
    good = tmp_path / "good.jpg"
    good.write_bytes(encode_jpeg(make_photo(64, 48, seed=1), 90))
    out = np.zeros((3, 20, 24, 3), np.uint8)
    st = plan.run_files_into([good, tmp_path / "missing.jpg", tmp_path], out, np.arange(3), seed=0, epoch=0,
                             num_threads=2)
    assert [Status(int(s)) for s in st.status] == [Status.OK, Status.ERR_READ, Status.ERR_READ]
    out = np.zeros((2, 20, 24, 3), np.uint8)
    st = plan.run_buffers_into([b"", b"\x89PNG\r\n\x1a\n" + b"\x00" * 8], out, np.arange(2), seed=0, epoch=0,
                               num_threads=1)
    # the empty item fails in the kernel; the cut PNG in the OpenCV fallback (a decode error)
    assert [Status(int(s)) for s in st.status] == [Status.ERR_EMPTY, Status.ERR_DECODE]
    assert st.errors[0].reason == Status.ERR_EMPTY.message and st.errors[1].index == 1


def test_from_status_is_the_one_builder():
    e = DecodeError.from_status(Status.ERR_READ, "", index=7, source="a.jpg")
    assert (e.reason, e.index, e.source) == (Status.ERR_READ.message, 7, "a.jpg")
    assert str(e) == "cannot decode item 7 'a.jpg': read failed"
    assert DecodeError.from_status(Status.ERR_DECODE, "Not a JPEG file").reason == "Not a JPEG file"
    e = DecodeError.from_status(Status.ERR_STRICT, "Corrupt JPEG data")
    assert e.reason == "corrupt data (Corrupt JPEG data); refused because strict=True"
    assert DecodeError.from_status(Status.ERR_STRICT, "").reason == Status.ERR_STRICT.message
    assert DecodeError.from_status(-99, "").reason == "unknown decoder status -99"
    assert DecodeError.from_status(-99, "why").reason == "why"
    assert pickle.loads(pickle.dumps(e)).reason == e.reason
