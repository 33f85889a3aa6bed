"""Accounting: which episodes count, the ledger of env steps, and the rules and windows for
the metrics that actors report."""
