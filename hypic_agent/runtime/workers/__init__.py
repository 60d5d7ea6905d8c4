"""Scatter workers: processes with model replicas that build cold segments' entries for rank 0.

``channel`` (pair process groups over a TCPStore rendezvous), ``protocol`` (int64 control
messages, raw tensors), ``worker`` (the worker process), ``devices`` (which device each worker
gets), ``pool`` (rank 0's ``WorkerPool``: start, route, supervise, stop).
"""
