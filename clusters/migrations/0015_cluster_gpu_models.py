from django.db import migrations, models

# The clusters' GPU models (clusters.models.ClusterGpuModel), kept by triggers on clusters_gpudevice.
#
# clusters_gpu_models_refresh(ids) recomputes the rows of the clusters ``ids`` from their GPU rows. It first takes a
# transaction-level advisory lock per cluster (in id order): two transactions changing one cluster's GPUs then
# recompute one after the other, and the second (a fresh snapshot per statement, READ COMMITTED) sees the first's
# committed rows, so the last summary written covers both. The application's writers of GPU rows (the inventory,
# deregistration) hold the cluster's row lock already, so the advisory lock never waits there.
#
# Statement-level triggers with transition tables: one recompute per statement and cluster, whatever the number of
# rows (an inventory snapshot upserts thousands, and may change the memory of every GPU: a row trigger would recompute
# the cluster once per row). An UPDATE recomputes only the clusters of rows whose cluster, model or memory changed (a
# transition table may not go with a column list, so the trigger compares the two): the placement's recounts of the
# used_* counters, on the hot path, join a few rows and recompute nothing.
FUNCTIONS = """
CREATE FUNCTION clusters_gpu_models_refresh(ids bigint[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    cid bigint;
BEGIN
    FOR cid IN SELECT DISTINCT x FROM unnest(ids) x WHERE x IS NOT NULL ORDER BY x LOOP
        PERFORM pg_advisory_xact_lock(1331, cid::integer);
    END LOOP;
    DELETE FROM clusters_clustergpumodel WHERE cluster_id = ANY(ids);
    INSERT INTO clusters_clustergpumodel (cluster_id, model, memory_mib)
    SELECT d.cluster_id, d.model, MIN(d.memory_mib) FROM clusters_gpudevice d WHERE d.cluster_id = ANY(ids)
     GROUP BY d.cluster_id, d.model;
END $$;

CREATE FUNCTION clusters_gpu_models_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM clusters_gpu_models_refresh(ARRAY(SELECT DISTINCT cluster_id FROM new_rows));
    RETURN NULL;
END $$;

CREATE FUNCTION clusters_gpu_models_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM clusters_gpu_models_refresh(ARRAY(SELECT DISTINCT cluster_id FROM old_rows));
    RETURN NULL;
END $$;

CREATE FUNCTION clusters_gpu_models_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM clusters_gpu_models_refresh(ARRAY(
        SELECT DISTINCT x FROM old_rows o JOIN new_rows n ON n.id = o.id, LATERAL unnest(ARRAY[o.cluster_id, n.cluster_id]) x
         WHERE (o.cluster_id, o.model, o.memory_mib) IS DISTINCT FROM (n.cluster_id, n.model, n.memory_mib)));
    RETURN NULL;
END $$;

CREATE TRIGGER gpudevice_models_insert AFTER INSERT ON clusters_gpudevice
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION clusters_gpu_models_inserted();
CREATE TRIGGER gpudevice_models_delete AFTER DELETE ON clusters_gpudevice
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION clusters_gpu_models_deleted();
CREATE TRIGGER gpudevice_models_update AFTER UPDATE ON clusters_gpudevice
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION clusters_gpu_models_updated();

INSERT INTO clusters_clustergpumodel (cluster_id, model, memory_mib)
SELECT d.cluster_id, d.model, MIN(d.memory_mib) FROM clusters_gpudevice d GROUP BY d.cluster_id, d.model;
"""

DROP_FUNCTIONS = """
DROP TRIGGER IF EXISTS gpudevice_models_insert ON clusters_gpudevice;
DROP TRIGGER IF EXISTS gpudevice_models_delete ON clusters_gpudevice;
DROP TRIGGER IF EXISTS gpudevice_models_update ON clusters_gpudevice;
DROP FUNCTION IF EXISTS clusters_gpu_models_inserted();
DROP FUNCTION IF EXISTS clusters_gpu_models_deleted();
DROP FUNCTION IF EXISTS clusters_gpu_models_updated();
DROP FUNCTION IF EXISTS clusters_gpu_models_refresh(bigint[]);
"""


class Migration(migrations.Migration):
    dependencies = [("clusters", "0014_inventory_digest")]

    operations = [
        migrations.CreateModel(
            name="ClusterGpuModel",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("model", models.CharField(max_length=128)),
                ("memory_mib", models.PositiveIntegerField()),
                ("cluster", models.ForeignKey(db_constraint=False, on_delete=models.deletion.DO_NOTHING, related_name="+",
                                              to="clusters.cluster")),
            ],
            options={"verbose_name": "cluster GPU model"},
        ),
        migrations.AddConstraint(
            model_name="clustergpumodel",
            constraint=models.UniqueConstraint(fields=("cluster", "model"), name="cluster_gpu_model_once"),
        ),
        migrations.RunSQL(FUNCTIONS, DROP_FUNCTIONS),
    ]
