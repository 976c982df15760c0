from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0029_notes_cap")]
    operations = [ApplySchemaMigration("0028_sql_column_notes")]
