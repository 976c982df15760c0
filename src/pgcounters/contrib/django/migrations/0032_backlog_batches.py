from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0031_folded_target_ids")]
    operations = [ApplySchemaMigration("0030_backlog_batches")]
