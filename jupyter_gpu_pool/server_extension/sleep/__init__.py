"""Kernels going to sleep and waking: the hibernation hook's seam and its local implementation (``hook``),
its cluster counterpart (``cluster``), the one timer a kernel for sleeping again unwarned (``timers``) and
the kernel websockets' transparent resume (``websocket``).  Knows nothing of HTTP handlers or the culler."""
