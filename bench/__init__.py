"""zsched benchmarks: ``python -m bench --help``. They start their own servers on loopback and
print JSON; nothing here runs in CI."""
