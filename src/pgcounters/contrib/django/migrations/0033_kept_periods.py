from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0032_backlog_batches")]
    operations = [ApplySchemaMigration("0031_kept_periods")]
