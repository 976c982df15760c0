from django.db import migrations

from pgcounters.contrib.django.operations import ApplySchemaMigration


class Migration(migrations.Migration):
    initial = False
    dependencies = [("pgcounters", "0007_admin_models")]
    operations = [ApplySchemaMigration("0007_text_keys")]
