"""Counters through paths and many-to-many relations: remarks per writer through the
stories (with conditions on both levels), labels per story and stories per label through
the automatic through table, label links per writer through the stories, in each mode."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from pgcounters.contrib.django import CountField, SumField


class Writer(models.Model):
    name = models.CharField(max_length=40, default="")
    # public remarks on the writer's published stories
    public_remarks = CountField("stories__remarks", filter=Q(public=True, story__published=True))
    remark_score = SumField("stories__remarks", "score", mode="unlogged")
    public_remarks_direct = CountField("stories__remarks", filter=Q(public=True), mode="direct")
    # a path that ends with a many-to-many relation: the (story, label) links of the
    # writer's stories, a filter on the link rows (their story's fields)
    published_label_links = CountField("stories__labels", filter=Q(story__published=True))
    label_links_direct = CountField("stories__labels", mode="direct")


class Label(models.Model):
    active = models.BooleanField(default=True)
    # published stories carrying the label
    published_stories = CountField("stories", filter=Q(published=True))
    stories_unlogged = CountField("stories", mode="unlogged")


class Story(models.Model):
    writer = models.ForeignKey(Writer, related_name="stories", on_delete=models.CASCADE, null=True)
    published = models.BooleanField(default=True)
    labels = models.ManyToManyField(Label, related_name="stories")
    label_count = CountField("labels")
    active_labels = CountField("labels", filter=Q(active=True), mode="direct")


class Remark(models.Model):
    story = models.ForeignKey(Story, related_name="remarks", on_delete=models.CASCADE)
    public = models.BooleanField(default=True)
    score = models.IntegerField(default=0)
