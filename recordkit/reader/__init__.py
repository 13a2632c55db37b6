"""The fast read path: shard maps, the epoch plan, batch decoding and the thread pool.

Framework adapters (:mod:`recordkit.torch`, :mod:`recordkit.tf`) build on these;
nothing here imports a framework.
"""
