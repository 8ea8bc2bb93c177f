"""Batch analysis over a job's stored crawl, as plain code: batch analyzers run as map/reduce, replays of
a page analyzer, and the runs' records in Redis (the Celery chord around them is ``tasks.batch_analysis``).

- ``batch_analysis.steps``: plan a run, map a chunk, reduce the parts, replay pages.
- ``batch_analysis.runs``: the state of runs, for the CLI's progress line and the dashboard.
"""
