"""Row links reversed once per URL name (``console.links``) are the URLs ``reverse`` gives, under any script
prefix."""

from __future__ import annotations

from django.urls import reverse, set_script_prefix

from console.links import list_url, row_url, row_url_format


def test_row_links_equal_reverse_for_every_id_and_prefix():
    try:
        for prefix in ("/", "/console/"):
            set_script_prefix(prefix)
            for pk in (1, 42, 987654321, "17"):
                assert row_url("admin:clusters_node_change", pk) == reverse("admin:clusters_node_change", args=[pk])
                assert row_url_format("admin:gpu_sessions_session_stop").format(pk) == reverse("admin:gpu_sessions_session_stop", args=[pk])
            assert list_url("admin:clusters_gpudevice_changelist") == reverse("admin:clusters_gpudevice_changelist")
            assert list_url("admin:clusters_gpudevice_changelist").startswith(prefix)
    finally:
        set_script_prefix("/")
