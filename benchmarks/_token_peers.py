"""One system of benchmarks/tokens.py, run as a child process that the benchmark drives.

Runs in loaderlib's environment (``loaderlib``, ``numpy``, ``nanogpt``) or in the peers'
virtualenv (``litdata``, ``megatron``, ``megatron-blend``, ``grain-concat``, ``grain-pack``,
``hf``), so it imports nothing of loaderlib or of benchmarks/ at module level: numpy only.

Protocol (JSON lines): the child builds its loader, checks its first batch
(:func:`check_batch`: the same work for every system) and prints
``{"ready": ..., "setup_s": ..., "bytes_per_token": ...}``; then each ``{"run": N}`` on stdin is
answered with ``{"tokens": ..., "wall": ..., "cpu": ...}`` for N more batches, where ``cpu``
is the process's CPU time (all its threads) since the end of the previous answer, so work a
loader does ahead while another system is measured is charged to it; ``{"quit": 1}`` ends.

Every system hands back, per batch: ``input_ids`` and ``labels`` (labels = the next token)
as int32 ``(B, S)``, ``position_ids`` int32 restarting at 0 after every end-of-document token
(and at each row's start), ``cu_seqlens`` int32 (each segment's flat start, then ``B * S``)
and ``max_seqlen``. nanoGPT's ``get_batch`` alone does what nanoGPT does (int64, no
boundaries): it is reported as users run it.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np


def log(*a) -> None:
    print(*a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- corpus files


def read_idx(prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """Lengths and token starts of the documents of a Megatron ``PREFIX.idx`` (uint16 tokens)."""
    with open(prefix + ".idx", "rb") as f:
        head = f.read(34)
    assert head[:9] == b"MMIDIDX\x00\x00" and head[17] == 8, "a uint16 Megatron index"
    n = int(np.frombuffer(head, np.uint64, 1, 18)[0])
    mm = np.memmap(prefix + ".idx", np.uint8, "r")
    lens = np.frombuffer(mm, np.int32, n, 34).astype(np.int64)
    ptr = np.frombuffer(mm, np.int64, n, 34 + 4 * n) // 2
    return lens, ptr


# --------------------------------------------------------------------------- the shared check


def check_batch(b: dict, eos: int, mode: str = "concat") -> None:
    """Assert that a batch holds the work every system must do (NOTE in the module docstring)."""
    ids, lab, pos, cu = b["input_ids"], b["labels"], b["position_ids"], b["cu_seqlens"]
    for k in ("input_ids", "labels", "position_ids", "cu_seqlens"):
        a = np.asarray(b[k])
        assert a.dtype == np.int32, f"{k} is {a.dtype}, not int32"
    ids, lab, pos, cu = (np.asarray(x) for x in (ids, lab, pos, cu))
    B, S = ids.shape
    assert lab.shape == pos.shape == (B, S)
    want = np.empty_like(pos)
    for r in range(B):
        p = 0
        for j in range(S):
            if j and ids[r, j - 1] == eos:
                p = 0
            want[r, j] = p
            p += 1
    assert cu[0] == 0 and cu[-1] == B * S and (np.diff(cu) > 0).all(), "cu_seqlens are not segment starts"
    assert int(b["max_seqlen"]) == int(np.diff(cu).max())
    if mode == "concat":   # packed rows differ by system in their padding: only the layout is checked
        assert (lab[:, :-1] == ids[:, 1:]).all(), "labels are not the next tokens"
        assert (pos == want).all(), "position_ids do not restart after each end of document"
        starts = np.flatnonzero(pos.ravel() == 0)
        assert np.array_equal(cu, np.append(starts, B * S)), "cu_seqlens do not match position_ids"


# --------------------------------------------------------------------------- boundaries as users add them


def finish_numpy(ids: np.ndarray, labels: np.ndarray, eos: int, pos: np.ndarray | None = None,
                 eq: np.ndarray | None = None, _ar: dict = {}) -> dict:  # noqa: B006
    """position_ids, cu_seqlens and max_seqlen of int32 ``(B, S)`` rows, vectorized numpy: the
    segment starts (row starts and tokens after an end of document) sorted once, then
    position = index - the start of its segment (``np.repeat`` of the starts): about 2 G tokens
    per CPU-second here, 6x the running-maximum form (``np.maximum.accumulate``). ``pos``
    (``(B, S)`` int32) and ``eq`` (``B * S - 1`` bool) are optional preallocated outputs."""
    B, S = ids.shape
    n = B * S
    ar = _ar.get(n)
    if ar is None:
        ar = _ar[n] = np.arange(n, dtype=np.int32)
    flat = ids.reshape(-1)
    eq = np.equal(flat[:-1], eos, out=eq)
    starts = np.concatenate([np.flatnonzero(eq) + 1, np.arange(0, n, S)])
    starts.sort()
    starts = starts[np.concatenate([[True], starts[1:] != starts[:-1]])]
    cu = np.empty(starts.size + 1, np.int32)
    cu[:-1] = starts
    cu[-1] = n
    seg = np.diff(cu)
    pos = np.subtract(ar, np.repeat(cu[:-1], seg), out=None if pos is None else pos.reshape(-1)).reshape(B, S)
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "cu_seqlens": cu, "max_seqlen": int(seg.max())}


def finish_torch_sample(x, eos: int):
    """One sample of S + 1 tokens (a torch tensor) -> int32 ids, labels, positions, in torch, as
    a user adds per-document positions to LitData's or Hugging Face's samples."""
    import torch

    ids = x[:-1].to(torch.int32)
    labels = x[1:].to(torch.int32)
    S = ids.shape[0]
    idx = torch.arange(S, dtype=torch.int32)
    start = torch.zeros(S, dtype=torch.bool)
    start[0] = True
    start[1:] = ids[:-1] == eos
    pos = idx - torch.cummax(torch.where(start, idx, torch.zeros_like(idx)), 0).values
    return ids, labels, pos


def cu_from_positions_torch(pos) -> tuple:
    import torch

    starts = torch.nonzero(pos.reshape(-1) == 0).reshape(-1).to(torch.int32)
    cu = torch.cat([starts, torch.tensor([pos.numel()], dtype=torch.int32)])
    return cu, int((cu[1:] - cu[:-1]).max())


def collate_torch(samples, eos: int) -> dict:
    import torch

    parts = [finish_torch_sample(x, eos) for x in samples]
    ids = torch.stack([p[0] for p in parts])
    lab = torch.stack([p[1] for p in parts])
    pos = torch.stack([p[2] for p in parts])
    cu, mx = cu_from_positions_torch(pos)
    return {"input_ids": ids, "labels": lab, "position_ids": pos, "cu_seqlens": cu, "max_seqlen": mx}


def as_numpy(b: dict) -> dict:
    return {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in b.items()}


# --------------------------------------------------------------------------- systems
# Each returns (a function giving the next batch dict, notes); the batch holds B * S tokens.


def _cycling(loader, quiet: bool = False):
    """``next()`` over ``loader``'s epochs, one after another (``quiet``: no warnings)."""
    import warnings

    state = {"it": None}

    def nxt():
        with warnings.catch_warnings():
            if quiet:
                warnings.simplefilter("ignore")
            if state["it"] is None:
                state["it"] = iter(loader)
            try:
                return next(state["it"])
            except StopIteration:
                state["it"] = iter(loader)
                return next(state["it"])

    return nxt


