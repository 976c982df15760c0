from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0016_write_speed")]
    operations = [ApplySchemaMigration("0017_change_notifications")]
