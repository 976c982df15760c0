from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0027_trigger_checks")]
    operations = [ApplySchemaMigration("0026_column_drain_update")]
