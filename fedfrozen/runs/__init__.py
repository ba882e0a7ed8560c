"""Many runs: the run-or-load cache and parallel runs (experiments), archives of cached runs (archive), Ray
clusters (cluster) and the dry run (dryrun).

See docs/development.md for the layers and what each may import."""
