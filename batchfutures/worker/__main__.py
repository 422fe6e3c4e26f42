"""``python -m batchfutures.worker <job_url>``: the container command of every Batch job.

In an ECS container the attempt runs in one forked child, so a kernel OOM kill of it is recorded
(oomguard.py)."""

from .main import exit_process, guarded_main

exit_process(guarded_main())
