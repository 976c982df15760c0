from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0020_sliding_windows")]
    operations = [ApplySchemaMigration("0019_paths")]
