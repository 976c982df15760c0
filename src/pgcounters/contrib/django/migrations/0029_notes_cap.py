from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0028_column_drain_update")]
    operations = [ApplySchemaMigration("0027_notes_cap")]
