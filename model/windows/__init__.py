"""Arrival windows: a serving stack only batches requests that arrive within a short window.

With ``--window SECONDS`` requests are batched only with requests of the same window
(``model.cost.metrics.window_index``), the shape set stays global (at most K across all
windows and buckets), a member's latency includes its wait to the end of its window,
and device mode reports how many devices each window keeps busy.

- ``split``: the windowed problem, each request's window and wait, and the problem cut
  into one sub-problem per window;
- ``merge``: per-window batchings back into one batching per bucket;
- ``bound``: a certified lower bound for the windowed problem (shapes global);
- ``runs``: device mode's exact batching of one window under fixed shapes;
- ``plan``: the windowed planner (shapes chosen once, windows planned independently);
- ``devices``: devices needed per window and bucket;
- ``present``: the tables, the devices-over-time picture and the report.
"""
