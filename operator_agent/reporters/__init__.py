"""What the operator reports to the control plane's ``/internal/v1/`` routes, one module per report.

Modules:
    inventory  the GPU inventory snapshot, ``PUT /internal/v1/inventory`` (the main thread's tick)
    status     session status from the session Pods, ``POST /internal/v1/status`` (the reconciler's reporter thread)
    storage    volume sync: capacity, volumes, node disks, ``POST /internal/v1/storage``
    usage      usage metering: per-GPU samples of Running sessions, queued on disk, ``POST /internal/v1/usage``
    activity   GPU activity from HAMi's vGPU monitor, ``POST /internal/v1/activity``
"""
