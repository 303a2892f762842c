"""``python -m pearl_sglang.router``: PEARL's router, with its control plane when given a
cluster. The program is composed in ``pearl_sglang.server.cli`` (see its docstring for the
modes and flags): a ``__main__`` is a program that nothing imports, so it may reach the
composition root above the router."""
from pearl_sglang.server.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
