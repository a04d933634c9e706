"""What the tests and the benchmarks share: starting a group's ranks
(ranks.run_group), a free port (ports), byte sizes such as "64K" (sizes),
what a process holds read from /proc (proc_counts), and the process layouts
the suite runs in (layouts).

benchmarks/ and examples/ import from here (and the compiled test device,
tests.testdev), never from the rest of tests/; nothing under tests/ imports
benchmarks/. Each helper is defined once, here.
"""
