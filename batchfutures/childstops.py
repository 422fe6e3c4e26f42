"""Which Batch ids a round of cancel/abort requests is sent to, and what a refused stop means.

    Poller._send_requests: the queued requests, grouped by job
        stop_calls(job id, array?, indices to terminate / cancel, would the parent's stop hurt?)
            -> [(Stop, id, reason)]: one stop of the parent when no other child is still wanted,
               else one per child (none once a child stop of that job was refused)
    Poller._stop: batchapi.stop_jobs(...) -> {id: StopFailed}
        refused_alone(id, failure): a child the caller may not stop alone (logged once per
        parent, at INFO; not sent again)

Why a child stop may be refused. The stack's client policy (ManageJobs) allows CancelJob and
TerminateJob only on jobs tagged batchfutures:stack=<stack> (aws:ResourceTag, which the Service
Authorization Reference lists on Batch's `job` resource type). The Batch API Reference says of
TagResource and ListTagsForResource: "ARNs for child jobs of array and multi-node parallel (MNP)
jobs aren't supported", so a child (`<id>:<index>`) has no tags of its own, and a stop of one
child alone may be answered AccessDeniedException (the bulk calls: an `errors` entry with code
`AccessDenied`, botocore's CancelJobsErrorDetail). The parent carries the tag, so stopping the
whole job is allowed: that is what is sent whenever it stops nothing still wanted.

A refused child runs on. Its futures were already settled here (aborted or cancelled), and a
settled child's result is never applied (reconcile.arrived skips children no longer open,
jobs.settle leaves a done future as it is), so only its compute is lost.
"""

from __future__ import annotations

from typing import List, Mapping, Tuple

from .batchapi import Stop

# IAM's refusal: AccessDeniedException for one call (the common error of every AWS API);
# AccessDenied for one entry of CancelJobs/TerminateJobs (botocore's *JobsErrorDetail codes).
REFUSED_CODES = frozenset({"AccessDeniedException", "AccessDenied"})
# Batch documents its own ClientException for "an action or resource on behalf of a user that
# doesn't have permissions" too; such an answer is told apart from a bad id by its words.
_PERMISSION_WORDS = ("not authorized", "permission", "access denied")

StopCall = Tuple[Stop, str, str]  # (how, job id, reason)


def is_child(job_id: str) -> bool:
    """An array child's id, `<parent id>:<index>` (a multi-node node is `<id>#<n>`: batchfutures
    never stops one alone)."""
    return ":" in job_id


def parent_of(job_id: str) -> str:
    return job_id.split(":", 1)[0]


def stop_calls(job_id: str, *, array: bool, terminate: Mapping[int, str],
               cancel: Mapping[int, str], others_wanted: bool, others_waiting: bool,
               alone_refused: bool = False) -> List[StopCall]:
    """The stops to send for one job's requests of this round.

    ``terminate`` / ``cancel``: {child index: reason} (abort: TerminateJob; every future of the
    child cancelled: CancelJob). ``others_wanted``: a child in neither has a future not yet done
    (a TerminateJob of the whole job would kill it); ``others_waiting``: one of those has a
    future that has not started either (a CancelJob of the whole job would stop it; Batch's
    CancelJob leaves STARTING and RUNNING jobs alone). ``alone_refused``: a stop of a child of
    this job was refused before (`refused_alone`): the others would be too, so none is sent.

    One stop of the parent when it hurts nothing still wanted (a TerminateJob covers the
    cancelled children too); else one per child. The parent's reason is the first request's.
    """
    if not terminate and not cancel:
        return []
    if not array:  # the job is its one child: TerminateJob also cancels what has not started
        how, reasons = (Stop.TERMINATE, terminate) if terminate else (Stop.CANCEL, cancel)
        return [(how, job_id, next(iter(reasons.values())))]
    calls: List[StopCall] = []
    if terminate:
        if not others_wanted:
            return [(Stop.TERMINATE, job_id, next(iter(terminate.values())))]
        if not alone_refused:
            calls += [(Stop.TERMINATE, f"{job_id}:{i}", terminate[i]) for i in sorted(terminate)]
    if cancel:
        if not others_waiting:
            calls.append((Stop.CANCEL, job_id, next(iter(cancel.values()))))
        elif not alone_refused:
            calls += [(Stop.CANCEL, f"{job_id}:{i}", cancel[i]) for i in sorted(cancel)]
    return calls


def refused_alone(job_id: str, code: str, message: str = "") -> bool:
    """A failed stop of ``job_id`` (its error ``code`` and ``message``) is "this child cannot be
    stopped alone": an array child the caller is not authorized to stop (see the module doc).
    Not worth sending again; a parent's refusal, or any other failure, is not this."""
    if not is_child(job_id):
        return False
    if code in REFUSED_CODES:
        return True
    return code == "ClientException" and any(w in message.lower() for w in _PERMISSION_WORDS)
