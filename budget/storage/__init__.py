"""Where the ledger lives: engines, tables, day partitions, the schema and its upgrades."""
