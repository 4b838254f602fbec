"""The order of a map-style loader that orders its samples itself.

NOTE [ Map-style loaders shard under torch.distributed ]
A map-style loader built without ``sampler=``, ``batch_sampler=``, ``rank=`` and
``world_size=`` orders its samples itself. In a job of several processes it takes its rank
and world size as an iterable dataset's loader does (NOTE [ Rank at the first iter() ] in
loader.py): from an initialised ``torch.distributed``, else torchrun's ``RANK`` and
``WORLD_SIZE``, until its first run starts, so a loader built before the process group (as
trainers build them) still shards. With more than one process its order is a
:class:`~loaderlib.ShardedSampler`'s: the whole dataset's order, shuffled with one seed all
ranks share (``seed=`` when given, else 0, as torch's ``DistributedSampler``), rank ``r``
taking positions ``r, r + world_size, ...``, padded by wrapping to a multiple of the world
size. Before, every rank read the whole dataset, as torch's ``DataLoader`` does without a
``DistributedSampler``; that is rarely what a job of several processes means, and the
trainers that insert a ``DistributedSampler`` (Lightning, Accelerate) do it only into torch's
loader. ``rank=0, world_size=1`` (or a sampler of one's own) reads the whole dataset on every
rank. ``rank=`` and ``world_size=`` given shard by them, with no look at the environment.
"""

from __future__ import annotations

from ..sampler import BatchSampler, RandomSampler, SequentialSampler, ShardedSampler

__all__ = ["own_batches"]


def own_batches(n: int, batch_size: int, last_batch: str, shuffle: bool, seed: int, seed_given: bool,
                rank: int, world_size: int) -> BatchSampler:
    """The batches of a loader over ``n`` samples that orders them itself, on rank ``rank`` of
    ``world_size`` (NOTE [ Map-style loaders shard under torch.distributed ])."""
    if world_size > 1:
        sampler: RandomSampler | SequentialSampler | ShardedSampler = ShardedSampler(
            world_size, rank, n, shuffle=shuffle, seed=seed if seed_given else None)
    else:
        sampler = RandomSampler(n, seed=seed) if shuffle else SequentialSampler(n)
    return BatchSampler(sampler, batch_size, last_batch)
