from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0022_generic_relations")]
    operations = [ApplySchemaMigration("0021_time_buckets")]
