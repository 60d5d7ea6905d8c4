"""Scatter workers: processes with model replicas that build cold segments' entries for rank 0.

``channel`` (pair process groups over a TCPStore rendezvous), ``protocol`` (int64 control
messages, raw tensors), ``worker`` (the worker process), ``stream`` (its build, sent layer group
by layer group), ``devices`` (which device each worker gets), ``handle`` (one worker process as
rank 0 holds it), ``receive`` (rank 0's side of one job), ``pool`` (rank 0's ``WorkerPool``:
start, route, supervise, stop).
"""
