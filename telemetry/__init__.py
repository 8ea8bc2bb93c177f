"""Telling what happened: the cluster log stream, what each log line is about, and admin alerts.

- ``telemetry.log_context``: the job, task, URL and node a log line is about.
- ``telemetry.log_stream``: every worker's log lines in one Redis Stream (``vcrawl logs``).
- ``telemetry.alerts``: admin alerts, always to the log; by email and webhook when configured.

Low in the house: the pipeline, the cluster keepers and the task layer all use it; it uses only ``vcrawl``.
"""
