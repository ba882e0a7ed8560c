"""What the notebooks call: the profiles, the paired rule and its tables and plots, the rate rule, and each notebook's
cells (paper: 03-06; controls, regime, families, recipes, roles, budgets: the study layer, fedfrozen.studies.study);
verification across machines.

See docs/development.md for the layers and what each may import."""
