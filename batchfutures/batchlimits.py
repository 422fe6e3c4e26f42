"""AWS Batch's limits, and the exit status of an out-of-memory kill: one definition that the
client (submission, batchapi, poller, errors), the worker and the emulator (which enforces the
limits as Batch does) all read.

Sources: AWS Batch's service quotas page ("Maximum array size for array jobs: 10000",
"Maximum job payload size (for SubmitJob API operations): 30 KiB"), SubmitJob's reference ("The
array size can be between 2 and 10,000") and botocore's Batch model (DescribeJobs: "A list of
up to 100 job IDs"; CancelJobs and TerminateJobs: "An array of up to 50 Batch job IDs").
Plain constants and no imports: the worker and the emulator's fork server load it for nothing.
"""

__all__ = ["MIN_ARRAY_SIZE", "MAX_ARRAY_SIZE", "MAX_SUBMIT_PAYLOAD", "MAX_DESCRIBE_JOBS",
           "MAX_BULK_STOP", "SIGKILL_EXIT_STATUS", "OOM_EXIT_STATUS"]

MIN_ARRAY_SIZE = 2  # arrayProperties.size: an array job has 2 to 10,000 children
MAX_ARRAY_SIZE = 10_000
# bytes of a SubmitJob request, measured as botocore sends it (the JSON body)
MAX_SUBMIT_PAYLOAD = 30 * 1024
MAX_DESCRIBE_JOBS = 100  # job ids per DescribeJobs
MAX_BULK_STOP = 50  # job ids per CancelJobs / TerminateJobs
# 128 + SIGKILL: how Docker and ECS report a process SIGKILLed (a timeout's, a death signal's)
SIGKILL_EXIT_STATUS = 137
# ... the kernel's OOM kill is one (ECS reports it with or without an OutOfMemoryError reason),
# and the worker exits so on a MemoryError, after writing its out-of-memory marker
OOM_EXIT_STATUS = SIGKILL_EXIT_STATUS
