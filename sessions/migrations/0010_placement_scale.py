"""Indexes for session_create at fleet scale (docs/performance.md, "Placement").

The session's own: its owner's live sessions (admission counts them on every decision). And, as SQL, indexes on
the clusters app's tables that only placement and admission read (``sessions.placement``, ``billing.admission``),
kept with the code whose plans they serve:

* ``node_cluster_binpack_order``, ``node_cluster_binpack_free_order``, ``node_cluster_spread_order``: the fit query
  restricted to one cluster (a pinned request, a policy or volume allowing one cluster, the re-check under the
  chosen cluster's lock) walks that cluster's nodes in policy order, instead of the fleet-wide order past every
  other cluster's nodes.
* ``gpudevice_cluster_model``: the GPU models (and their smallest memory) on the candidate clusters, which
  admission prices a request at, read by a skip scan (a few index probes per cluster) instead of every GPU row.
  None of ``used_*`` is in it, so the recount's updates of those stay HOT.
"""

from django.db import migrations, models

_CLUSTER_INDEXES = [
    ("node_cluster_binpack_order", "clusters_node (cluster_id, load DESC, name) WHERE ready"),
    ("node_cluster_binpack_free_order", "clusters_node (cluster_id, load DESC, name) WHERE ready AND free_devices > 0"),
    ("node_cluster_spread_order", "clusters_node (cluster_id, load, name) WHERE ready"),
    ("gpudevice_cluster_model", "clusters_gpudevice (cluster_id, model, memory_mib)"),
]


class Migration(migrations.Migration):

    dependencies = [
        ('clusters', '0013_cluster_routing'),
        ('gpu_sessions', '0009_session_reapply_due_at'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='session',
            index=models.Index(condition=models.Q(('phase__in', ['Terminated', 'Failed']), _negated=True), fields=['owner'],
                               name='session_live_owner_idx'),
        ),
        *[
            migrations.RunSQL(f"CREATE INDEX IF NOT EXISTS {name} ON {definition}", f"DROP INDEX IF EXISTS {name}")
            for name, definition in _CLUSTER_INDEXES
        ],
    ]
