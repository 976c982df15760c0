from django.db import migrations, models


class Migration(migrations.Migration):
    """The admin's model of ``pgcounters.targets`` learns the column ``scale`` (schema
    version 13): the values page shows a sum of decimals as decimals. The model is
    unmanaged, so this changes Django's state only."""

    dependencies = [("pgcounters", "0016_write_speed")]
    operations = [
        migrations.AddField(
            model_name="counter",
            name="scale",
            field=models.IntegerField(null=True),
        ),
    ]
