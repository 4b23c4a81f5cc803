"""The fleet config model and the rules that guard it.

Every other component imports the config from here; nobody parses it a second way. Other
packages import only the names below, never the modules behind them (tests/test_layout.py).
"""

from mtpstack.validator.argv import draft_kind_from_argv, worker_argv
from mtpstack.validator.bounds import MAX_HEADER_BYTES, BodyError, parse_json_body
from mtpstack.validator.claim import Mismatch, WeightsClaim, compare_identity, identity_disagreements, parse_depth_map, weights_from_argv
from mtpstack.validator.config import (
    DEPTH_DEFAULT,
    DEPTH_CLASS_PATTERN,
    DEPTH_MAX,
    DEPTH_MIN,
    PREFIX_CACHE_GIB_DEFAULT,
    PREFIX_CACHE_GIB_MAX,
    Backend,
    Bits,
    DrafterSpec,
    FleetConfig,
    PrefixCacheSpec,
    PolicyConfig,
    ProxyConfig,
    QueueConfig,
    TargetSpec,
    TimeoutsConfig,
    format_gib,
    WorkerProfile,
)
from mtpstack.validator.coupling import gate_for, gate_source
from mtpstack.validator.deep import local_dir
from mtpstack.validator.families import BY_HEAD_TYPE, CACHE_KINDS, FAMILIES, Family, family_for_target, target_cache_kinds
from mtpstack.validator.findings import CODES, Finding, Report, display_name, format_path
from mtpstack.validator.load import ConfigError, load_config, load_valid_config, validate_data, validate_file
from mtpstack.validator.modeldir import (
    BUNDLED_MTP_PREFIX,
    DRAFTER_KINDS,
    bits_disagreement,
    bundled_prefix,
    config_value,
    detect_drafter_kind,
    head_mismatch,
    model_facts,
    read_config,
    same_directory,
)
from mtpstack.validator.placement import dial_host, is_loopback, is_placed, parts_on, rank_on, rank_peers
from mtpstack.validator.rules import did_you_mean

__all__ = [
    "BUNDLED_MTP_PREFIX",
    "BY_HEAD_TYPE",
    "CACHE_KINDS",
    "FAMILIES",
    "Family",
    "bits_disagreement",
    "bundled_prefix",
    "family_for_target",
    "target_cache_kinds",
    "Backend",
    "Bits",
    "BodyError",
    "ConfigError",
    "DEPTH_DEFAULT",
    "DEPTH_CLASS_PATTERN",
    "DEPTH_MAX",
    "DEPTH_MIN",
    "DRAFTER_KINDS",
    "MAX_HEADER_BYTES",
    "PREFIX_CACHE_GIB_DEFAULT",
    "PREFIX_CACHE_GIB_MAX",
    "DrafterSpec",
    "CODES",
    "Finding",
    "FleetConfig",
    "Mismatch",
    "PolicyConfig",
    "PrefixCacheSpec",
    "ProxyConfig",
    "QueueConfig",
    "Report",
    "TargetSpec",
    "TimeoutsConfig",
    "WeightsClaim",
    "WorkerProfile",
    "compare_identity",
    "config_value",
    "detect_drafter_kind",
    "dial_host",
    "did_you_mean",
    "display_name",
    "draft_kind_from_argv",
    "format_gib",
    "format_path",
    "gate_for",
    "gate_source",
    "head_mismatch",
    "identity_disagreements",
    "is_loopback",
    "is_placed",
    "load_config",
    "load_valid_config",
    "local_dir",
    "model_facts",
    "parse_depth_map",
    "parse_json_body",
    "parts_on",
    "rank_on",
    "rank_peers",
    "read_config",
    "same_directory",
    "validate_data",
    "validate_file",
    "weights_from_argv",
    "worker_argv",
]
