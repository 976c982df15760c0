from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [ApplySchemaMigration("0001_initial")]
