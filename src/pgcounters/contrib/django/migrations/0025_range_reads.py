from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0024_static_drain")]
    operations = [ApplySchemaMigration("0023_range_reads")]
