from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0023_time_buckets")]
    operations = [ApplySchemaMigration("0022_static_drain")]
