"""What the runner tells the controller process: the policy, the fabric it programs, the
policy's parameters and the emulation's context. A frozen dataclass, JSON on the wire (the
policy file; ``testbed.base.contract``: an unknown key is refused); built from the
configured policy in the runner (``testbed.run.controller_process``), read by the os-ken app
(``controllers.app``). What the app tells the runner back, one ``ControllerEvent`` per line
of its state file."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from testbed.base.contract import Contract
from testbed.base.topology import FabricPlan

from .params import resolve
from .policy import FabricContext, Policy, policy_class


@dataclass(frozen=True)
class ControllerConfig(Contract):
    policy: str
    plan: FabricPlan
    params: Dict[str, Any]  # as resolved in the runner (defaults, scaling, overrides)
    context: FabricContext

    @classmethod
    def of(cls, policy: Policy) -> "ControllerConfig":
        return cls(policy.name, policy.plan, policy.params_dict(), policy.context)

    def build(self) -> Policy:
        """The policy core the runner configured, again in this process."""
        params = resolve(self.policy, self.params, self.context.modelled_gbit, self.context.mtu)
        return policy_class(self.policy)(self.plan, params, self.context)


@dataclass(frozen=True)
class ControllerEvent(Contract):
    """One line of the controller's state file: a switch programmed (its barrier answered),
    failed to program, an OpenFlow error a switch sent, or a handler that raised."""
    event: str  # programmed, failed, error or handler_failed
    time: float
    dpid: Optional[int] = None
    switch: Optional[str] = None  # programmed: the switch's name
    error: Optional[str] = None  # failed, handler_failed: the exception
    handler: Optional[str] = None  # handler_failed
    type: Optional[int] = None  # error: OpenFlow error type and code
    code: Optional[int] = None
