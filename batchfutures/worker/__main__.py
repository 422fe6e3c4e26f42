"""``python -m batchfutures.worker <job_url>``: the container command of every Batch job."""

from .main import exit_process, main

exit_process(main())
