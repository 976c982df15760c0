from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0014_exact_sums")]
    operations = [ApplySchemaMigration("0014_drain_many_keys")]
