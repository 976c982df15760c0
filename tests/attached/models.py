"""Notes and votes attached to any model through generic relations (contenttypes), counted
per object by counter columns on the models that declare a GenericRelation, and by a named
counter keyed by (content type, object id)."""

from __future__ import annotations

from django.contrib.contenttypes.fields import GenericForeignKey, GenericRelation
from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.db.models import Q

from pgcounters.contrib.django import CountField, SumField, register_counter


class Note(models.Model):
    """Attached by a text object id (any model, whatever its primary key)."""

    content_type = models.ForeignKey(ContentType, on_delete=models.CASCADE)
    object_id = models.CharField(max_length=64)
    target = GenericForeignKey("content_type", "object_id")
    public = models.BooleanField(default=True)
    score = models.IntegerField(default=1)


class Vote(models.Model):
    """Attached by an integer object id (the usual PositiveIntegerField)."""

    kind = models.ForeignKey(ContentType, on_delete=models.CASCADE)
    object_pk = models.PositiveBigIntegerField()
    target = GenericForeignKey("kind", "object_pk")


class Post(models.Model):
    title = models.CharField(max_length=40, default="")
    notes = GenericRelation(Note)
    votes = GenericRelation(Vote, content_type_field="kind", object_id_field="object_pk")
    notes_count = CountField("notes")
    public_notes = CountField("notes", filter=Q(public=True))
    notes_unlogged = CountField("notes", mode="unlogged")
    notes_direct = CountField("notes", mode="direct")
    score_total = SumField("notes", "score")
    votes_count = CountField("votes")


class Photo(models.Model):
    caption = models.CharField(max_length=40, default="")
    notes = GenericRelation(Note)
    notes_count = CountField("notes", mode="direct")


# every note per attached object, whatever its model: keyed by (content type, object id)
notes_per_object = register_counter(
    "attached.notes_per_object", Note, keys=("content_type", "object_id")
)
