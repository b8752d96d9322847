"""Where the server extension reads the pool: ``base.PoolBackend`` (the seam and ``NoPool``), ``local`` (this
machine's ledger or the pool service), ``kubernetes`` (GPUKernel objects) and its ``adoption`` of a restarted
server's kernel pods.  Nothing here imports the rest of the extension."""
