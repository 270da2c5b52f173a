"""The scheduling policy: drain order, budgets, pieces, limits and thread placement."""
