"""The pool on one machine: the SQLite ledger (an adapter around the pure core in ``pool``), the
machine's processes (lease holders), and :class:`LocalPool`, which puts settings, inventory,
ledger and MPS daemon together for the provisioner, the server extension and the CLI."""

from .ledger import Ledger

__all__ = ["Ledger"]
