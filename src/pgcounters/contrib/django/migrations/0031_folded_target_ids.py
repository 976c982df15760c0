from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0030_sql_column_notes")]
    operations = [ApplySchemaMigration("0029_folded_target_ids")]