def sys_loaderlib(cfg: dict):
    import loaderlib as ll
    from loaderlib.datasets import TokenDataset

    packing = cfg.get("packing", "concat")
    # concat rows shuffle across the corpus in the loader; packed rows shuffle in blocks, in the
    # dataset (NOTE [ Shuffling in blocks ] in loaderlib/_datasets/tokens/dataset.py)
    ds = TokenDataset(cfg["prefix"], cfg["seq_len"], packing=packing, shuffle=packing != "concat")
    loader = ll.DataLoader(ds, batch_size=cfg["batch"], shuffle=packing == "concat", num_threads=cfg.get("threads", 1),
                           seed=0)
    return _cycling(loader), f"loaderlib {ll.__version__}, {loader.engine} engine, {cfg.get('threads', 1)} thread(s)"


def sys_loaderlib_kernel(cfg: dict):
    """The row kernel alone: ``TokenDataset.gather_into`` of shuffled rows into one reused set of
    batch parts, one thread, from Python in a loop (no loader, no threads, no hand-offs): what
    the ``DataLoader`` adds is the difference to ``loaderlib``."""
    import loaderlib as ll
    from loaderlib.datasets import TokenDataset

    ds = TokenDataset(cfg["prefix"], cfg["seq_len"])
    parts = [np.zeros(shape, dt) for shape, dt in ds.token_parts(cfg["batch"])]
    order = np.random.default_rng(0).permutation(len(ds))
    state = {"at": 0}

    def nxt():
        a = state["at"]
        if a + cfg["batch"] > order.size:
            a = 0
        state["at"] = a + cfg["batch"]
        ds.gather_into(order[a:a + cfg["batch"]], parts, num_threads=1)
        return ds.token_batch(parts, cfg["batch"])

    return nxt, f"loaderlib {ll.__version__}, TokenDataset.gather_into in a loop, 1 thread"


