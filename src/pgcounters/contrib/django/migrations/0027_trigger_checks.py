from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0026_direct_notes")]
    operations = [ApplySchemaMigration("0025_trigger_checks")]
