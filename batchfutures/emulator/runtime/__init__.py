"""Where the emulator's attempts run: the scheduler and what it drives.

    scheduler.py   one thread moving units through the lifecycle; applies what the others decide
    runqueue.py    the RUNNABLE queue: submission order, units held (never fit), vCPUs in use
    placement.py   whether a unit can start now or ever, the queue's order (pure)
    deadlines.py   attempt timeouts, lost hosts, queue time limits, the thread's sleep (pure)
    outcomes.py    what an attempt's end means: status, reason, retry (pure)
    endings.py     retry or final status (pure); a job's end after its units'; `finished`
    stopping.py    CancelJob, TerminateJob, the emulator's close: what is killed, what fails
    container.py   the container's world: command, environment, import path, scratch folder,
                   log stream; an attempt's LaunchRequest
    attempts.py    the launch protocol both launchers implement
    launcher.py    ProcessLauncher: one process per attempt (cgroup or RLIMIT_DATA)
    forkserver.py  attempts forked from a process with the worker preloaded
    threads.py     ThreadLauncher: the worker's code in threads (chosen explicitly, never default)
    cgroups.py, monitor.py, procfs.py, host.py   memory and CPU limits, this machine

It imports the emulator's job model (jobstate, dependson, retries, records) and the worker's
entry point; the API side (service, server, listing, logservice) imports it, never the reverse.
"""
