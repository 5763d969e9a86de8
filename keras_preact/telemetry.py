"""Usage telemetry of optional dependencies, declined: for test suites, benchmarks and CI machines that
must not report usage to third parties. The library itself never calls this; it is the caller's choice."""

import os


def decline_usage_telemetry():
    """Keep tests and benchmarks from reporting usage to third parties: Ray's usage statistics off in this
    process and its children (``RAY_USAGE_STATS_ENABLED=0`` unless set), and OpenVINO's telemetry
    declined through its own consent file (``~/intel/openvino_telemetry``, what its ``opt_in_out --opt_out``
    writes) where no choice is recorded yet: ``import openvino`` sends an event unless declined or CI=true."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker
    except ImportError:
        return
    checker = OptInChecker()
    if checker.consent_file_base_dir() is not None and not os.path.exists(checker.consent_file()):
        checker.update_result(ConsentCheckResult.DECLINED)
