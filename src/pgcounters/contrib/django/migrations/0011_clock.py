from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0010_counter_columns")]
    operations = [ApplySchemaMigration("0010_clock")]
