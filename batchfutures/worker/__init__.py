"""The code that runs in the container: one Batch job (or child, or node) of calls.

    python -m batchfutures.worker <job_url>      (__main__.py: the job definition's command)
      main.py     reads the child's header, inputs and functions from storage, checks every
                  seal, runs the items, writes the child's one result object
      calls.py    running one child's calls, the same sequentially and on the pool: every seal
                  before any code (Prefetched), the initializer, each item's outcome and usage
      pool.py     a child of N vCPUs runs its items on N forked processes
      oomguard.py in an ECS container, the attempt in one forked child: a kernel OOM kill of it
                  is recorded as the out-of-memory marker (exit 137)
      nodes.py    ``batchfutures.node()``: where this node of a multi-node job stands
      storagelib.py  refuses an s3fs older than the exclusive result write needs

It imports the client core's shared parts (serialization, storage, signing, dependencies,
errors) and nothing of the executor, the poller, the CLI or the emulator. This file stays
empty of imports: ``import batchfutures`` reaches ``nodes`` through it.
"""
