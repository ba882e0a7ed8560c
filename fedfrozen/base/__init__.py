"""The ground every layer stands on: files written atomically and the machine's facts (io), progress bars, the seeded
generators (rng) and a run's History.

See docs/development.md for the layers and what each may import."""
