"""The admission proxy: one OpenAI endpoint in front of the workers, never sending a worker
more concurrent requests than its gate (which the validator makes equal to its `maxNumSeqs`)."""

from mtpstack.proxy.admission import ModelAdmission, Rejected, Upstream
from mtpstack.proxy.app import create_app
from mtpstack.proxy.health import HEALTH_INTERVAL_SECONDS
from mtpstack.proxy.state import STATE, ProxyState

__all__ = ["HEALTH_INTERVAL_SECONDS", "STATE", "ModelAdmission", "ProxyState", "Rejected", "Upstream", "create_app"]
