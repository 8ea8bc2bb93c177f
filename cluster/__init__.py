"""Keeping the cluster whole, as plain code (no Celery): membership and the host ring, who holds which
broker message, shipping a job's outputs, the Sentinel fence, and the periodic keepers that run them.

- ``cluster.members``: ring nodes in Redis (registrations, beats, who went silent); ``cluster.ring``:
  the host ring (consistent hashing over weighted virtual nodes).
- ``cluster.membership``: the membership at work (a worker's ``RingKeeper`` beats and watches; a dead
  member's work is handed over).
- ``cluster.holdings``: who holds which broker message, and the sweep's rule (the kombu side is
  ``tasks.broker.holdings``).
- ``cluster.outputs``: a finished job's outputs reach storage within seconds.
- ``cluster.fence``: fencing the old primary in a Sentinel failover.
- ``cluster.periodic``: a daemon thread calling one function at a fixed period.
"""