def sys_loaderlib_pack_loader_shuffle(cfg: dict):
    """``packing="pack"`` shuffled by the loader across the corpus (``DataLoader(shuffle=True)``),
    not in the dataset: what NOTE [ Shuffling in blocks ] warns against, measured."""
    import loaderlib as ll
    from loaderlib.datasets import TokenDataset

    ds = TokenDataset(cfg["prefix"], cfg["seq_len"], packing="pack")
    loader = ll.DataLoader(ds, batch_size=cfg["batch"], shuffle=True, num_threads=1, seed=0)
    # quiet: the warning says what this system measures
    return _cycling(loader, quiet=True), f"loaderlib {ll.__version__}, packing='pack', the loader's global shuffle, 1 thread"


def sys_numpy(cfg: dict):
    """nanoGPT-style memmap windows, made as fast as numpy reasonably allows: the windows of a
    shuffled permutation of rows, each row's ids and labels converted to int32 straight from
    the mapping (a plain ndarray view: slicing a np.memmap costs microseconds a row), one pass
    each, no int64 index arrays, then :func:`finish_numpy`. The outputs cycle through a ring of
    3 preallocated sets (a batch stays valid while the next two are made), as loaderlib's batches
    live in reused arena slots: fresh 512 KiB arrays per batch cost a page fault per 4 KiB on
    this machine (about 480 a batch), which ``numpy-fancy`` keeps, as most code does."""
    S, B, eos = cfg["seq_len"], cfg["batch"], cfg["eos"]
    data = np.asarray(np.memmap(cfg["prefix"] + ".bin", np.uint16, "r"))
    rows = (data.size - 1) // S
    rng = np.random.default_rng(0)
    ring = [tuple(np.empty((B, S), np.int32) for _ in range(3)) for _ in range(3)]
    eq = np.empty(B * S - 1, np.bool_)
    state = {"perm": rng.permutation(rows), "at": 0, "k": 0}

    def nxt():
        if state["at"] + B > rows:
            state["perm"], state["at"] = rng.permutation(rows), 0
        sel = state["perm"][state["at"]:state["at"] + B]
        state["at"] += B
        ids, lab, pos = ring[state["k"] % 3]
        state["k"] += 1
        for r, i in enumerate(sel.tolist()):
            g = i * S
            ids[r] = data[g:g + S]
            lab[r] = data[g + 1:g + S + 1]
        return finish_numpy(ids, lab, eos, pos, eq)

    return nxt, f"numpy {np.__version__}"


def sys_numpy_fancy(cfg: dict):
    """The textbook vectorized version: one fancy-indexing gather of (B, S + 1) windows with an
    int64 index array, astype int32, then :func:`finish_numpy`."""
    S, B, eos = cfg["seq_len"], cfg["batch"], cfg["eos"]
    data = np.memmap(cfg["prefix"] + ".bin", np.uint16, "r")
    rows = (data.size - 1) // S
    rng = np.random.default_rng(0)
    offs = np.arange(S + 1, dtype=np.int64)

    def nxt():
        sel = rng.integers(0, rows, B) * S
        w = data[sel[:, None] + offs].astype(np.int32)
        return finish_numpy(np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:]), eos)

    return nxt, f"numpy {np.__version__}"


def sys_nanogpt(cfg: dict):
    """nanoGPT's train.py get_batch, as written there (a fresh memmap per batch, int64, CPU)."""
    import torch

    S, B = cfg["seq_len"], cfg["batch"]
    path = cfg["prefix"] + ".bin"
    torch.manual_seed(0)

    def get_batch():
        data = np.memmap(path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - S, (B,))
        x = torch.stack([torch.from_numpy((data[i:i + S]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1:i + 1 + S]).astype(np.int64)) for i in ix])
        return {"input_ids": x, "labels": y}

    return get_batch, f"torch {torch.__version__}; int64, no position_ids or cu_seqlens"


