from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0012_standby_reads")]
    operations = [ApplySchemaMigration("0012_session_independent_keys")]
