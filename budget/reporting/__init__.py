"""The read side: what the ledger says about spend (effective epsilon, views, export).

Nothing here writes a charge; every figure is computed from the ledger and the policy book.
"""
