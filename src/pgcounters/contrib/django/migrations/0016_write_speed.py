from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0015_drain_many_keys")]
    operations = [ApplySchemaMigration("0015_write_speed")]
