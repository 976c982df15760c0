from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0009_drain_quarantine")]
    operations = [ApplySchemaMigration("0009_counter_columns")]
