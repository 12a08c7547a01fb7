"""The per-device privacy ledger, the atomic check-and-charge gate, and the accountant.

Not built yet: see the budget-core issue. The package exists so that the layout is stable.
"""
