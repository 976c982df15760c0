from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0011_clock")]
    operations = [ApplySchemaMigration("0011_standby_reads")]
