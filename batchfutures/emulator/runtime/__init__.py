"""Where the emulator's attempts run: the scheduler and what it drives.

    scheduler.py   one thread: placement, launching, retries, timeouts, queue time limits
    placement.py   whether a unit can start now or ever, the queue's order (pure)
    outcomes.py    what an attempt's end means: status, reason, retry (pure)
    container.py   the container's world: command, environment, import path, scratch folder
    attempts.py    the launch protocol both launchers implement
    launcher.py    ProcessLauncher: one process per attempt (cgroup or RLIMIT_DATA)
    forkserver.py  attempts forked from a process with the worker preloaded
    threads.py     ThreadLauncher: the worker's code in threads (chosen explicitly, never default)
    cgroups.py, monitor.py, procfs.py, host.py   memory and CPU limits, this machine

It imports the emulator's job model (jobstate, dependson, retries, records) and the worker's
entry point; the API side (service, server, listing, logservice) imports it, never the reverse.
"""
