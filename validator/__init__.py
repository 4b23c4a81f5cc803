"""The fleet config model and the rules that guard it.

Every other component imports the config from here; nobody parses it a second way.
"""

from mtpstack.validator.config import (
    Backend,
    Bits,
    DrafterSpec,
    FleetConfig,
    PolicyConfig,
    ProxyConfig,
    QueueConfig,
    TargetSpec,
    TimeoutsConfig,
    WorkerProfile,
)
from mtpstack.validator.coupling import gate_for, gate_source
from mtpstack.validator.argv import worker_argv
from mtpstack.validator.findings import Finding, Report
from mtpstack.validator.load import ConfigError, load_config, load_valid_config, validate_data, validate_file

__all__ = [
    "Backend",
    "Bits",
    "ConfigError",
    "DrafterSpec",
    "Finding",
    "FleetConfig",
    "PolicyConfig",
    "ProxyConfig",
    "QueueConfig",
    "Report",
    "TargetSpec",
    "TimeoutsConfig",
    "WorkerProfile",
    "gate_for",
    "gate_source",
    "load_config",
    "load_valid_config",
    "validate_data",
    "validate_file",
    "worker_argv",
]