def sys_litdata(cfg: dict):
    import litdata
    import torch
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.item_loader import TokensLoader

    S, B, eos = cfg["seq_len"], cfg["batch"], cfg["eos"]
    ds = StreamingDataset(cfg["litdata_dir"], item_loader=TokensLoader(block_size=S + 1), shuffle=True,
                          drop_last=True, seed=0)
    loader = StreamingDataLoader(ds, batch_size=B, num_workers=0, drop_last=True,
                                 collate_fn=lambda xs: collate_torch(xs, eos))
    state = {"it": iter(loader)}

    def nxt():
        try:
            return next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            return next(state["it"])

    return nxt, (f"litdata {litdata.__version__}, torch {torch.__version__}; {len(ds)} samples of "
                 f"{cfg['litdata_tokens'] / 1e6:.0f} M tokens optimized into chunks, num_workers=0")


class _Tok:
    """The tokenizer stub Megatron-Core's GPTDataset asks for: only ``eod`` (and ``pad``) is read."""

    def __init__(self, eos: int) -> None:
        self.vocab_size = 50257
        self.eod = eos
        self.pad = eos
        self.unique_identifiers = {"class": "stub", "eod": eos}


def _megatron_config(cfg: dict, blend):
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    kw = dict(random_seed=0, sequence_length=cfg["seq_len"], blend=blend, split="100,0,0",
              path_to_cache=cfg["cache"], reset_position_ids=True, reset_attention_mask=False,
              eod_mask_loss=True, tokenizer=_Tok(cfg["eos"]))
    import dataclasses

    names = {f.name for f in dataclasses.fields(GPTDatasetConfig)}
    if "create_attention_mask" in names:
        kw["create_attention_mask"] = False   # no S x S mask: varlen attention takes cu_seqlens
    if "mid_level_dataset_surplus" in names:
        kw["mid_level_dataset_surplus"] = 0.005
    return GPTDatasetConfig(**kw)


def _megatron(cfg: dict, blend, n_samples: int):
    import megatron.core
    import torch
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset

    if not torch.distributed.is_initialized():   # BlendedDataset asks for the rank: one process, gloo
        import tempfile

        torch.distributed.init_process_group("gloo", init_method="file://" + tempfile.mktemp(prefix="ll-megatron-"),
                                             rank=0, world_size=1)
    conf = _megatron_config(cfg, blend)
    sizes = [n_samples, None, None] if blend[1] is None else [n_samples, 0, 0]   # weights need sizes
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, conf).build()
    B = cfg["batch"]

    def collate(samples):
        b = torch.utils.data.default_collate(samples)
        pos = b["position_ids"].to(torch.int32)
        cu, mx = cu_from_positions_torch(pos)
        return {"input_ids": b["tokens"].to(torch.int32), "labels": b["labels"].to(torch.int32),
                "position_ids": pos, "cu_seqlens": cu, "max_seqlen": mx}

    loader = torch.utils.data.DataLoader(train, batch_size=B, shuffle=False, num_workers=0, drop_last=True,
                                         collate_fn=collate)   # GPTDataset's shuffle index orders the samples
    state = {"it": iter(loader)}

    def nxt():
        try:
            return next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            return next(state["it"])

    return nxt, f"megatron-core {megatron.core.__version__}, {type(train).__name__} of {len(train)} samples"


def sys_megatron(cfg: dict):
    return _megatron(cfg, ([cfg["prefix"]], None), cfg["samples"])


def sys_megatron_blend(cfg: dict):
    w = cfg["mix_weights"]
    return _megatron(cfg, ([cfg["prefix"], cfg["prefix_b"]], list(w)), cfg["samples"])


def sys_loaderlib_mix(cfg: dict):
    import loaderlib as ll
    from loaderlib.datasets import TokenDataset

    S = cfg["seq_len"]
    a = TokenDataset(cfg["prefix"], S)
    b = TokenDataset(cfg["prefix_b"], S)
    mix = ll.MixtureDataset([a, b], weights=list(cfg["mix_weights"]), seed=0)
    loader = ll.DataLoader(mix, batch_size=cfg["batch"], shuffle=True, num_threads=1, seed=0)
    nxt = _cycling(loader)

    return nxt, f"loaderlib {ll.__version__}, MixtureDataset of two TokenDatasets, {loader.engine} engine, 1 thread"


