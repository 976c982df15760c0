from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0025_range_reads")]
    operations = [ApplySchemaMigration("0024_direct_notes")]
