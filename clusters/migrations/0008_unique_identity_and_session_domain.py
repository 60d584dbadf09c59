# One registration per physical cluster (kube-system uid) and per session hostname, among clusters that
# are not deregistered. Written by hand around the generated AddConstraint operations: a fleet that
# already holds duplicates (registered before this rule) cannot get the unique indexes, so the migration
# stops first and names them, instead of failing inside CREATE UNIQUE INDEX.

from django.db import migrations, models


def refuse_duplicates(apps, schema_editor):
    Cluster = apps.get_model("clusters", "Cluster")
    live = Cluster.objects.exclude(status="deregistered")
    problems = []
    for field, what, fix in (
        ("kube_system_uid", "reach the same cluster (kube-system uid {value})",
         "deregister the copies (`DELETE /api/v1/clusters/<id>`, after stopping their sessions), keeping the one its operator runs with"),
        ("session_domain", "share the session domain {value}",
         "give all but one another `session_domain` (`PATCH /api/v1/clusters/<id>`) or deregister them"),
    ):
        values = (
            live.exclude(**{field: ""}).order_by().values(field).annotate(n=models.Count("id")).filter(n__gt=1).values_list(field, flat=True)
        )
        for value in values:
            rows = live.filter(**{field: value}).order_by("registered_at", "id").values_list("name", "public_id")
            named = ", ".join(f"{name} ({public_id})" for name, public_id in rows)
            problems.append(f"clusters {named} {what.format(value=value)}: {fix}")
    if problems:
        raise RuntimeError(
            "clusters 0008 cannot add its unique indexes: " + "; ".join(problems)
            + ". Fix them with the release that is running now, then run the migrations again."
        )


class Migration(migrations.Migration):

    dependencies = [
        ('clusters', '0007_cluster_name_validator'),
    ]

    operations = [
        migrations.RunPython(refuse_duplicates, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='cluster',
            constraint=models.UniqueConstraint(condition=models.Q(models.Q(('status', 'deregistered'), _negated=True), models.Q(('kube_system_uid', ''), _negated=True)), fields=('kube_system_uid',), name='cluster_kube_system_uid_unique_while_registered'),
        ),
        migrations.AddConstraint(
            model_name='cluster',
            constraint=models.UniqueConstraint(condition=models.Q(models.Q(('status', 'deregistered'), _negated=True), models.Q(('session_domain', ''), _negated=True)), fields=('session_domain',), name='cluster_session_domain_unique_while_registered'),
        ),
    ]
