from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0018_sql_interface")]
    operations = [ApplySchemaMigration("0017_change_notifications")]
