from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0017_counter_scale")]
    operations = [ApplySchemaMigration("0016_sql_interface")]
