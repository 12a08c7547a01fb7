"""The read side: what the ledger says about spend. Nothing here writes a charge.

- :mod:`.loss`: privacy loss on the live ledger, per device and per population, and the
  effective-epsilon report (:mod:`.report` computes it from rows, :mod:`.report_text` prints it).
- :mod:`.central`: the shuffled batches as published and the central ``(epsilon, delta)`` they give
  (the composition itself is :mod:`dp_governor.budget.privacy.sub_batches`).
- :mod:`.views`: one device's timeline, a use case's distribution, what-if of a policy edit.
- :mod:`.series`: each use case's cumulative series (the top and p99 device's spend day by day),
  read from the charges its window holds; :mod:`.series_state` the state behind it, which
  :mod:`.series_forward` stores and brings forward by what changed (the dashboard job's).
- :mod:`.changes`: the charges after a stored figure's watermark, read in one snapshot.
- :mod:`.activity`: reports accepted and refused per day (public counts).
- :mod:`.transparency`: a device's record in the transparency log beside the gate's totals.
- :mod:`.export`: the ledger as JSON Lines or CSV, and its report recomputed from an export.
- :mod:`.summary`: sums over devices stored (the report's histograms), and brought up to date
  by what changed since.
- :mod:`.what_if_summary`: the what-if's device sums, stored and brought up to date the same way.
- :mod:`.partitioned`: the report's pass over ranges of device keys in worker processes, merged.
- :mod:`.sharded`, :mod:`.sharded_what_if`: the report and what-if over a ledger sharded by
  device key (one database a shard), merged exactly; central figures by the worst shard's.
- :mod:`.routing`: the routing rule, and the check that each device read lies in its shard.
"""
