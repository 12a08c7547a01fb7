"""Use-case policies: mechanism and parameters, epsilon per report, caps, retention, thresholds.

Not built yet: see the budget-core issue. The package exists so that the layout is stable.
"""
