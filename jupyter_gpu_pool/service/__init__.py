"""The pool service (``jupyter gpu-pool serve``): on a machine several users share, the one process that
keeps the ledger, reads the admin's settings and knows each caller from the socket; and its clients."""
