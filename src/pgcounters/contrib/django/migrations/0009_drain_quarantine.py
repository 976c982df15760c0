from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0008_schema")]
    operations = [ApplySchemaMigration("0008_drain_quarantine")]
