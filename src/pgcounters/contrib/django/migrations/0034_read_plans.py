from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0033_kept_periods")]
    operations = [ApplySchemaMigration("0032_read_plans")]
