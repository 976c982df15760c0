from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0021_paths")]
    operations = [ApplySchemaMigration("0020_generic_relations")]
