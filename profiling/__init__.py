"""Profiler, research memory, UCB1 selector and early-abort gate for autoresearch.

Everything here except `capture` and `runner` (train.py's run plumbing) is pure Python and never imports
torch.
"""
