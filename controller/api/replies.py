"""Encoding the phase coordinator's decisions (``Admit``, ``Reject``) as ``PhaseReply``
messages: the servicer side of the codec. Apart from ``lightrail.controller.api.codec`` so the
codec stays free of the controller's core (the job-side library imports the codec).
"""

from __future__ import annotations

from lightrail.controller.api.codec import ERROR_TO_PB
from lightrail.controller.core.decisions import Admit, Reject
from lightrail.v1 import agent_pb2


def fill_reply(reply: agent_pb2.PhaseReply, decision: Admit | Reject) -> None:
    """Write an admission or refusal into ``reply`` in place (the PhaseStream hot path)."""
    if isinstance(decision, Admit):
        a = reply.admitted
        a.job_id = decision.job_id
        a.rank = decision.rank
        a.request_id = decision.request_id
        a.noop = decision.noop
        a.steps = decision.steps
        a.device_s = decision.device_s
    else:
        e = reply.error
        e.job_id = decision.job_id
        e.rank = decision.rank
        e.request_id = decision.request_id
        e.code = ERROR_TO_PB[decision.code]
        e.message = decision.message