class _Docs:
    """The corpus's documents as a random-access source for Grain (a view of the memmap each);
    with ``piece``, documents longer than ``piece`` tokens are cut into pieces of at most that
    (Grain's packing refuses longer inputs; loaderlib's ``pack`` splits them the same way)."""

    def __init__(self, prefix: str, piece: int | None = None) -> None:
        self.data = np.memmap(prefix + ".bin", np.uint16, "r")
        self.lens, self.ptr = read_idx(prefix)
        if piece:
            k = -(-self.lens // piece)
            doc = np.repeat(np.arange(self.lens.size), k)
            j = np.arange(doc.size) - np.repeat(np.cumsum(k) - k, k)
            self.ptr = self.ptr[doc] + j * piece
            self.lens = np.minimum(piece, self.lens[doc] - j * piece)

    def __len__(self) -> int:
        return self.lens.size

    def __getitem__(self, i: int) -> dict:
        p = int(self.ptr[i])
        return {"tokens": np.asarray(self.data[p:p + int(self.lens[i])], np.int32)}


def _grain(cfg: dict, pack: bool):
    import grain
    import grain.experimental as gx

    S, B, eos = cfg["seq_len"], cfg["batch"], cfg["eos"]
    src = _Docs(cfg["prefix"], S + 1 if pack else None)
    docs = grain.MapDataset.source(src).shuffle(seed=0).repeat().to_iter_dataset()
    if pack:
        packed = gx.FirstFitPackIterDataset(docs, length_struct={"tokens": S + 1}, num_packing_bins=B, seed=0)
    else:
        packed = gx.ConcatThenSplitIterDataset(docs, length_struct={"tokens": S + 1})
    it = iter(packed.batch(B))

    def nxt():
        b = next(it)
        t = b["tokens"]
        ids = np.ascontiguousarray(t[:, :-1], np.int32)
        lab = np.ascontiguousarray(t[:, 1:], np.int32)
        if pack:   # Grain gives segment ids and positions: cu_seqlens from its positions
            pos = np.ascontiguousarray(b["tokens_positions"][:, :-1], np.int32)
            starts = np.flatnonzero(pos.reshape(-1) == 0).astype(np.int32)
            cu = np.append(starts, np.int32(pos.size))
            return {"input_ids": ids, "labels": lab, "position_ids": pos, "cu_seqlens": cu,
                    "max_seqlen": int(np.diff(cu).max())}
        return finish_numpy(ids, lab, eos)

    how = "first-fit packing (FirstFitPackIterDataset)" if pack else "concat-then-split (ConcatThenSplitIterDataset)"
    return nxt, f"grain {getattr(grain, '__version__', '?')}; {how} of shuffled documents"


def sys_grain_concat(cfg: dict):
    return _grain(cfg, pack=False)


def sys_grain_pack(cfg: dict):
    return _grain(cfg, pack=True)


def sys_hf(cfg: dict):
    """Hugging Face datasets: run_clm's group_texts map (block S + 1), then a torch DataLoader over
    the grouped rows (torch format), positions and cu_seqlens added in the collate function."""
    import datasets
    import torch
    from datasets import load_from_disk

    eos = cfg["eos"]
    ds = load_from_disk(cfg["hf_dir"]).with_format("torch")
    loader = torch.utils.data.DataLoader(ds, batch_size=cfg["batch"], shuffle=True, num_workers=0, drop_last=True,
                                         collate_fn=lambda rows: collate_torch([r["input_ids"] for r in rows], eos),
                                         generator=torch.Generator().manual_seed(0))
    state = {"it": iter(loader)}

    def nxt():
        try:
            return next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            return next(state["it"])

    return nxt, (f"datasets {datasets.__version__}, torch {torch.__version__}; {len(ds)} rows grouped by "
                 f"group_texts from {cfg['hf_tokens'] / 1e6:.0f} M tokens ({cfg['hf_map_note']})")


SYSTEMS = {
    "loaderlib": sys_loaderlib, "numpy": sys_numpy, "numpy-fancy": sys_numpy_fancy, "nanogpt": sys_nanogpt,
    "litdata": sys_litdata, "megatron": sys_megatron, "megatron-blend": sys_megatron_blend,
    "loaderlib-mix": sys_loaderlib_mix, "grain-concat": sys_grain_concat, "grain-pack": sys_grain_pack,
    "hf": sys_hf, "loaderlib-kernel": sys_loaderlib_kernel,
    "loaderlib-pack-loader-shuffle": sys_loaderlib_pack_loader_shuffle,
}


# --------------------------------------------------------------------------- preparing peers' inputs


def prepare_litdata(prefix: str, out: str, max_tokens: int) -> int:
    """The first documents of the corpus (up to ``max_tokens``) optimized into LitData chunks of
    uint16 tokens, as LitGPT and TinyLlama prepare theirs. Returns the tokens written."""
    import torch
    from litdata import optimize
    from litdata.streaming.item_loader import TokensLoader

    lens, ptr = read_idx(prefix)
    k = int(np.searchsorted(np.cumsum(lens), max_tokens)) or 1
    spans = [(int(ptr[i]), int(lens[i])) for i in range(k)]
    groups = [spans[i:i + 256] for i in range(0, len(spans), 256)]
    optimize(fn=_litdata_docs, inputs=[(prefix + ".bin", g) for g in groups], output_dir=out,
             chunk_size=(2049 * 4096), item_loader=TokensLoader(), num_workers=1, mode="overwrite",
             start_method="fork")
    del torch
    return int(lens[:k].sum())


def _litdata_docs(arg):
    import torch

    path, spans = arg
    data = np.memmap(path, np.uint16, "r")
    for p, n in spans:
        yield torch.from_numpy(np.asarray(data[p:p + n], np.int32))


def prepare_hf(prefix: str, out: str, max_tokens: int, block: int) -> dict:
    """The first documents (up to ``max_tokens``) as a Hugging Face Dataset of ``input_ids``
    lists, grouped by run_clm's ``group_texts`` (``batched=True``, 1,000 documents a batch) into
    rows of ``block`` tokens, saved to ``out``. Returns the map's timing."""
    from itertools import chain

    import pyarrow as pa
    from datasets import Dataset

    lens, ptr = read_idx(prefix)
    k = int(np.searchsorted(np.cumsum(lens), max_tokens)) or 1
    data = np.memmap(prefix + ".bin", np.uint16, "r")
    n_tok = int(lens[:k].sum())
    values = np.asarray(data[int(ptr[0]):int(ptr[0]) + n_tok], np.int32)
    offsets = np.concatenate([[0], np.cumsum(lens[:k])]).astype(np.int32)
    table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))})
    ds = Dataset(table)

    def group_texts(examples):   # transformers/examples/pytorch/language-modeling/run_clm.py
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated[list(examples.keys())[0]])
        total_length = (total_length // block) * block
        return {k: [t[i:i + block] for i in range(0, total_length, block)] for k, t in concatenated.items()}

    t0, c0 = time.perf_counter(), time.process_time()
    grouped = ds.map(group_texts, batched=True, batch_size=1000, desc=None)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    grouped.save_to_disk(out)
    return {"tokens": n_tok, "map_wall": wall, "map_cpu": cpu}


# --------------------------------------------------------------------------- main


def serve(name: str, cfg: dict) -> None:
    t0 = time.perf_counter()
    nxt, notes = SYSTEMS[name](cfg)
    first = nxt()
    setup = time.perf_counter() - t0
    b = as_numpy(first)
    checked = "int64, no boundaries (as nanoGPT)"
    if name != "nanogpt":
        check_batch(b, cfg["eos"], cfg.get("check", "concat"))
        checked = "ok"
    per = sum(np.asarray(v).nbytes for k, v in b.items() if k != "max_seqlen")
    tok = int(np.asarray(b["input_ids"]).size)
    print(json.dumps({"ready": notes, "setup_s": setup, "bytes_per_batch": per, "tokens_per_batch": tok,
                      "check": checked}), flush=True)
    del first, b
    c_prev = time.process_time()
    for line in sys.stdin:
        msg = json.loads(line)
        if "quit" in msg:
            break
        n = int(msg["run"])
        t = time.perf_counter()
        got = 0
        for _ in range(n):
            bb = nxt()
            got += int(bb["input_ids"].shape[0] * bb["input_ids"].shape[1])
            del bb
        wall = time.perf_counter() - t
        c = time.process_time()
        print(json.dumps({"tokens": got, "wall": wall, "cpu": c - c_prev}), flush=True)
        c_prev = c


def main() -> None:
    cmd = sys.argv[1]
    if cmd == "serve":
        serve(sys.argv[2], json.loads(sys.argv[3]))
    elif cmd == "prepare-litdata":
        print(json.dumps({"tokens": prepare_litdata(sys.argv[2], sys.argv[3], int(sys.argv[4]))}))
    elif cmd == "prepare-hf":
        print(json.dumps(prepare_hf(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
    elif cmd == "versions":
        out = {}
        for m in ("torch", "litdata", "megatron.core", "grain", "datasets", "numpy"):
            try:
                mod = __import__(m, fromlist=["_"])
                out[m] = getattr(mod, "__version__", "?")
            except Exception as e:   # noqa: BLE001 - reported, not hidden
                out[m] = f"missing ({type(e).__name__}: {e})"
        print(json.dumps(out))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
