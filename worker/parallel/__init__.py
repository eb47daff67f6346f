"""Tensor parallelism: the ranks' process group and collectives (group.py), and which
slice of each checkpoint tensor a rank holds (shard.py)."""
