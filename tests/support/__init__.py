"""What tests share: the wait helpers (:mod:`.waits`), real servers with fault injection
(:mod:`.servers`, :mod:`.faults`), namespace state checks (:mod:`.helpers`), worker harnesses and
handler-run logs (:mod:`.workers`), the console's browser kit (:mod:`.ui`), the dev stack's
(:mod:`.devstack`) and paths (:mod:`.paths`). Fixtures are in ``tests/conftest.py``."""
