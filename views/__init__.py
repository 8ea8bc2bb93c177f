"""Read models: what a job looks like from outside, read from the frontier into records for the
façade, the command line and the API.

- ``views.status``: a job's state and counters (``vcrawl status``, ``GET /api/jobs/{id}``).
- ``views.daily``: a job's statistics by UTC day (``vcrawl stats --by day``).
"""
